"""The tar archives of uploads: built from a JSON body, or a client's, checked first.

An upload's bytes are held in a spool (memory up to SPOOL_IN_MEMORY, a temporary file
beyond), so that nothing is written in the runner until the whole body has arrived
within `maxUploadBytes` and every path in it is acceptable; then the spool is streamed
to `tar -x` as the exec's stdin. A client's archive is read whole by the check, which
writes the members it read into a spool of its own: that copy is what `tar -x` reads.
"""

from __future__ import annotations

import base64
import io
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
_MAX_ID = 2**32 - 1  # of an owner or a group, as Linux and GNU tar take it
# Links one path may go through (Linux's MAXSYMLINKS: past it the kernel gives up too).
MAX_LINK_FOLLOWS = 40
# Steps of resolving names an archive may take per member, on top of one a name in it:
# an archive whose every member goes through deep chains of long links must not keep a
# core busy for minutes.
RESOLVING_STEPS_PER_MEMBER = 64
LEAVES = "leaves the directory it is extracted into"
LINKS_OUT = "links out of the directory it is extracted into"


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


def checked_copy(spool: Spool) -> Spool:
    """A client's archive, checked, as a new archive of poolkeeper's own holding exactly
    the members the check read: what `tar -x` extracts is what was checked, whatever
    the client's bytes would have made of another reader (GNU tar skips a header it
    cannot read and goes on; Python's tarfile stops there).

    Every member is a file, directory or link, not setuid or setgid, has no absolute
    name and no `..` in its name or hard link target (tar refuses those), and stays
    under the directory it is extracted into as the extraction resolves it: through the
    links earlier members made, each relative to its own directory (`Extraction`).
    Every block up to the end of the archive is read: a header that cannot be read
    (a bad checksum, a field that is no number, a pax record that is not one), a
    member cut short, a sparse file or data after the end is refused too. InvalidValue
    names the member or the byte."""
    copy = Spool()
    try:
        _copy(spool, copy)
    except BaseException:
        copy.close()
        raise
    copy.size = copy.file.tell()
    return copy


def _copy(spool: Spool, copy: Spool) -> None:
    spool.file.seek(0)
    extraction = Extraction()
    last: str | None = None  # the member read last, for messages
    position = 0  # where the headers of the next member start
    try:
        with (
            _Reader.open(fileobj=spool.file, mode="r:") as archive,
            tarfile.open(fileobj=copy.file, mode="w", format=tarfile.PAX_FORMAT) as out,
        ):
            while (member := archive.next()) is not None:
                archive.members.clear()  # one at a time: 100,000 empty members fit the limit
                problem = _member_problem(member) or extraction.add(member)
                if problem is not None:
                    raise InvalidValue(f"tar member {member.name[:200]!r} {problem}")
                _check_headers(spool, position, member)
                if member.isreg() and member.offset_data + member.size > spool.size:
                    raise InvalidValue(f"tar member {member.name[:200]!r} is cut short")
                out.addfile(_plain(member), archive.extractfile(member) if member.isreg() else None)
                last, position = member.name, archive.offset
            _check_end(spool, archive, last)
    except (tarfile.TarError, ValueError, OverflowError) as error:
        if isinstance(error, InvalidValue):
            raise
        where = "" if last is None else f" after member {last[:200]!r}"
        raise InvalidValue(f"the tar archive cannot be read{where}: {error}") from None
    leaving = extraction.leaving_link()
    if leaving is not None:
        raise InvalidValue(f"tar member {leaving[:200]!r} {LINKS_OUT}")


class _Reader(tarfile.TarFile):
    members: list[tarfile.TarInfo]  # every member read so far (typeshed leaves it out)


