"""The command lines poolkeeper runs in a runner task, and the parsing of what they print.

Everything runs as `/bin/sh -c SCRIPT poolkeeper ARG...`: the scripts are fixed text and
every value (paths, the time limit, env values, the command) is a positional argument,
so nothing a client sends is ever read by a shell as code. Every script first enters the
pool's working directory (`spec.executions.workingDir`) when one is set; otherwise the
task's own (the image's WORKDIR) is where Nomad's exec starts.

An execution runs under the runner task's own `timeout` (coreutils): without
`--foreground`, `timeout` puts itself and the command in a process group of its own (or
keeps the one it leads, as an exec's process with a terminal does), and at the limit
sends SIGKILL to that whole group, itself included. So the limit holds inside the task
whether or not closing Nomad's exec ends anything (Nomad's agent does not kill an exec's
process when its socket closes). Before `timeout` starts, the launcher prints its PID
between two RS characters (`\\x1e1234\\x1e`); `exec` keeps that PID for `timeout`, which is
the group's leader, so a cancel sends SIGKILL to the group `-1234` from a second exec.

Tools a runner image needs: `sh`, `timeout`, `kill` (the shell's), `env` (executions
with env); `rm`, `mkdir`, `tar` (uploads); GNU `find` with `-printf` (listings);
`stat`, `cat` (downloads). docs/reference.md lists them.
"""

from __future__ import annotations

import codecs
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

from controller.core.times import format_time

LAUNCHER_NAME = "poolkeeper"  # $0 of every script
PID_MARK = b"\x1e"
# A PID is at most 7 digits on Linux (pid_max 4194304); anything longer is no marker.
_MARKER_LIMIT = 16

# Exit codes the file scripts use to say what went wrong before any output.
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"  # of an execution's env variables
EXIT_MISSING = 3
EXIT_NOT_REGULAR = 4
EXIT_NO_WORKING_DIR = 125

_ENTER = '[ -z "$1" ] || cd -- "$1" || exit 125; shift; '

# $1 the directory (or ""), $2 the time limit in seconds, then the command's argv.
_LAUNCH = 'printf "\\036%s\\036" "$$"; [ -z "$1" ] || cd -- "$1" || exit; shift; '
_LAUNCH += 'exec timeout -s KILL "$@"'
_KILL = 'kill -s KILL -- "$1"'
# Stderr apart from a terminal's output, through a FIFO $1: the command makes it (so it
# may remove it), opens it once the reader (a second exec, whose output is the stderr)
# has, removes it (nothing is left behind however either ends) and runs.
_STDERR_INTO = 'f=$1; shift; mkfifo -m 600 "$f" || exit; exec 2>"$f"; rm -f "$f"; exec "$@"'
_STDERR_READ = (
    'until [ -e "$1" ] || [ -e "$1.end" ]; do sleep 0.01; done; '
    '[ -p "$1" ] && exec cat "$1"; exit 0'
)
# A reader left waiting (its command never made the FIFO, or died before opening it)
# is ended by opening the FIFO, or by the `.end` file it also waits for.
_STDERR_END = '[ -p "$1" ] && { : >"$1"; rm -f "$1"; }; : >"$1.end"; sleep 0.2; rm -f "$1.end"'
STDERR_FIFO_DIR = "/tmp"
# $1 the working dir, $2 "contents" to delete what it holds first (but dot files, as a
# shell's `./*`), $3 how many paths to delete, those paths, then the directory to extract
# into (or "" for the working dir), then tar's own options.
_UPLOAD = _ENTER + (
    'if [ "$1" = contents ]; then rm -rf -- ./* || exit; fi; shift; '
    'n=$1; shift; while [ "$n" -gt 0 ]; do rm -rf -- "$1" || exit; shift; n=$((n - 1)); done; '
    'target=$1; shift; [ -z "$target" ] || { mkdir -p -- "$target" && cd -- "$target"; } '
    '|| exit; exec tar -x -f - "$@"'
)
# $1 the working dir, $2 the path, $3 "all" for a recursive listing, $4 find's format.
_LIST = _ENTER + (
    '[ -e "$1" ] || [ -L "$1" ] || exit 3; '
    'if [ -d "$1" ]; then '
    'if [ "$2" = all ]; then exec find -H "$1" -mindepth 1 -printf "$3"; fi; '
    'exec find -H "$1" -mindepth 1 -maxdepth 1 -printf "$3"; fi; '
    'exec find -H "$1" -maxdepth 0 -printf "$3"'
)
# Type, permission bits (octal), size, mtime (epoch seconds with a fraction), the path
# below the listed one, the link target, owner, group: each ends in NUL, the one byte no
# name holds.
_LIST_FIELDS = 8
_LIST_FORMAT = "%y\\0%m\\0%s\\0%T@\\0%P\\0%l\\0%u\\0%g\\0"
# $1 the working dir, $2 the file: a line of the PID of the `cat` that follows (`exec`
# keeps the shell's) and the file's size, then its bytes.
_DOWNLOAD = _ENTER + (
    '[ -e "$1" ] || exit 3; [ -f "$1" ] || exit 4; printf "%s " "$$"; '
    'stat -L -c %s -- "$1" || exit; exec cat -- "$1"'
)

