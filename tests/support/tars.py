"""Tar archives as a client would upload them, built in memory."""

from __future__ import annotations

import io
import tarfile
from typing import Any

Member = tuple[tarfile.TarInfo, bytes | None]


def tar_of(*members: Member) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def member(
    name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def file(name: str, data: bytes = b"x") -> Member:
    return member(name), data


def directory(name: str) -> Member:
    return member(name, tarfile.DIRTYPE, 0o755), None


def symlink(name: str, target: str) -> Member:
    return member(name, tarfile.SYMTYPE, link=target), None


def hardlink(name: str, target: str) -> Member:
    return member(name, tarfile.LNKTYPE, link=target), None


# ---- archives crafted block by block, as no well-behaved tool writes them ----------------

BLOCK = 512


def header(
    name: bytes,
    kind: bytes = tarfile.REGTYPE,
    *,
    size: int = 0,
    mode: int = 0o644,
    link: bytes = b"",
    magic: bytes = b"ustar\x0000",
    checksum_off_by: int = 0,
    size_field: bytes | None = None,
    extra: dict[int, bytes] | None = None,
) -> bytes:
    """One 512-byte header block (ustar unless `magic` says GNU's "ustar  \\0"): fields
    as given, its checksum right unless `checksum_off_by`; `size_field` replaces the size
    as it is written, `extra` writes bytes at offsets (GNU's sparse map)."""
    block = bytearray(BLOCK)
    block[0:100] = name[:100].ljust(100, b"\0")
    block[100:108] = b"%07o\0" % mode
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[124:136] = size_field if size_field is not None else b"%011o\0" % size
    block[136:148] = b"%011o\0" % 1_700_000_000
    block[156:157] = kind
    block[157:257] = link[:100].ljust(100, b"\0")
    block[257:265] = magic
    for offset, value in (extra or {}).items():
        block[offset : offset + len(value)] = value
    block[148:156] = b" " * 8
    checksum = sum(block) + checksum_off_by
    block[148:156] = b"%06o\0 " % checksum
    return bytes(block)


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BLOCK)


def raw_file(name: bytes, data: bytes = b"x", **fields: Any) -> bytes:
    return header(name, size=len(data), **fields) + padded(data)


def gnu_long(value: bytes, kind: bytes = tarfile.GNUTYPE_LONGNAME) -> bytes:
    """GNU's `././@LongLink` member: the next member's name (L) or link target (K)."""
    return raw_file(b"././@LongLink", value + b"\0", kind=kind, magic=b"ustar  \0")


def pax(records: dict[str, str], kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A pax extended header (x: the next member's; g: every following member's)."""
    text = b""
    for key, value in records.items():
        record = f" {key}={value}\n".encode()
        length = len(record) + 1
        while len(str(length).encode()) + len(record) != length:
            length += 1
        text += str(length).encode() + record
    return raw_file(b"PaxHeader/x", text, kind=kind)


END = bytes(2 * BLOCK)
