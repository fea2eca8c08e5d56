"""The tar archives of uploads: built from a JSON body, or a client's, checked first.

An upload's bytes are held once, in a spool (memory up to SPOOL_IN_MEMORY, a temporary
file beyond), so that nothing is written in the runner until the whole body has arrived
within `maxUploadBytes` and every path in it is acceptable; then the spool is streamed
to `tar -x` as the exec's stdin.
"""

from __future__ import annotations

import base64
import io
import posixpath
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from controller.executions.commands import InvalidValue, RunnerPath

SPOOL_IN_MEMORY = 8 * 1024 * 1024
READ_CHUNK = 256 * 1024
# Directories an upload creates: like /tmp, every user may add files to them (executions
# may run unprivileged), only a file's owner removes it.
DIRECTORY_MODE = 0o1777
_PRIVILEGE_BITS = 0o6000  # setuid, setgid: an unprivileged execution would gain the owner's


class Spool:
    """An upload's bytes, written once and read back in chunks."""

    def __init__(self) -> None:
        self.file = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
        self.size = 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.size += len(data)

    def chunks(self) -> Iterator[bytes]:
        self.file.seek(0)
        while chunk := self.file.read(READ_CHUNK):
            yield chunk

    def close(self) -> None:
        self.file.close()


@dataclass(frozen=True, slots=True)
class UploadedFile:
    path: RunnerPath
    content: str  # standard base64, as the client sent it
    mode: int


def decoded_size(content: str) -> int:
    """The bytes `content` decodes to, without decoding it (checked against the limit
    before anything is decoded)."""
    return len(content) // 4 * 3 - content[-2:].count("=")


def build_archive(directories: Sequence[RunnerPath], files: Sequence[UploadedFile]) -> Spool:
    """poolkeeper's own archive: the directories first, then the files (tar makes
    missing parents). Bad base64 is InvalidValue. Names are the checked paths as shown:
    relative ones land under the working directory, absolute ones where they say."""
    spool = Spool()
    now = time.time()
    with tarfile.open(fileobj=spool.file, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for directory in directories:
            entry = tarfile.TarInfo(directory.shown)
            entry.type, entry.mode, entry.mtime = tarfile.DIRTYPE, DIRECTORY_MODE, now
            archive.addfile(entry)
        for index, uploaded in enumerate(files):
            try:
                data = base64.b64decode(uploaded.content, validate=True)
            except ValueError:  # binascii.Error, or a character that is not ASCII
                raise InvalidValue(f"files[{index}].content: not standard base64") from None
            entry = tarfile.TarInfo(uploaded.path.shown)
            entry.size, entry.mode, entry.mtime = len(data), uploaded.mode, now
            archive.addfile(entry, io.BytesIO(data))
    spool.size = spool.file.tell()
    return spool


def check_archive(spool: Spool) -> None:
    """A client's archive, before anything of it is written: every member stays under
    the directory it is extracted into (no absolute name, no `..` out of it, no link
    pointing out of it), is a file, directory or link, and is not setuid or setgid.
    InvalidValue names the first member that is not."""
    spool.file.seek(0)
    try:
        with tarfile.open(fileobj=spool.file, mode="r:") as archive:
            for member in archive:
                problem = _member_problem(member)
                if problem is not None:
                    raise InvalidValue(f"tar member {member.name[:200]!r} {problem}")
    except tarfile.TarError as error:
        raise InvalidValue(f"the body is not a tar archive ({error})") from None


def _member_problem(member: tarfile.TarInfo) -> str | None:
    if _escapes(member.name):
        return "leaves the directory it is extracted into"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return "is not a file, directory or link"
    if member.mode & _PRIVILEGE_BITS:
        return "is setuid or setgid"
    if member.issym() and _escapes(posixpath.join(posixpath.dirname(member.name), member.linkname)):
        return "links out of the directory it is extracted into"
    if member.islnk() and _escapes(member.linkname):
        return "links out of the directory it is extracted into"
    return None


def _escapes(name: str) -> bool:
    if name.startswith("/"):
        return True
    normal = posixpath.normpath(name)
    return normal == ".." or normal.startswith("../")