_TYPES = {"f": "file", "d": "directory", "l": "link"}


# The paths runner_path takes, as JSON Schema patterns for the API documents: no NUL
# and no `..` at all (runner_path takes one that stays inside: these are what it always
# takes); BELOW_PATTERN also not the working directory or `/` itself. `[\s\S]`, not `.`:
# names may hold line breaks.
PATH_PATTERN = r"^(?![\s\S]*(?:^|/)\.\.(?:/|$))[^\u0000]+$"
BELOW_PATTERN = r"^(?![\s\S]*(?:^|/)\.\.(?:/|$))(?=[\s\S]*[^./])[^\u0000]+$"


class InvalidValue(ValueError):
    """A value of a request that cannot be run (the message says why)."""


@dataclass(frozen=True, slots=True)
class RunnerPath:
    """A path of a request: `shown` as the API reports it (`prog/main.py`, `/tmp/x`, `.`),
    `argument` as the script gets it (relative ones as `./…`, never read as an option)."""

    shown: str
    argument: str

    @property
    def relative(self) -> bool:
        return not self.shown.startswith("/")


def runner_path(path: str, *, max_length: int = 4096) -> RunnerPath:
    """A client's path: absolute as given, relative under the working directory. `..`
    that climbs out of the working directory is refused, and so are NUL and overlong
    paths. Normalised lexically (`a/./b/../c` is `a/c`), as the API reports it."""
    if not path:
        raise InvalidValue("must not be empty")
    if "\0" in path:
        raise InvalidValue("must not contain NUL")
    if len(path.encode("utf-8", "surrogatepass")) > max_length:
        raise InvalidValue(f"must be at most {max_length} bytes")
    shown = posixpath.normpath(path)
    if shown.startswith("/"):
        shown = "/" + shown.lstrip("/")  # POSIX keeps a leading "//"; one is enough
        return RunnerPath(shown, shown)
    if shown == ".." or shown.startswith("../"):
        raise InvalidValue("must not leave the working directory")
    return RunnerPath(shown, shown if shown == "." else "./" + shown)


def working_dir(pool_dir: str | None, requested: str | None) -> str:
    """Where an execution starts: the request's directory under the pool's (either may
    be absent; "" is the task's own working directory)."""
    if requested is None:
        return pool_dir or ""
    argument = runner_path(requested).argument
    if pool_dir is None or argument.startswith("/"):
        return argument
    return posixpath.join(pool_dir, argument)


# ---- executions ------------------------------------------------------------------------


