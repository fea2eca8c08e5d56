"""The command lines of executions and files, run here with this machine's sh and tools,
and the parsing of what they print."""

from __future__ import annotations

import grp
import io
import os
import pwd
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.executions.commands import (
    InvalidValue,
    PidMarker,
    TextStream,
    download_command,
    execution_command,
    kill_command,
    list_command,
    parse_download_head,
    parse_listing,
    runner_path,
    stderr_end_command,
    stderr_into,
    stderr_reader_command,
    upload_command,
    working_dir,
)
from tests.simulator.exec_support import alive


@pytest.mark.parametrize(
    ("path", "shown", "argument"),
    [
        (".", ".", "."),
        ("prog/main.py", "prog/main.py", "./prog/main.py"),
        ("./a/./b/../c", "a/c", "./a/c"),
        ("-rf", "-rf", "./-rf"),  # never read as an option
        ("/tmp/x/../y", "/tmp/y", "/tmp/y"),
        ("//etc", "/etc", "/etc"),
        ("a/..", ".", "."),
    ],
)
def test_paths(path: str, shown: str, argument: str) -> None:
    checked = runner_path(path)
    assert (checked.shown, checked.argument) == (shown, argument)


@pytest.mark.parametrize("path", ["", "..", "../x", "a/../../x", "a\0b", "a" * 5000])
def test_paths_refused(path: str) -> None:
    with pytest.raises(InvalidValue):
        runner_path(path)


def test_working_dirs() -> None:
    assert working_dir(None, None) == ""
    assert working_dir("/workspace", None) == "/workspace"
    assert working_dir("/workspace", "sub") == "/workspace/./sub"
    assert working_dir("/workspace", "/abs") == "/abs"
    assert working_dir(None, "sub") == "./sub"


