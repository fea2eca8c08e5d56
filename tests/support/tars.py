"""Tar archives as a client would upload them, built in memory."""

from __future__ import annotations

import io
import tarfile

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
