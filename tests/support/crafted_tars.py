"""Tar archives crafted block by block, as a hostile client (or an odd tool) writes them:
those the upload check refuses, with what its refusal says, and those it takes, with what
`tar -x` makes of them."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from tests.support.tars import (
    END,
    Member,
    directory,
    file,
    gnu_long,
    hardlink,
    header,
    padded,
    pax,
    raw_file,
    symlink,
    tar_of,
)

GNU = b"ustar  \0"


def tar_in(format: int, *members: Member) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=format) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def old_gnu_sparse(name: bytes, data: bytes, real_size: int) -> bytes:
    """GNU's old sparse member ('S'): its data at offset 0, a hole up to `real_size`."""
    entry = b"%011o\0%011o\0" % (0, len(data))
    fields = {386: entry, 482: b"\0", 483: b"%011o\0" % real_size}
    return header(name, b"S", size=len(data), magic=GNU, extra=fields) + padded(data)


def pax_sparse_1_0(name: str, data: bytes, real_size: int) -> bytes:
    """GNU's sparse format 1.0 in pax: the map as the member's first block."""
    records = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": name,
        "GNU.sparse.realsize": str(real_size),
    }
    body = padded(b"1\n0\n%d\n" % len(data)) + data
    return pax(records) + raw_file(b"GNUSparseFile.0/" + name.encode(), body)


def hidden_after(broken: bytes) -> bytes:
    """A good member, `broken`, then what must not be missed (issue 34's archive)."""
    return (
        raw_file(b"good.txt")
        + broken
        + raw_file(b"suid", b"#!/bin/sh\n", mode=0o4755)
        + header(b"fifo", tarfile.FIFOTYPE)
        + header(b"l9", tarfile.SYMTYPE, link=b"/tmp/outside")
        + END
    )