def execution_command(
    command: str | Sequence[str],
    *,
    time_limit_seconds: int,
    directory: str,
    env: Mapping[str, str],
    wrapper: Sequence[str],
) -> list[str]:
    """The argv Nomad's exec runs for an execution: the launcher, `timeout`, the
    unprivileged wrapper (if any), `env` with the variables (if any), then the command
    (a string runs as `/bin/sh -c`). `env` takes NAME=VALUE words as they are, with no
    shell in between, so values arrive byte for byte."""
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    prefix = [*wrapper]
    if env:
        if "=" in argv[0]:
            raise InvalidValue("with env, the program must not contain '=' (env would read it)")
        prefix += ["env", *(f"{name}={value}" for name, value in env.items())]
    launcher = ["/bin/sh", "-c", _LAUNCH, LAUNCHER_NAME, directory, str(time_limit_seconds)]
    return [*launcher, *prefix, *argv]


def stderr_into(fifo: str, command: str | Sequence[str]) -> list[str]:
    """`command` (a string runs as `/bin/sh -c`) with its stderr into `fifo`, which it
    makes, and opens once the reader (stderr_reader_command) has."""
    argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    return ["/bin/sh", "-c", _STDERR_INTO, LAUNCHER_NAME, fifo, *argv]


def stderr_reader_command(fifo: str) -> list[str]:
    """Wait for `fifo`, then print what comes through it."""
    return ["/bin/sh", "-c", _STDERR_READ, LAUNCHER_NAME, fifo]


def stderr_end_command(fifo: str) -> list[str]:
    """End a reader still waiting for its command to open `fifo`."""
    return ["/bin/sh", "-c", _STDERR_END, LAUNCHER_NAME, fifo]


def kill_command(pid: int, *, group: bool = True) -> list[str]:
    """SIGKILL to an execution's process group (or, not `group`, to one process), from
    a second exec."""
    return ["/bin/sh", "-c", _KILL, LAUNCHER_NAME, f"-{pid}" if group else str(pid)]


class PidMarker:
    """Takes the launcher's `\\x1e<pid>\\x1e` off the front of an execution's stdout."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.done = False
        self._head = b""

    def feed(self, data: bytes) -> bytes:
        """The command's own output in `data` (b"" while the marker is still coming)."""
        if self.done:
            return data
        self._head += data
        if not self._head.startswith(PID_MARK):
            return self._finish(self._head)  # not the launcher's output: no PID known
        end = self._head.find(PID_MARK, 1)
        if end < 0:
            return b"" if len(self._head) < _MARKER_LIMIT else self._finish(self._head)
        digits = self._head[1:end]
        if digits.isdigit():
            self.pid = int(digits)
            return self._finish(self._head[end + 1 :])
        return self._finish(self._head)

    def _finish(self, rest: bytes) -> bytes:
        self.done = True
        self._head = b""
        return rest


