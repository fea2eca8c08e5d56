#!/usr/bin/env bash
# Builds the test cluster's binary (tools/kube: etcd, kube-apiserver and kubectl, and the
# node's kubelet, kube-scheduler, kube-controller-manager and kube-proxy, in one multicall
# binary) into .cache/kube/bin/, with each of those names a symlink to it; and beside it
# `pause`, the node's pod sandbox process (tools/kube/pause, a small static binary). A no-op
# when both are current: a stamp holds a hash of go.mod, go.sum, the .go files, this script
# and `go version`. `kube cri-reset` clears a container runtime's pods (the node's teardown).
#
# Usage: scripts/build-kube.sh [--force]
# Environment: KUBE_BIN_DIR (default .cache/kube/bin); GOMODCACHE, GOCACHE, GOFLAGS as usual.
# The first build downloads the Go modules (through GOPROXY) and compiles the apiserver: minutes
# on two cores. It prints what it builds, a line a minute while it runs, and how long it took;
# on failure it prints the whole build log and exits non-zero.
set -euo pipefail
# shellcheck source=build-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-common.sh"

src="$root/tools/kube"
bin_dir=${KUBE_BIN_DIR:-"$root/.cache/kube/bin"}
case "$bin_dir" in /*) ;; *) bin_dir="$root/$bin_dir" ;; esac
names=(
  etcd kube-apiserver kubectl kubelet kube-scheduler kube-controller-manager kube-proxy cri-reset
)
command -v go >/dev/null || die "go is not on PATH (tools/kube needs Go >= 1.26)"
export GOWORK=off CGO_ENABLED=0

# The releases built, read from go.mod, so that the binary reports them (kubectl version,
# the apiserver's /version) instead of v0.0.0-master.
kube_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v[0-9]/ {print $2; exit}' "$src/go.mod")
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$src/go.mod")
[[ $kube_version =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "no k8s.io/kubernetes release in $src/go.mod"
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
go_version=$(cd "$src" && go version)

mkdir -p "$bin_dir"
stamp="$bin_dir/.stamp"
binary="$bin_dir/kube"

# One build at a time (parallel test runs share .cache/kube/bin).
exec 9>"$bin_dir/.lock"
if ! flock -n 9; then
  say "another build is running; waiting for it"
  flock 9
fi

hash=$(
  cd "$src"
  {
    echo "$go_version"
    sha256sum go.mod go.sum ./*.go pause/*.go
    sha256sum <"$script" # the content, not the path: every checkout finds the same binary current
  } | sha256sum | cut -d' ' -f1
)

current=1
[[ $force == 0 && -x $binary && -x $bin_dir/pause && -f $stamp && $(cat "$stamp") == "$hash" ]] \
  || current=0
for name in "${names[@]}"; do
  [[ $(readlink "$bin_dir/$name" 2>/dev/null) == kube ]] || current=0
done
if [[ $current == 1 ]]; then
  say "up to date: $binary (kubernetes $kube_version, etcd $etcd_version)"
  exit 0
fi

say "building $binary: kubernetes $kube_version (${names[*]:1}), etcd $etcd_version, $go_version"
say "GOMODCACHE=$(go env GOMODCACHE) GOCACHE=$(go env GOCACHE) GOPROXY=$(go env GOPROXY)"
ldflags=(
  -s -w
  "-X=k8s.io/component-base/version.gitVersion=$kube_version"
  "-X=k8s.io/component-base/version.gitMajor=$major"
  "-X=k8s.io/component-base/version.gitMinor=$minor"
  "-X=k8s.io/component-base/version.gitTreeState=clean"
  "-X=k8s.io/component-base/version.gitCommit="
)
log=$(mktemp "${TMPDIR:-/tmp}/build-kube.XXXXXX.log")
started=$SECONDS

# A line a minute, so that a long first build does not look hung in CI's log.
# It must not hold the lock (fd 9), and it takes its sleep along when it is stopped.
(
  exec 9>&-
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while true; do
    sleep 60 &
    nap=$!
    wait "$nap"
    say "still building ($((SECONDS - started)) s)"
  done
) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true' EXIT

download_started=$SECONDS
if ! (cd "$src" && go mod download) >"$log" 2>&1; then
  say "module download failed after $((SECONDS - download_started)) s; its log ($log):"
  cat "$log" >&2
  die "go mod download failed"
fi
say "modules ready in $((SECONDS - download_started)) s"

compile_started=$SECONDS
if ! (cd "$src" && go build -trimpath -ldflags="${ldflags[*]}" -o "$binary.new" .) >>"$log" 2>&1
then
  say "build failed after $((SECONDS - compile_started)) s; the build log ($log):"
  cat "$log" >&2
  rm -f "$binary.new"
  die "go build failed"
fi
if ! (cd "$src" && go build -trimpath -ldflags="-s -w" -o "$bin_dir/pause.new" ./pause) >>"$log" 2>&1
then
  cat "$log" >&2
  rm -f "$binary.new" "$bin_dir/pause.new"
  die "go build of pause failed"
fi
mv -f "$bin_dir/pause.new" "$bin_dir/pause"
mv -f "$binary.new" "$binary"
for name in "${names[@]}"; do
  ln -sfn kube "$bin_dir/$name"
done
echo "$hash" >"$stamp"
rm -f "$log"

size=$(du -h "$binary" | cut -f1)
say "built $binary ($size) in $((SECONDS - started)) s (compile and link $((SECONDS - compile_started)) s)"
say "$("$binary" version) as: ${names[*]} (symlinks in $bin_dir)"
