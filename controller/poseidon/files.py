"""A runner's files as Poseidon serves them, on poolkeeper's file operations: the list
in Poseidon's `FileHeader` fields, `PATCH` (delete, then copy) and the raw download.

Every request is activity on the runner's claim (its inactivity timer starts again), as
Poseidon's are. A path the list or the download cannot serve (missing, unreadable, or
leaving the working directory) is Poseidon's 424.
"""

from __future__ import annotations

import base64
import stat
from typing import Any, Final

from aiohttp import web

from controller.core.gojson import go_bool
from controller.errors import ErrorCode as ServiceCode
from controller.errors import ServiceError
from controller.executions.commands import FileEntry
from controller.executions.files import MAX_DELETE_BYTES, Uploads
from controller.executions.streaming import json_upload_limit, read_stream, send_download
from controller.poseidon.context import NO_FILE, claimed_runner, poseidon
from controller.poseidon.wire import (
    UPDATE_FILE_SYSTEM_REQUEST,
    PoseidonError,
    answer,
    bad_request,
    decoded,
)

# Poseidon's `delete` entry that is a shell glob, not a path: the working directory's
# contents but dot files.
EVERYTHING: Final = "./*"
# What Poseidon's tar gives copied files (directories get archives.DIRECTORY_MODE, 1777,
# as Poseidon's do).
FILE_MODE: Final = 0o744
# find's type letters as `ls -l` shows them (only a regular file differs).
_ENTRY_TYPES: Final = {"f": "-"}


async def list_files(request: web.Request) -> web.Response:
    runner_id = await claimed_runner(request)
    path = request.query.get("path") or "./"
    recursive = _bool_or(request.query.get("recursive", ""), True)
    try:
        entries = await poseidon(request).files.entries(runner_id, path, recursive)
    except ServiceError as error:
        raise _unreadable(error) from None
    headers = [file_header(e, path, recursive) for e in entries if not _hidden(e.below)]
    return answer({"files": headers})


def file_header(entry: FileEntry, path: str, recursive: bool) -> dict[str, Any]:
    """Poseidon's FileHeader of an entry of the listing of `path` (as the client gave
    it): recursive names are `path/` and the name below it, as `ls -R` prints them
    (`./exercise.py` for `./`); others the bare name; the listed path itself as given."""
    if not entry.below:
        name = path
    elif recursive:
        name = (path if path.endswith("/") else path + "/") + entry.below
    else:
        name = entry.below
    header: dict[str, Any] = {"name": name, "entryType": _ENTRY_TYPES.get(entry.kind, entry.kind)}
    if entry.link_target:
        header["linkTarget"] = entry.link_target
    header |= {
        "size": entry.size,
        "modificationTime": entry.modified_epoch,
        "permissions": stat.filemode(int(entry.mode, 8))[1:],
        "owner": entry.owner,
        "group": entry.group,
    }
    return header


def _hidden(below: str) -> bool:
    """Whether `ls` (without `-a`) leaves the entry out: it or a directory above it is
    a dot file."""
    return any(part.startswith(".") for part in below.split("/") if part)


async def patch_files(request: web.Request) -> web.Response:
    runner_id = await claimed_runner(request)
    files = poseidon(request).files
    raw = bytearray()
    await read_stream(
        request, json_upload_limit(files.activity.spec(runner_id).max_upload_bytes), raw.extend
    )
    body = decoded(bytes(raw), UPDATE_FILE_SYSTEM_REQUEST)
    delete = [path for path in body["delete"] or () if path != EVERYTHING]
    if sum(len(path.encode()) for path in delete) > MAX_DELETE_BYTES:
        raise bad_request(f"the paths to delete must take at most {MAX_DELETE_BYTES} bytes")
    directories, written = [], []
    for copy in body["copy"] or ():
        path = copy["path"]
        if path.endswith("/"):
            directories.append(path)
        else:
            written.append((path, base64.b64encode(copy["content"] or b"").decode(), FILE_MODE))
    uploads = Uploads(delete=delete, directories=directories, files=written)
    removed, archive = files.check_uploads(runner_id, uploads)
    try:
        clear = EVERYTHING in (body["delete"] or ())
        await files.upload(runner_id, removed, archive, own=True, clear=clear)
    finally:
        archive.close()
    return web.Response(status=204)


async def download_file(request: web.Request) -> web.StreamResponse:
    runner_id = await claimed_runner(request)
    path = request.query.get("path", "")
    try:
        async with poseidon(request).files.download(runner_id, path) as download:
            # The name as given, as Poseidon's; a control character could not be sent.
            shown = "".join(c if c >= " " else "_" for c in path)
            disposition = f'attachment; filename="{shown}"'
            return await send_download(request, download, {"Content-Disposition": disposition})
    except ServiceError as error:
        raise _unreadable(error) from None


def _unreadable(error: ServiceError) -> ServiceError | PoseidonError:
    """A path the list or download refused or could not find is Poseidon's 424."""
    if error.code in (ServiceCode.FILE_NOT_FOUND, ServiceCode.INVALID_REQUEST):
        return PoseidonError(424, NO_FILE)
    return error


def _bool_or(raw: str, default: bool) -> bool:
    """A query flag as Poseidon reads it: what strconv.ParseBool cannot parse is
    `default`."""
    try:
        return go_bool(raw)
    except ValueError:
        return default
