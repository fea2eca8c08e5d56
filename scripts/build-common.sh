# Shared by the build-*.sh scripts (sourced, not run, after `set -euo pipefail`): reads
# the script's arguments (--force sets force=1, --help prints the script's leading
# comment) and defines root (the repository), script (the script's own path), say and die.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
script="$root/scripts/$(basename "${BASH_SOURCE[1]}")"
script_name=$(basename "$script" .sh)

say() { echo "$script_name: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

force=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h | --help) sed -n '2,/^[^#]/p' "$script" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$script_name: unknown argument: $arg" >&2; exit 2 ;;
  esac
done
