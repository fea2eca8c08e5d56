"""An allocation directory as the client's fs API reads it: the path rules, AllocFileInfo
(Go's file modes and times), content sniffing, and Go's texts for what goes wrong."""

from __future__ import annotations

import os
import posixpath
import stat
import time
from typing import BinaryIO

from controller.lab.simulator.util import JSON

ESCAPES = "Path escapes the alloc directory"
NO_SUCH_FILE = "no such file or directory"  # Nomad answers 404 for an error that says this
_VIRTUAL = "/alloc-dir/alloc-id"  # where Nomad puts the root for its relative-path check
_SNIFF_LEN = 512
# Go's os.FileMode type letters, highest bit first, and the st_mode bits behind them.
_MODE_LETTERS = (
    ("d", stat.S_ISDIR),
    ("L", stat.S_ISLNK),
    ("D", lambda m: stat.S_ISBLK(m) or stat.S_ISCHR(m)),
    ("p", stat.S_ISFIFO),
    ("S", stat.S_ISSOCK),
    ("u", lambda m: bool(m & stat.S_ISUID)),
    ("g", lambda m: bool(m & stat.S_ISGID)),
    ("c", stat.S_ISCHR),
    ("t", lambda m: bool(m & stat.S_ISVTX)),
)


class FsError(Exception):
    """What the client's file system reports, in Go's words; the route gives it a code."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def list_dir(base: str, path: str) -> list[JSON]:
    """`ls`: the entries of a directory, sorted by name, links not followed."""
    _check_escape(base, path)
    host = host_path(base, path)
    try:
        names = sorted(os.listdir(host))
    except OSError as exc:
        # Go opens the directory, then reads its entries: a file fails the second step.
        op = "readdirent" if isinstance(exc, NotADirectoryError) else "open"
        raise FsError(_path_error(op, host, exc)) from None
    files = []
    for name in names:
        entry = os.path.join(host, name)
        try:
            files.append(_file_info(name, os.lstat(entry)))
        except OSError as exc:
            raise FsError(_path_error("lstat", entry, exc)) from None
    return files


def stat_path(base: str, path: str) -> JSON:
    """`stat`: one path (links followed), with its sniffed ContentType."""
    _check_escape(base, path)
    host = host_path(base, path)
    try:
        info = os.stat(host)
    except OSError as exc:
        raise FsError(_path_error("stat", host, exc)) from None
    return {**_file_info(os.path.basename(host), info), "ContentType": _content_type(host, info)}


def open_file(base: str, path: str, unreadable: list[tuple[str, str]], offset: int) -> BinaryIO:
    """A file opened at `offset` for cat, readat and stream; each task's secrets and private
    directories are refused (matched case-insensitively, by prefix, as Nomad does)."""
    _check_escape(base, path)
    host = host_path(base, path)
    for kind, directory in unreadable:
        if host.lower().startswith(directory.lower()):
            raise FsError(f"Reading {kind} file prohibited: {path}")
    try:
        file = open(host, "rb")  # noqa: SIM115 (the caller streams it, then closes it)
    except OSError as exc:
        raise FsError(_path_error("open", host, exc)) from None
    if offset < 0:
        file.close()
        # Go formats the int64 offset with %q, which it cannot: that is the text it sends.
        raise FsError(f"can't seek to offset %!q(int64={offset}): seek {host}: invalid argument")
    file.seek(offset)
    return file


def host_path(base: str, path: str) -> str:
    """Go's filepath.Join(base, path): a leading "/" stays under the base."""
    return posixpath.normpath(f"{base}/{path}")


def _check_escape(base: str, path: str) -> None:
    """Nomad's two checks: by the path's own "..", then with links resolved (a path that
    does not exist passes; opening it reports that)."""
    relative = posixpath.relpath(posixpath.normpath(f"{_VIRTUAL}/{path}"), _VIRTUAL)
    if relative.startswith(".."):
        raise FsError(ESCAPES)
    full = host_path(base, path)
    try:
        resolved = os.path.realpath(full, strict=True)
    except FileNotFoundError:
        return
    except OSError as exc:
        where = _path_error("lstat", str(exc.filename or full), exc)
        raise FsError(f"Failed to check if path escapes alloc directory: {where}") from None
    if not resolved.startswith(base):  # a plain prefix test, as Nomad's
        raise FsError(ESCAPES)


def _file_info(name: str, info: os.stat_result) -> JSON:
    return {
        "Name": name,
        "IsDir": stat.S_ISDIR(info.st_mode),
        "Size": info.st_size,
        "FileMode": go_file_mode(info.st_mode),
        "ModTime": go_time(info.st_mtime_ns),
    }


def go_file_mode(mode: int) -> str:
    """Go's os.FileMode.String(): type letters (or "-"), then rwxrwxrwx."""
    letters = "".join(letter for letter, has in _MODE_LETTERS if has(mode))
    perms = "".join(ch if mode & (1 << (8 - i)) else "-" for i, ch in enumerate("rwxrwxrwx"))
    return (letters or "-") + perms