def run(argv: list[str], cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    # As an exec starts its process: a session of its own.
    return subprocess.run(
        argv, cwd=cwd, input=stdin, capture_output=True, timeout=30, start_new_session=True
    )


def test_the_launcher_prints_its_pid_then_runs_the_command(tmp_path: Path) -> None:
    argv = execution_command(
        ["sh", "-c", 'echo "$$ $A"'], time_limit_seconds=10, directory="", env={"A": "a b"},
        wrapper=[],
    )  # fmt: skip
    done = run(argv, tmp_path)
    marker = PidMarker()
    rest = marker.feed(done.stdout)
    assert marker.pid is not None and marker.done
    # `env` and the command are the children of `timeout`, which kept the launcher's PID.
    assert rest.decode().split()[1:] == ["a", "b"]
    assert done.returncode == 0


def test_the_time_limit_kills_the_whole_group(tmp_path: Path) -> None:
    argv = execution_command(
        "sleep 60 & echo $!; wait", time_limit_seconds=1, directory="", env={}, wrapper=[]
    )
    done = run(argv, tmp_path)  # returns, well before the sleep would end
    child = int(PidMarker().feed(done.stdout).split()[0])
    assert done.returncode == -9  # `timeout` killed its own group, itself included
    deadline = time.monotonic() + 30
    while alive(child):  # a zombie until this machine's init reaps it: gone already
        assert time.monotonic() < deadline, f"process {child} outlived the limit"
        time.sleep(0.05)


def test_a_kill_ends_the_group_from_outside(tmp_path: Path) -> None:
    argv = execution_command(
        "sleep 60 & wait", time_limit_seconds=60, directory="", env={}, wrapper=[]
    )
    process = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None
    marker = PidMarker()
    while not marker.done:
        marker.feed(process.stdout.read(1))
    assert marker.pid == process.pid
    subprocess.run(kill_command(marker.pid), check=True, timeout=30)
    assert process.wait(timeout=30) == -9


def test_the_directory_and_the_wrapper(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    argv = execution_command(
        ["sh", "-c", "pwd; echo $W"], time_limit_seconds=10, directory="./sub", env={},
        wrapper=["env", "W=wrapped"],
    )  # fmt: skip
    out = PidMarker().feed(run(argv, tmp_path).stdout).decode()
    assert out == f"{tmp_path / 'sub'}\nwrapped\n"


def test_a_program_env_would_misread_is_refused() -> None:
    with pytest.raises(InvalidValue):
        execution_command(["A=B"], time_limit_seconds=1, directory="", env={"X": "1"}, wrapper=[])


@given(st.binary(max_size=40), st.integers(min_value=1, max_value=10))
def test_the_marker_comes_off_in_any_chunks(rest: bytes, size: int) -> None:
    data = b"\x1e4242\x1e" + rest
    marker = PidMarker()
    out = b"".join(marker.feed(data[i : i + size]) for i in range(0, len(data), size))
    assert (marker.pid, out) == (4242, rest)


def test_output_without_a_marker_is_passed_on() -> None:
    marker = PidMarker()
    assert marker.feed(b"sh: timeout: not found\n") == b"sh: timeout: not found\n"
    assert marker.pid is None and marker.done


@given(st.text(max_size=30), st.integers(min_value=1, max_value=5))
def test_text_survives_any_cut(text: str, size: int) -> None:
    data = text.encode()
    stream = TextStream()
    out = "".join(stream.text(data[i : i + size]) for i in range(0, len(data), size))
    assert out + stream.text(b"", final=True) == text


def test_invalid_utf8_is_replaced() -> None:
    assert TextStream().text(b"a\xffb", final=True) == "a\ufffdb"


def test_a_listing_of_awkward_names(tmp_path: Path) -> None:
    (tmp_path / "dir" / "sub").mkdir(parents=True)
    (tmp_path / "dir" / "new\nline").write_bytes(b"12345")
    (tmp_path / "dir" / os.fsdecode(b"bad\xff")).write_bytes(b"")  # not UTF-8
    os.symlink("sub", tmp_path / "dir" / "link")
    os.chmod(tmp_path / "dir" / "sub", 0o1750)
    listed = runner_path("dir")
    done = run(list_command(None, listed, recursive=True), tmp_path)
    assert done.returncode == 0, done.stderr
    entries = {entry.path: entry for entry in parse_listing(done.stdout, listed)}
    assert set(entries) == {"dir/sub", "dir/new\nline", "dir/bad\ufffd", "dir/link"}
    assert (entries["dir/new\nline"].type, entries["dir/new\nline"].size) == ("file", 5)
    assert (entries["dir/sub"].type, entries["dir/sub"].mode) == ("directory", "1750")
    assert (entries["dir/link"].type, entries["dir/link"].link_target) == ("link", "sub")
    assert entries["dir/sub"].modified_at.endswith("Z")
    # What the Poseidon API shows besides: the name below the listed directory, find's
    # type letter, the time in epoch seconds, owner and group.
    sub = entries["dir/sub"]
    assert (sub.below, sub.kind, entries["dir/link"].kind) == ("sub", "d", "l")
    assert sub.modified_epoch == int((tmp_path / "dir" / "sub").stat().st_mtime)
    assert sub.owner == pwd.getpwuid(os.getuid()).pw_name
    assert sub.group == grp.getgrgid(os.getgid()).gr_name
    missing = run(list_command(None, runner_path("nope"), recursive=True), tmp_path)
    assert missing.returncode == 3


def test_stderr_apart_through_a_fifo_that_is_left_behind_by_neither_end(tmp_path: Path) -> None:
    fifo = str(tmp_path / "stderr")
    reader = subprocess.Popen(stderr_reader_command(fifo), stdout=subprocess.PIPE)
    command = stderr_into(fifo, "echo out; echo err >&2; exit 3")
    done = run(command, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (3, b"out\n", b"")
    assert reader.communicate(timeout=10)[0] == b"err\n"
    assert list(tmp_path.iterdir()) == []


def test_a_reader_whose_command_never_came_is_ended(tmp_path: Path) -> None:
    fifo = str(tmp_path / "stderr")
    reader = subprocess.Popen(stderr_reader_command(fifo), stdout=subprocess.PIPE)
    assert run(stderr_end_command(fifo), tmp_path).returncode == 0
    assert reader.communicate(timeout=10)[0] == b""
    # ... or made the FIFO and died before opening it: the reader waits in its open.
    os.mkfifo(fifo)
    reader = subprocess.Popen(stderr_reader_command(fifo), stdout=subprocess.PIPE)
    time.sleep(0.1)
    assert run(stderr_end_command(fifo), tmp_path).returncode == 0
    assert reader.communicate(timeout=10)[0] == b""
    assert list(tmp_path.iterdir()) == []


def test_an_upload_may_first_clear_the_working_dir_but_its_dot_files(tmp_path: Path) -> None:
    for name in ("old.py", ".keep", "dir/deep.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("old")
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        entry = tarfile.TarInfo("new.py")
        entry.size = 3
        tar.addfile(entry, io.BytesIO(b"new"))
    argv = upload_command(None, [], None, own=True, clear=True)
    done = run(argv, tmp_path, archive.getvalue())
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keep", "new.py"]
    # An empty working directory is cleared too (the shell leaves `./*` unexpanded).
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = upload_command(str(empty), [], None, own=True, clear=True)
    done = run(argv, tmp_path, archive.getvalue())
    assert done.returncode == 0, done.stderr
    assert [p.name for p in empty.iterdir()] == ["new.py"]


def test_a_truncated_listing_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_listing(b"f\x00644\x005\x00", runner_path("."))


def test_download_heads() -> None:
    assert parse_download_head(b"345 12") is None
    assert parse_download_head(b"345 12\nabc") == (345, 12, b"abc")
    for bad in (b"x\n", b"12\n", b"345 x\n", b"1" * 65):
        with pytest.raises(ValueError):
            parse_download_head(bad)


def test_a_download_names_its_cat_which_a_kill_ends(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(bytes(1024 * 1024))  # more than a pipe holds
    argv = download_command(None, runner_path("big"))
    process = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE)
    assert process.stdout is not None
    head = parse_download_head(process.stdout.readline())
    assert head is not None and head[:2] == (process.pid, 1024 * 1024)  # `exec` kept the PID
    # Nobody reads on: cat waits on its full pipe until killed.
    subprocess.run(kill_command(process.pid, group=False), check=True, timeout=30)
    assert process.wait(timeout=30) == -9