class TextStream:
    """Bytes to text as they come: a character split between two chunks is kept until
    its end arrives; invalid UTF-8 becomes U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def text(self, data: bytes, final: bool = False) -> str:
        return self._decoder.decode(data, final)


# ---- files -----------------------------------------------------------------------------


def upload_command(
    pool_dir: str | None,
    delete: Sequence[RunnerPath],
    target: RunnerPath | None,
    *,
    own: bool,
    clear: bool = False,
) -> list[str]:
    """Delete the working directory's contents but dot files (`clear`) and `delete`
    (recursively), then extract the tar on stdin, into `target` (made if missing) or the
    working directory. `own`: the archive is poolkeeper's (names already checked,
    absolute ones kept: `-P`); otherwise it is a client's, checked too, and tar's own
    guards (no leading `/`, no `..`) stay on."""
    paths = [p.argument for p in delete]
    options = ["-P"] if own else []
    into = "" if target is None else target.argument
    return [
        "/bin/sh", "-c", _UPLOAD, LAUNCHER_NAME, pool_dir or "",
        "contents" if clear else "keep", str(len(paths)), *paths, into, *options,
    ]  # fmt: skip


def list_command(pool_dir: str | None, path: RunnerPath, *, recursive: bool) -> list[str]:
    return [
        "/bin/sh", "-c", _LIST, LAUNCHER_NAME, pool_dir or "", path.argument,
        "all" if recursive else "one", _LIST_FORMAT,
    ]  # fmt: skip


def download_command(pool_dir: str | None, path: RunnerPath) -> list[str]:
    return ["/bin/sh", "-c", _DOWNLOAD, LAUNCHER_NAME, pool_dir or "", path.argument]


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    type: str  # file, directory, link, other
    size: int
    mode: str  # octal, "0644"
    modified_at: str  # RFC 3339 UTC
    link_target: str | None
    # As the runner shows them (not in the API's entries): the path below the listed
    # one ("" for the listed path itself), find's type letter (`f`, `d`, `l`, `b`, `c`,
    # `p`, `s`, `D`), the time in epoch seconds, owner and group names.
    below: str = ""
    kind: str = "f"
    modified_epoch: int = 0
    owner: str = ""
    group: str = ""

    def to_dict(self) -> dict[str, object]:
        entry: dict[str, object] = {
            "path": self.path,
            "type": self.type,
            "size": self.size,
            "mode": self.mode,
            "modifiedAt": self.modified_at,
        }
        if self.link_target is not None:
            entry["linkTarget"] = self.link_target
        return entry


def parse_listing(output: bytes, listed: RunnerPath) -> list[FileEntry]:
    """The entries `find -printf` printed (ValueError for output it cannot have made),
    sorted by path. Paths are shown under the listed one (`prog/main.py` for `prog`);
    names that are not UTF-8 have their bad bytes replaced."""
    fields = output.split(b"\0")
    if fields[-1] != b"" or (len(fields) - 1) % _LIST_FIELDS:
        raise ValueError("the listing ended in the middle of an entry")
    entries = []
    base = "" if listed.shown == "." else listed.shown
    for start in range(0, len(fields) - 1, _LIST_FIELDS):
        kind, mode, size, mtime, below, target, owner, group = fields[start : start + _LIST_FIELDS]
        name = below.decode("utf-8", "replace")
        path = posixpath.join(base, name) if name else base
        modified = _epoch_time(mtime.decode("ascii"))
        entries.append(
            FileEntry(
                path=path,
                type=_TYPES.get(kind.decode("ascii", "replace"), "other"),
                size=int(size),
                mode=f"{int(mode, 8):04o}",
                modified_at=format_time(modified),
                link_target=target.decode("utf-8", "replace") if kind == b"l" else None,
                below=name,
                kind=kind.decode("ascii", "replace"),
                modified_epoch=int(modified.timestamp()),
                owner=owner.decode("utf-8", "replace"),
                group=group.decode("utf-8", "replace"),
            )
        )
    return sorted(entries, key=lambda entry: entry.path)


def _epoch_time(text: str) -> datetime:
    try:
        seconds = Decimal(text)
    except InvalidOperation:
        raise ValueError(f"not a time: {text!r}") from None
    whole = int(seconds // 1)
    micro = int((seconds - whole) * 1_000_000)
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=whole, microseconds=micro)


def parse_download_head(head: bytes) -> tuple[int, int, bytes] | None:
    """A download's `<pid> <size>\\n`: the PID, the size and the bytes after the line;
    None while the line is incomplete. ValueError for a line that is not that."""
    line, newline, rest = head.partition(b"\n")
    if not newline:
        if len(head) > 64:
            raise ValueError("no size line")
        return None
    pid, _, size = line.partition(b" ")
    if not (pid.isdigit() and size.isdigit()):
        raise ValueError(f"not a PID and a size: {line[:64]!r}")
    return int(pid), int(size), rest
