#!/usr/bin/env bash
# Puts HAProxy at .cache/haproxy/haproxy (relative to the repository root) if absent, for
# the API tier soak (`poolkeeper chaos --api-tier`, tests/chaos).
#
# The source is Debian's `haproxy` package, fetched with apt-get download and unpacked, not
# installed: nothing runs, no service starts. Of its dependencies, the libraries this
# machine lacks (on Debian 12: liblua5.3-0, libopentracing-c-wrapper0, libopentracing1,
# and libssl3 on an image without it) are fetched the same way and unpacked beside it;
# .cache/haproxy/haproxy is then a wrapper that runs .cache/haproxy/bin/haproxy with them
# (LD_LIBRARY_PATH). About 3 MB, a few seconds. When the unpacked binary still does not run
# and this is root, `apt-get install -y haproxy` installs Debian's package instead and the
# wrapper runs /usr/sbin/haproxy. Idempotent: an existing working wrapper is kept. Exits 1
# when HAProxy cannot be had (not Debian or Ubuntu, no mirror); the soak's test is then
# skipped, or failed where POOLKEEPER_REQUIRE_HAPROXY is set (CI).
set -euo pipefail

PACKAGE="haproxy"
TOOL="haproxy"
VERSION_ARGS=(-v)
# shellcheck source=fetch-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fetch-common.sh"

command -v apt-get >/dev/null 2>&1 || fail "apt-get is needed (Debian or Ubuntu) to fetch haproxy"
command -v dpkg-deb >/dev/null 2>&1 || fail "dpkg-deb is needed to unpack the $PACKAGE package"

# download PACKAGE...: their .deb files into $work.
download() {
    (cd "$work" && apt-get download -q "$@") >"$work/apt.log" 2>&1
}

fetch() {
    if ! download "$@"; then
        # Images often ship without package lists; reading them needs root.
        [[ "$(id -u)" == 0 ]] || { cat "$work/apt.log" >&2; fail "apt-get download $* failed"; }
        apt-get update -qq >"$work/update.log" 2>&1 || { cat "$work/update.log" >&2; fail "apt-get update failed"; }
        download "$@" || { cat "$work/apt.log" >&2; fail "apt-get download $* failed"; }
    fi
}

# missing_libraries DEB: the library packages (lib*) DEB depends on that are not installed
# here, the first alternative of each; whether their versions do is left to the check that
# the binary runs. Other dependencies (adduser, lsb-base) only serve the package's service.
missing_libraries() {
    local dependency status
    for dependency in $(dpkg-deb -f "$1" Depends | tr ',' '\n' \
        | sed -e 's/|.*//' -e 's/(.*)//' -e 's/:any//' -e 's/ //g'); do
        [[ "$dependency" == lib* ]] || continue
        status="$(dpkg-query -W -f='${Status}' "$dependency" 2>/dev/null || true)"
        [[ "$status" == "install ok installed" ]] || echo "$dependency"
    done
}

# write_wrapper BINARY [LIBDIR]: $dest runs BINARY, with LIBDIR's libraries if given.
write_wrapper() {
    local wrapper="$dest_dir/haproxy.partial.$$"
    {
        echo '#!/bin/sh'
        echo '# Written by scripts/fetch-haproxy.sh.'
        if [[ $# -gt 1 ]]; then
            echo "LD_LIBRARY_PATH=\"$2\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\" exec \"$1\" \"\$@\""
        else
            echo "exec \"$1\" \"\$@\""
        fi
    } >"$wrapper"
    install_binary "$wrapper"
}

# words LINES: the lines on one line.
words() {
    tr '\n' ' ' <<<"$1" | sed 's/ *$//'
}

# unresolved BINARY LIBDIR: the shared libraries BINARY needs that are not found.
unresolved() {
    LD_LIBRARY_PATH="$2" ldd "$1" 2>&1 | awk '/not found/ {print $1}' || true
}

install_package() {
    [[ "$(id -u)" == 0 ]] || fail "the unpacked haproxy does not run here, and only root may apt-get install it"
    echo "fetch-haproxy: installing Debian's $PACKAGE package with apt-get instead" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$PACKAGE" >"$work/install.log" 2>&1 \
        || { cat "$work/install.log" >&2; fail "apt-get install $PACKAGE failed"; }
    write_wrapper /usr/sbin/haproxy
}

echo "fetch-haproxy: downloading Debian's $PACKAGE package" >&2
fetch "$PACKAGE"
deb="$(find "$work" -maxdepth 1 -name "${PACKAGE}_*.deb" | head -n 1)"
[[ -n "$deb" ]] || fail "apt-get download produced no .deb"

mkdir -p "$dest_dir/bin" "$dest_dir/lib"
dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/sbin/haproxy >"$dest_dir/bin/haproxy" \
    || fail "$(basename "$deb") holds no usr/sbin/haproxy"
chmod 0755 "$dest_dir/bin/haproxy"

# The libraries: the package's dependencies missing here, then theirs, until none is
# missing (libopentracing-c-wrapper0 needs libopentracing1).
pending="$(missing_libraries "$deb" | sort -u)"
fetched=""
while [[ -n "$pending" ]]; do
    echo "fetch-haproxy: fetching the libraries it needs: $(words "$pending")" >&2
    # shellcheck disable=SC2086 # one package name per word
    fetch $pending
    fetched="$(printf '%s\n%s\n' "$fetched" "$pending" | sort -u)"
    next=""
    for package in $pending; do
        library_deb="$(find "$work" -maxdepth 1 -name "${package}_*.deb" | head -n 1)"
        [[ -n "$library_deb" ]] || fail "apt-get download $package produced no .deb"
        unpacked="$work/unpacked-$package"
        dpkg-deb -x "$library_deb" "$unpacked"
        find "$unpacked" \( -type f -o -type l \) -name '*.so*' -path '*/lib/*' \
            -exec cp -P {} "$dest_dir/lib/" \;
        next="$next $(missing_libraries "$library_deb")"
    done
    pending=""
    for package in $next; do
        grep -qx "$package" <<<"$fetched" || pending="$pending $package"
    done
    pending="$(tr ' ' '\n' <<<"$pending" | sort -u | sed '/^$/d')"
done

missing="$(unresolved "$dest_dir/bin/haproxy" "$dest_dir/lib")"
if [[ -n "$missing" ]]; then
    echo "fetch-haproxy: the unpacked binary lacks $(words "$missing")" >&2
    install_package
elif ! LD_LIBRARY_PATH="$dest_dir/lib" "$dest_dir/bin/haproxy" -v >/dev/null 2>&1; then
    echo "fetch-haproxy: the unpacked binary does not run here" >&2
    install_package
else
    write_wrapper "$dest_dir/bin/haproxy" "$dest_dir/lib"
fi
