#!/usr/bin/env bash
# Builds the poolkeeper image from the Dockerfile with podman (`make image`) and prints its
# reference, e.g. localhost/poolkeeper:0.1.0-1a2b3c4d5e6f, as the last line of its output.
#
# The tag is the project's version and a hash of what the image is made of (the Dockerfile,
# pyproject.toml, constraints.txt, README.md, controller/ and the base image's id), so a
# build is a no-op while none of it changed. The image is tagged <repository>:<version> too.
#
# The base: $POOLKEEPER_IMAGE_BASE if set; else the Dockerfile's own (the public Python
# image) if it is here; else the one this script made earlier; else the public one if it
# can be pulled; else a Debian bookworm base with Python 3.11 that this script makes with
# debootstrap from the machine's apt mirror (2 to 5 minutes, once: it is kept as
# localhost/poolkeeper-base:bookworm-<hash of its recipe>).
#
# Usage: scripts/build-image.sh [--force]
# Environment: POOLKEEPER_IMAGE (repository, default localhost/poolkeeper),
#   POOLKEEPER_IMAGE_BASE, POOLKEEPER_DEBIAN_MIRROR (default: apt's bookworm mirror).
# Needs root and podman (scripts/fetch-node.sh installs it). The image store is the project's
# own, shared by the checkouts of this machine: podman --root /var/lib/poolkeeper/containers
# (overlay storage, cgroupfs, runc; controller/lab/image.py runs podman the same way).
# Builds do not raise rlimits (this machine refuses it). Exits 1 with the build's log when
# it fails.
set -euo pipefail
# shellcheck source=build-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-common.sh"

repository=${POOLKEEPER_IMAGE:-localhost/poolkeeper}

[[ $(id -u) == 0 ]] || die "podman builds here as root; run it as root"
command -v podman >/dev/null || die "podman is not installed (scripts/fetch-node.sh installs it)"

podman=(
  podman --root /var/lib/poolkeeper/containers --runroot /run/poolkeeper/containers
  --storage-driver overlay --cgroup-manager cgroupfs --runtime runc
)
podman_() { "${podman[@]}" "$@"; }
# Containers here may lower their rlimits, not raise them.
ulimits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

