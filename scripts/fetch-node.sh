#!/usr/bin/env bash
# Installs what the test node and the image build need from Debian's packages, where any of
# it is missing: podman (builds and runs the image), containerd and runc (the node's container
# runtime), containernetworking-plugins (the pods' network: bridge, host-local, loopback),
# iptables and conntrack (kube-proxy), debootstrap (the image's base where the public one
# cannot be pulled). The Kubernetes components come from scripts/build-kube.sh.
#
# Idempotent: a no-op when all of it is here (a second or so). Needs root and apt-get to
# install (about 30 s on Debian 12). Installing starts no service: the test node runs its
# own containerd (controller/lab/node.py). Exits 1 when something is missing and cannot be
# installed; the node's tests are then skipped, or failed where POOLKEEPER_REQUIRE_NODE is
# set (CI).
set -euo pipefail

say() { echo "fetch-node: $*" >&2; }

# package: a file it installs that the node needs.
declare -A needs=(
  [podman]=/usr/bin/podman
  [containerd]=/usr/bin/containerd
  [runc]=/usr/sbin/runc
  [containernetworking-plugins]=/usr/lib/cni/bridge
  [iptables]=/usr/sbin/iptables
  [conntrack]=/usr/sbin/conntrack
  [debootstrap]=/usr/sbin/debootstrap
)
missing=()
for package in "${!needs[@]}"; do
  [[ -x ${needs[$package]} ]] || missing+=("$package")
done
[[ ${#missing[@]} == 0 ]] && exit 0

command -v apt-get >/dev/null || { say "missing ${missing[*]}, and no apt-get to install them"; exit 1; }
[[ $(id -u) == 0 ]] || { say "missing ${missing[*]}; only root may install them"; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
say "installing Debian's ${missing[*]}"
install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
    >"$log" 2>&1
}
if ! install; then
  # Images often ship without package lists.
  apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; say "apt-get update failed"; exit 1; }
  install || { cat "$log" >&2; say "apt-get install ${missing[*]} failed"; exit 1; }
fi
say "installed ${missing[*]}"
