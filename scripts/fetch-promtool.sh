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

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="$root/.cache/promtool"
dest="$dest_dir/promtool"

fail() {
    echo "fetch-promtool: $*" >&2
    exit 1
}

if [[ -x "$dest" ]] && "$dest" --version >/dev/null 2>&1; then
    exit 0
fi

command -v apt-get >/dev/null 2>&1 || fail "apt-get is needed (Debian or Ubuntu) to fetch promtool"
command -v dpkg-deb >/dev/null 2>&1 || fail "dpkg-deb is needed to unpack the $PACKAGE package"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

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
chmod 0755 "$tmp_bin"
if ! "$tmp_bin" --version >/dev/null 2>&1; then
    rm -f "$tmp_bin"
    fail "the extracted promtool does not run on this machine"
fi
mv -f "$tmp_bin" "$dest"
echo "fetch-promtool: installed $("$dest" --version 2>&1 | head -n 1) at $dest" >&2