# One build at a time on this machine (checkouts share the image store).
exec 9>"${TMPDIR:-/tmp}/poolkeeper-build-image.lock"
if ! flock -n 9; then
  say "another build is running; waiting for it"
  flock 9
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/build-image.XXXXXX")
cleanup() {
  # debootstrap mounts /proc and /sys in its target: unmount whatever is left there.
  if [[ -d $work/rootfs ]]; then
    awk -v dir="$work/rootfs" 'index($2, dir) == 1 {print $2}' /proc/mounts | sort -r \
      | while read -r mount; do umount -l "$mount" || true; done
  fi
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

started=$SECONDS

# --- the base --------------------------------------------------------------------------
public_base=$(awk -F= '/^ARG BASE=/ {print $2; exit}' "$root/Dockerfile")
[[ -n $public_base ]] || die "the Dockerfile has no ARG BASE=<image>"

# What the made base is: change it and the base is made again.
suite=bookworm
packages=python3,python3-venv,ca-certificates
recipe="debootstrap --variant=minbase --include=$packages $suite; python 3.11; trimmed v1"
made_base="localhost/poolkeeper-base:$suite-$(sha256sum <<<"$recipe" | cut -c1-12)"

debian_mirror() {
  if [[ -n ${POOLKEEPER_DEBIAN_MIRROR:-} ]]; then
    echo "$POOLKEEPER_DEBIAN_MIRROR"
    return
  fi
  local mirror
  mirror=$(apt-cache policy 2>/dev/null | awk -v s="$suite/main" '$3 == s {print $2; exit}')
  if [[ -z $mirror ]] && command -v apt-get >/dev/null; then
    apt-get update -qq >/dev/null 2>&1 || true
    mirror=$(apt-cache policy 2>/dev/null | awk -v s="$suite/main" '$3 == s {print $2; exit}')
  fi
  [[ -n $mirror ]] || die "no Debian $suite mirror in apt's sources: set POOLKEEPER_DEBIAN_MIRROR"
  echo "$mirror"
}

make_base() {
  command -v debootstrap >/dev/null || die "debootstrap is not installed (scripts/fetch-node.sh)"
  local mirror rootfs="$work/rootfs" base_started=$SECONDS python
  mirror=$(debian_mirror)
  say "making $made_base with debootstrap ($suite, $packages) from $mirror"
  if ! debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1; then
    cat "$work/debootstrap.log" >&2
    die "debootstrap failed"
  fi
  python=$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ $python == 3.11 ]] || die "the $suite base has Python $python, not 3.11"
  # What an image needs no copy of: package lists and caches, docs, logs, device nodes
  # (the runtime makes /dev).
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/var/cache/debconf/*-old \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/var/log/* "$rootfs"/dev/*
  tar -C "$rootfs" --numeric-owner -cf "$work/rootfs.tar" .
  podman_ import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$work/rootfs.tar" \
    "$made_base" >/dev/null
  say "made $made_base (Python $python) in $((SECONDS - base_started)) s"
}

if [[ -n ${POOLKEEPER_IMAGE_BASE:-} ]]; then
  base=$POOLKEEPER_IMAGE_BASE
elif podman_ image exists "$public_base"; then
  base=$public_base
elif podman_ image exists "$made_base"; then
  base=$made_base
elif timeout 120 "${podman[@]}" pull -q "$public_base" >"$work/pull.log" 2>&1; then
  base=$public_base
else
  say "cannot pull $public_base ($(tail -n 1 "$work/pull.log")); making a base here"
  base=$made_base
  make_base
fi
base_id=$(podman_ image inspect --format '{{.Id}}' "$base")

# --- the image ---------------------------------------------------------------------------
version=$(awk -F'"' '/^version = / {print $2; exit}' "$root/pyproject.toml")
sources=$(
  cd "$root"
  {
    echo "$base_id"
    git ls-files -z -co --exclude-standard -- Dockerfile .dockerignore pyproject.toml \
      constraints.txt README.md controller | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-12
)
image="$repository:$version-$sources"

if [[ $force == 0 ]] && podman_ image exists "$image"; then
  say "up to date: $image"
  echo "$image"
  exit 0
fi

# pip in the build stage trusts what this machine trusts ($PIP_CERT, else the system's CA
# bundle), which may hold a CA of its own (a TLS-inspecting proxy to PyPI, say); the bundle
# is mounted for the RUN steps only: no layer keeps it.
pip_trust=()
pip_cert=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [[ -f $pip_cert ]]; then
  pip_trust=(--volume "$pip_cert:/run/pip-ca.crt:ro" --build-arg PIP_CERT=/run/pip-ca.crt)
fi

say "building $image from $base"
build_started=$SECONDS
if ! podman_ build --network host "${ulimits[@]}" "${pip_trust[@]}" --build-arg "BASE=$base" \
  -t "$image" -t "$repository:$version" -f "$root/Dockerfile" "$root" >"$work/build.log" 2>&1
then
  cat "$work/build.log" >&2
  die "podman build failed after $((SECONDS - build_started)) s"
fi
# Builds of other sources pile up in the store: those a day old go, and the untagged
# stages of earlier builds (the current build's stages stay cached until then).
for old in $(podman_ images --filter "reference=$repository" --filter until=24h \
  --format '{{.Repository}}:{{.Tag}}'); do
  [[ $old == "$image" || $old == "$repository:$version" ]] || podman_ rmi "$old" >/dev/null || true
done
podman_ image prune --force --filter until=24h >/dev/null || true
size=$(podman_ image inspect --format '{{.Size}}' "$image")
say "built $image ($((size / 1000000)) MB) in $((SECONDS - build_started)) s" \
  "($((SECONDS - started)) s with its base)"
echo "$image"