LONG = "d/" + "n" * 200
# name, archive, what the refusal says
CRAFTED_REFUSED: list[tuple[str, bytes, str]] = [
    (
        "bad checksum, then hidden members",
        hidden_after(header(b"junk", checksum_off_by=1)),
        "cannot be read at byte 1024, after member 'good.txt': bad checksum",
    ),
    ("a block of garbage, then hidden members", hidden_after(b"\x01" * 512), "invalid header"),
    ("bad checksum first", header(b"a", checksum_off_by=1) + END, "bad checksum"),
    (
        "a size that is no number",
        raw_file(b"a") + header(b"b", size_field=b"zz\0") + END,
        "at byte 1024, after member 'a': invalid header",
    ),
    (
        "data cut short",
        raw_file(b"a") + header(b"b", size=2000) + b"x" * 600,
        "tar member 'b' is cut short",
    ),
    ("a header cut short", raw_file(b"a") + header(b"b")[:300], "truncated header"),
    ("an empty body", b"", "empty file"),
    ("data after the end", raw_file(b"a") + END + b"more" * 200, "data after its end"),
    (
        "a lone zero block, then a member",
        raw_file(b"a") + bytes(512) + raw_file(b"b") + END,
        "data after its end",
    ),
    (
        "GNU long name with ..",
        gnu_long(b"a/../../" + b"n" * 200) + raw_file(b"safe") + END,
        "has `..`",
    ),
    (
        "GNU long name of an absolute path",
        gnu_long(b"/" + b"e" * 200) + raw_file(b"ok") + END,
        "leaves the directory",
    ),
    (
        "GNU long link out",
        gnu_long(b"/" + b"e" * 200, tarfile.GNUTYPE_LONGLINK)
        + header(b"l", tarfile.SYMTYPE, link=b"x")
        + END,
        "links out",
    ),
    (
        "GNU long name, then a bad header",
        gnu_long(b"n" * 200) + header(b"x", checksum_off_by=1) + END,
        "bad checksum",
    ),
    ("GNU long name at the end", raw_file(b"a") + gnu_long(b"n" * 200) + END, "cannot be read"),
    (
        "pax path with .. behind a safe name",
        pax({"path": "../evil"}) + raw_file(b"safe") + END,
        "tar member '../evil' has `..`",
    ),
    (
        "pax linkpath absolute",
        pax({"linkpath": "/etc"}) + header(b"l", tarfile.SYMTYPE, link=b"ok") + END,
        "tar member 'l' links out",
    ),
    (
        "pax global path for every member",
        pax({"path": "../g"}, tarfile.XGLTYPE) + raw_file(b"a") + END,
        "has `..`",
    ),
    (
        "pax size 0: the data read as a header",
        pax({"size": "0"}) + raw_file(b"cover", header(b"suid", mode=0o4755)) + END,
        "tar member 'suid' is setuid",
    ),
    (
        "a pax record of garbage",
        raw_file(b"h", b"garbage\n", kind=tarfile.XHDTYPE) + raw_file(b"a") + END,
        "a pax record at byte 0 of its header without a length",
    ),
    (
        "a pax record longer than its header",
        raw_file(b"h", b"99 path=x\n", kind=tarfile.XHDTYPE) + raw_file(b"a") + END,
        "that is not `key=value`",
    ),
    (
        "a pax record without =",
        raw_file(b"h", b"9 path x\n", kind=tarfile.XHDTYPE) + raw_file(b"a") + END,
        "that is not `key=value`",
    ),
    ("a pax header at the end", raw_file(b"a") + pax({"path": "b"}) + END, "cannot be read"),
    ("old GNU sparse file", old_gnu_sparse(b"s", b"data", 10**12) + END, "sparse"),
    ("pax sparse file (1.0)", pax_sparse_1_0("s", b"data", 10**12) + END, "sparse"),
    (
        "pax sparse file (0.1)",
        pax({"GNU.sparse.map": "0,4", "GNU.sparse.size": "4096"}) + raw_file(b"s", b"data") + END,
        "sparse",
    ),
    ("a FIFO", header(b"f", tarfile.FIFOTYPE) + END, "is not a file, directory or link"),
    ("a character device", header(b"c", tarfile.CHRTYPE) + END, "not a file, directory"),
    ("a block device", header(b"b", tarfile.BLKTYPE) + END, "not a file, directory"),
    ("an unknown type", header(b"z", b"Z", size=1) + padded(b"x") + END, "not a file"),
    ("a GNU volume header", header(b"vol", b"V", magic=GNU) + END, "not a file"),
    (
        "a GNU multi-volume part",
        header(b"m", b"M", size=1, magic=GNU) + padded(b"x") + END,
        "not a file",
    ),
    (
        "a GNU dump directory",
        header(b"d", b"D", size=2, magic=GNU) + padded(b"a\0") + END,
        "not a file",
    ),
    ("setuid in a GNU archive", raw_file(b"s", mode=0o4755, magic=GNU) + END, "setuid"),
    ("a negative owner (pax)", pax({"uid": "-5"}) + raw_file(b"a") + END, "owner or group ID"),
    (
        "an owner past 32 bits (pax)",
        pax({"gid": str(2**40)}) + raw_file(b"a") + END,
        "out of range",
    ),
    (
        "a negative owner (base-256)",
        raw_file(b"a", extra={108: b"\xff" * 8}) + END,
        "owner or group ID",
    ),
    (
        "hard link to a link that leads out",
        tar_of(directory("d"), symlink("d/up", ".."), hardlink("h", "d/up")),
        "tar member 'h' links out",
    ),
]
# name, archive, what `tar -x` of the copy makes: path -> content, "dir" or "-> target"
CRAFTED_ACCEPTED: list[tuple[str, bytes, dict[str, bytes | str]]] = [
    ("no end-of-archive blocks", raw_file(b"a", b"A"), {"a": b"A"}),
    ("zeros after the end", raw_file(b"a", b"A") + END + bytes(9 * 1024), {"a": b"A"}),
    ("a long name in ustar's prefix", tar_in(tarfile.USTAR_FORMAT, file("p" * 90 + "/n", b"N")),
     {"p" * 90: "dir", "p" * 90 + "/n": b"N"}),
    ("GNU long name", tar_in(tarfile.GNU_FORMAT, file(LONG, b"L")), {"d": "dir", LONG: b"L"}),
    ("GNU long link target", tar_in(tarfile.GNU_FORMAT, symlink("l", "t" * 200)),
     {"l": "-> " + "t" * 200}),
    ("pax path", pax({"path": "real"}) + raw_file(b"shown", b"R") + END, {"real": b"R"}),
    ("pax records tarfile does not use", pax({"SCHILY.xattr.user.x": "1", "comment": "c"})
     + raw_file(b"a", b"A") + END, {"a": b"A"}),
    ("hard link to a hard link", tar_of(file("a", b"A"), hardlink("b", "a"), hardlink("c", "b")),
     {"a": b"A", "b": b"A", "c": b"A"}),
    ("hard link to a symbolic link", tar_of(file("a", b"A"), symlink("s", "a"),
     hardlink("h", "s")), {"a": b"A", "h": "-> a", "s": "-> a"}),
    ("a contiguous file", raw_file(b"c", b"C", kind=tarfile.CONTTYPE) + END, {"c": b"C"}),
    ("a v7 file whose name ends in /", header(b"d/", tarfile.AREGTYPE, magic=bytes(8)) + END,
     {"d": "dir"}),
    ("a name that is not UTF-8", raw_file(b"caf\xe9", b"E") + END, {"caf\udce9": b"E"}),
    ("a size in base-256", header(b"a", size_field=b"\x80" + bytes(10) + b"\x01")
     + padded(b"B") + END, {"a": b"B"}),
]  # fmt: skip


def extracted(root: Path) -> dict[str, bytes | str]:
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = "-> " + os.readlink(path)
        elif path.is_dir():
            found[name] = "dir"
        else:
            found[name] = path.read_bytes()
    return found