def go_time(ns: int) -> str:
    """A time as Go's JSON writes it: RFC 3339, nanoseconds without trailing zeros, and the
    local offset ("Z" in UTC)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    local = time.localtime(seconds)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", local)
    if fraction:
        stamp += "." + f"{fraction:09d}".rstrip("0")
    offset = local.tm_gmtoff
    if not offset:
        return stamp + "Z"
    sign = "+" if offset > 0 else "-"
    hours, minutes = divmod(abs(offset) // 60, 60)
    return f"{stamp}{sign}{hours:02d}:{minutes:02d}"


def _content_type(host: str, info: os.stat_result) -> str:
    content_type = "application/octet-stream"
    if not stat.S_ISDIR(info.st_mode):
        try:
            with open(host, "rb") as file:
                head = file.read(_SNIFF_LEN)
        except OSError:
            head = b""  # best effort, as in Nomad
        if head:
            content_type = sniff(head)
    if host.endswith(".json"):  # Go's sniffing never says JSON: Nomad names it by suffix
        content_type = "application/json"
    return content_type


def _chunked(kind: bytes, form: bytes, content_type: str) -> tuple[bytes, bytes, bool, str]:
    """A RIFF-style signature: a kind, 4 bytes of length (any), then the form."""
    mask = b"\xff" * 4 + b"\x00" * 4 + b"\xff" * len(form)
    return kind + b"\x00" * 4 + form, mask, False, content_type


# Go's net/http sniffing table (http.DetectContentType) in its order, without its MP4 and
# EOT rules: (signature, mask or None, skip leading whitespace, content type).
_SIGNATURES: tuple[tuple[bytes, bytes | None, bool, str], ...] = (
    (b"<?xml", None, True, "text/xml; charset=utf-8"),
    (b"%PDF-", None, False, "application/pdf"),
    (b"%!PS-Adobe-", None, False, "application/postscript"),
    (b"\xfe\xff", None, False, "text/plain; charset=utf-16be"),
    (b"\xff\xfe", None, False, "text/plain; charset=utf-16le"),
    (b"\xef\xbb\xbf", None, False, "text/plain; charset=utf-8"),
    (b"\x00\x00\x01\x00", None, False, "image/x-icon"),
    (b"\x00\x00\x02\x00", None, False, "image/x-icon"),
    (b"BM", None, False, "image/bmp"),
    (b"GIF87a", None, False, "image/gif"),
    (b"GIF89a", None, False, "image/gif"),
    _chunked(b"RIFF", b"WEBPVP", "image/webp"),
    (b"\x89PNG\r\n\x1a\n", None, False, "image/png"),
    (b"\xff\xd8\xff", None, False, "image/jpeg"),
    _chunked(b"FORM", b"AIFF", "audio/aiff"),
    (b"ID3", None, False, "audio/mpeg"),
    (b"OggS\x00", None, False, "application/ogg"),
    (b"MThd\x00\x00\x00\x06", None, False, "audio/midi"),
    _chunked(b"RIFF", b"AVI ", "video/avi"),
    _chunked(b"RIFF", b"WAVE", "audio/wave"),
    (b"\x1a\x45\xdf\xa3", None, False, "video/webm"),
    (b"\x00\x01\x00\x00", None, False, "font/ttf"),
    (b"OTTO", None, False, "font/otf"),
    (b"ttcf", None, False, "font/collection"),
    (b"wOFF", None, False, "font/woff"),
    (b"wOF2", None, False, "font/woff2"),
    (b"\x1f\x8b\x08", None, False, "application/x-gzip"),
    (b"PK\x03\x04", None, False, "application/zip"),
    (b"Rar!\x1a\x07\x00", None, False, "application/x-rar-compressed"),
    (b"Rar!\x1a\x07\x01\x00", None, False, "application/x-rar-compressed"),
    (b"\x00asm", None, False, "application/wasm"),
)
_HTML_TAGS = (
    b"<!DOCTYPE HTML",
    b"<HTML",
    b"<HEAD",
    b"<SCRIPT",
    b"<IFRAME",
    b"<H1",
    b"<DIV",
    b"<FONT",
    b"<TABLE",
    b"<A",
    b"<STYLE",
    b"<TITLE",
    b"<B",
    b"<BODY",
    b"<BR",
    b"<P",
    b"<!--",
)
_WHITESPACE = b"\t\n\x0c\r "
_BINARY = frozenset([*range(0x00, 0x09), 0x0B, *range(0x0E, 0x1B), *range(0x1C, 0x20)])


def sniff(data: bytes) -> str:
    """Go's http.DetectContentType, as far as _SIGNATURES goes."""
    data = data[:_SNIFF_LEN]
    text = data.lstrip(_WHITESPACE)
    for tag in _HTML_TAGS:
        head = text[: len(tag)]
        if head.upper() == tag and text[len(tag) : len(tag) + 1] in (b" ", b">"):
            return "text/html; charset=utf-8"
    for signature, mask, skip_space, content_type in _SIGNATURES:
        subject = text if skip_space else data
        if len(subject) < len(signature):
            continue
        head = subject[: len(signature)]
        if mask is not None:
            head = bytes(b & m for b, m in zip(head, mask, strict=True))
        if head == signature:
            return content_type
    if any(b in _BINARY for b in text):
        return "application/octet-stream"
    return "text/plain; charset=utf-8"


def _path_error(op: str, path: str, exc: OSError) -> str:
    """Go's *PathError text: "open /x: no such file or directory"."""
    reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
    return f"{op} {path}: {reason}"
