# Shared by the fetch-*.sh scripts (sourced, not run): TOOL names the tool, and
# VERSION_ARGS the arguments that make it print its version (a working binary).
# Defines root (the repository), dest_dir and dest (.cache/TOOL/TOOL), fail, a scratch
# folder `work` removed on exit, and install_binary, which checks and moves a binary in.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="$root/.cache/$TOOL"
dest="$dest_dir/$TOOL"

fail() {
    echo "fetch-$TOOL: $*" >&2
    exit 1
}

# Idempotent: an existing working binary is kept.
if [[ -x "$dest" ]] && "$dest" "${VERSION_ARGS[@]}" >/dev/null 2>&1; then
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# install_binary FILE: make FILE executable, check that it runs here, move it to $dest.
install_binary() {
    chmod 0755 "$1"
    if ! "$1" "${VERSION_ARGS[@]}" >/dev/null 2>&1; then
        rm -f "$1"
        fail "the extracted $TOOL binary does not run on this machine"
    fi
    mv -f "$1" "$dest"
    echo "fetch-$TOOL: installed $("$dest" "${VERSION_ARGS[@]}" 2>&1 | head -n 1) at $dest" >&2
}