def _plain(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """What of a member is extracted: its kind, name, link, mode, times and owner (not
    the client's pax records: extended attributes, comments, sparse maps)."""
    plain = tarfile.TarInfo(member.name)
    plain.type = tarfile.REGTYPE if member.isreg() else member.type
    plain.size = member.size if member.isreg() else 0
    plain.mode = member.mode & 0o7777
    plain.linkname = member.linkname
    plain.mtime = member.mtime
    plain.uid, plain.gid, plain.uname, plain.gname = (
        member.uid,
        member.gid,
        member.uname,
        member.gname,
    )
    return plain


def _check_headers(spool: Spool, start: int, member: tarfile.TarInfo) -> None:
    """The headers of `member` from `start` (pax and GNU long name headers, then its
    own), read once more: tarfile skips a pax record it cannot parse, tar would not."""
    offset = start
    if member.offset_data - offset <= BLOCK:
        return  # its own header alone, which tarfile has read
    while offset < member.offset_data:
        spool.file.seek(offset)
        info = tarfile.TarInfo.frombuf(spool.file.read(BLOCK), "utf-8", "surrogateescape")
        offset += BLOCK
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE):
            problem = _pax_problem(spool.file.read(info.size))
            if problem is not None:
                raise InvalidValue(f"tar member {member.name[:200]!r} has {problem}")
        if info.type in _EXTENSIONS:
            offset += -(-info.size // BLOCK) * BLOCK


_EXTENSIONS = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
BLOCK = tarfile.BLOCKSIZE


def _pax_problem(data: bytes) -> str | None:
    """What is wrong with a pax header's records (`<length> <key>=<value>\n` each, the
    length counting the whole record), or None."""
    position = 0
    while position < len(data):
        length_text, space, _ = data[position : position + 24].partition(b" ")
        if not (space and length_text.isdigit()):
            return f"a pax record at byte {position} of its header without a length"
        end = position + int(length_text)
        record = data[position + len(length_text) + 1 : end]
        key, equals, _ = record.partition(b"=")
        if end > len(data) or not (key and equals and record.endswith(b"\n")):
            return f"a pax record at byte {position} of its header that is not `key=value`"
        position = end
    return None


def _check_end(spool: Spool, archive: tarfile.TarFile, last: str | None) -> None:
    """Where tarfile stopped reading: the end of the body, or the end-of-archive zero
    block with nothing but zeros after it. Anything else is a header tarfile could not
    read (it stops there without a word) or data tar would skip or misread."""
    end = archive.offset
    spool.file.seek(end)
    block = spool.file.read(BLOCK)
    where = f"at byte {end}" + ("" if last is None else f", after member {last[:200]!r}")
    if block.strip(b"\0"):
        try:
            spool.file.seek(end)
            tarfile.TarInfo.fromtarfile(archive)
            reason = "not a header"
        except tarfile.HeaderError as error:
            reason = str(error)
        raise InvalidValue(f"the tar archive cannot be read {where}: {reason}")
    while chunk := spool.file.read(READ_CHUNK):
        if chunk.strip(b"\0"):
            raise InvalidValue(f"the tar archive has data after its end ({where})")


def _member_problem(member: tarfile.TarInfo) -> str | None:
    if member.issparse() or member.type == tarfile.GNUTYPE_SPARSE:
        return "is a sparse file, which uploads do not take"
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return "is not a file, directory or link"
    if member.mode & _PRIVILEGE_BITS:
        return "is setuid or setgid"
    if not (0 <= member.uid <= _MAX_ID and 0 <= member.gid <= _MAX_ID):
        return f"has an owner or group ID out of range (0 to {_MAX_ID}), which tar refuses"
    if member.name.startswith("/") or (member.islnk() and member.linkname.startswith("/")):
        return LEAVES
    if ".." in member.name.split("/") or (member.islnk() and ".." in member.linkname.split("/")):
        return "has `..` in its name or link target, which tar refuses"
    return None


class _Refused(Exception):
    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class _Node:
    """A name under the extraction's directory at or below which an earlier member made
    a symbolic link (names with no link below them need no node)."""

    __slots__ = ("children", "link", "member", "parent")

    def __init__(self, parent: _Node | None) -> None:
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.link: str | None = None  # the target, as the link holds it
        self.member = ""  # the member that made the link


# Where a path has got to: the deepest node, and the names below it (which hold no link).
_Place = tuple[_Node, list[str]]


class Extraction:
    """What extracting an archive member by member does to where its names lead, as tar
    does it: a name goes through the symbolic links that earlier members made, each
    relative to its own directory (through a link to a link, through `..`); a file or link
    replaces a link of its name (tar removes it first), a directory may keep it (some tars
    do). What the directory held before is not known here: names no member made are taken
    as directories. A link whose target has `..` is made last by GNU tar, so nothing goes
    through it within the archive: a member that would is refused too."""

    def __init__(self) -> None:
        self.root = _Node(None)
        self.links: dict[_Node, None] = {}  # in the order they were made
        self.steps_left = 0

    def add(self, member: tarfile.TarInfo) -> str | None:
        """Extract `member`: None, or why it is refused."""
        names, link_names = _names(member.name), _names(member.linkname)
        self.steps_left += len(names) + len(link_names) + RESOLVING_STEPS_PER_MEMBER
        try:
            if not names:
                return None if member.isdir() else "names the directory it is extracted into"
            node, below = self._resolve(names[:-1], (self.root, []), within_archive=True)
            if member.isdir():
                # A directory member over a link: some tars keep the link and go through it.
                self._resolve(names[-1:], (node, below), within_archive=False)
                return None
            target = member.linkname if member.issym() else None
            if member.islnk():  # a hard link to a symbolic link is that link again
                source, source_below = self._resolve(
                    link_names, (self.root, []), within_archive=True, last=False
                )
                target = None if source_below else source.link
            self._place(node, [*below, names[-1]], target, member.name)
            if target is not None:
                self._resolve_link(target, node, below)
        except _Refused as refused:
            return refused.problem
        return None

    def leaving_link(self) -> str | None:
        """The member that made a link that, as the extraction ends, leads out of the
        directory (a later link may have moved where an earlier one leads)."""
        for node in self.links:
            if node.link is None or node.parent is None:  # replaced by a later member
                continue
            try:
                self._resolve_link(node.link, node.parent, [])
            except _Refused:
                return node.member
        return None

    def _resolve_link(self, target: str, node: _Node, below: list[str]) -> None:
        """Where a link in (`node`, `below`) to `target` leads: _Refused when out."""
        try:
            if target.startswith("/"):
                raise _Refused(LEAVES)
            self._resolve(_names(target), (node, below), within_archive=False)
        except _Refused as refused:
            raise _Refused(LINKS_OUT if refused.problem == LEAVES else refused.problem) from None

    def _place(self, node: _Node, names: list[str], target: str | None, member: str) -> None:
        """A file (`target` None) or a link at `names` below `node`."""
        for name in names[:-1]:
            node = node.children.setdefault(name, _Node(node))
        if target is None:
            existing = node.children.get(names[-1])
            if existing is not None:
                existing.link = None
            return
        link = node.children.setdefault(names[-1], _Node(node))
        link.link, link.member = target, member
        self.links[link] = None

    def _resolve(
        self,
        names: list[str],
        start: _Place,
        *,
        within_archive: bool,
        last: bool = True,
    ) -> _Place:
        """Where `names` lead from `start`, following links (the last name's too, with
        `last`). _Refused when that is out of the directory, through too many links, or
        (`within_archive`: a member's own name) through a link made only at the end."""
        node, below = start[0], list(start[1])
        pending = names[::-1]
        follows = 0
        while pending:
            self.steps_left -= 1
            if self.steps_left < 0:
                raise _Refused("goes through more links than an archive of its size may")
            name = pending.pop()
            if name == "..":
                if below:
                    below.pop()
                elif node.parent is None:
                    raise _Refused(LEAVES)
                else:
                    node = node.parent
                continue
            child = None if below else node.children.get(name)
            if child is None:
                below.append(name)
                continue
            if child.link is None or (not pending and not last):
                node = child
                continue
            follows += 1
            if follows > MAX_LINK_FOLLOWS:
                raise _Refused(f"goes through more than {MAX_LINK_FOLLOWS} links")
            if child.link.startswith("/"):
                raise _Refused(LEAVES)
            target = _names(child.link)
            if within_archive and ".." in target:
                raise _Refused(
                    f"goes through the link {child.member[:200]!r}, which has `..` in its "
                    "target: tar makes such links last"
                )
            pending.extend(reversed(target))
        return node, below


def _names(path: str) -> list[str]:
    return [name for name in path.split("/") if name not in ("", ".")]
