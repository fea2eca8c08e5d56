#!/usr/bin/env bash
# Puts promtool at .cache/promtool/promtool (relative to the repository root) if absent.
#
# The source is Debian's `prometheus` package, fetched with apt-get download (no
# installation: nothing runs, no server starts, no root needed when the package lists are
# there); only usr/bin/promtool is unpacked. About 20 MB, a few seconds. Idempotent: an
# existing working binary is kept. Exits 1 when promtool cannot be had (not Debian or
# Ubuntu, no mirror); the chart tests then check the alert rules without it.
set -euo pipefail

PACKAGE="prometheus"
TOOL="promtool"
VERSION_ARGS=(--version)
# shellcheck source=fetch-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fetch-common.sh"

command -v apt-get >/dev/null 2>&1 || fail "apt-get is needed (Debian or Ubuntu) to fetch promtool"
command -v dpkg-deb >/dev/null 2>&1 || fail "dpkg-deb is needed to unpack the $PACKAGE package"

download() {
    (cd "$work" && apt-get download -q "$PACKAGE") >"$work/apt.log" 2>&1
}

echo "fetch-promtool: downloading Debian's $PACKAGE package (for promtool only)" >&2
if ! download; then
    # Images often ship without package lists; reading them needs root.
    [[ "$(id -u)" == 0 ]] || { cat "$work/apt.log" >&2; fail "apt-get download $PACKAGE failed"; }
    apt-get update -qq >"$work/update.log" 2>&1 || { cat "$work/update.log" >&2; fail "apt-get update failed"; }
    download || { cat "$work/apt.log" >&2; fail "apt-get download $PACKAGE failed"; }
fi
deb="$(find "$work" -maxdepth 1 -name "${PACKAGE}_*.deb" | head -n 1)"
[[ -n "$deb" ]] || fail "apt-get download produced no .deb"

mkdir -p "$dest_dir"
tmp_bin="$dest_dir/promtool.partial.$$"
dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/bin/promtool >"$tmp_bin" \
    || { rm -f "$tmp_bin"; fail "$(basename "$deb") holds no usr/bin/promtool"; }
install_binary "$tmp_bin"
