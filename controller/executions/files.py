"""Files in a claimed runner: upload, list and download, each one exec on the runner task.

The files land in (and come from) the task's own filesystem, as an execution sees it,
which for a Docker task is not Nomad's allocation directory: that is why this is exec
and `tar`, `find`, `stat` and `cat` (commands.py), not Nomad's client filesystem API.
Every request is activity on the runner's claim; every path is checked (commands.py,
archives.py) before anything runs, so a refused request writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field

from controller.errors import ErrorCode, ServiceError
from controller.executions.activity import Activity, Target
from controller.executions.archives import (
    Spool,
    UploadedFile,
    build_archive,
    checked_copy,
    decoded_size,
)
from controller.executions.commands import (
    EXIT_MISSING,
    EXIT_NO_WORKING_DIR,
    EXIT_NOT_REGULAR,
    FileEntry,
    InvalidValue,
    RunnerPath,
    download_command,
    kill_command,
    list_command,
    parse_download_head,
    parse_listing,
    runner_path,
    upload_command,
)
from controller.metrics import Metrics
from controller.nomad.errors import NomadUnavailable
from controller.nomad.exec import ExecError, ExecSession, NomadExec
from controller.nomad.jobs import TASK_NAME

log = logging.getLogger(__name__)

# A file request whose exec has not ended by then is given up (502).
OPERATION_SECONDS = 300.0
LISTING_LIMIT = 16 * 1024 * 1024  # bytes of `find` output
STDERR_LIMIT = 4096  # of a failed command, for the error message
FIND_PARTIAL = 1  # find's exit code when some entries could not be read
MAX_DELETE_BYTES = 64 * 1024  # of an upload's paths to delete: they travel in the exec's URL
END_SECONDS = 3.0  # for the exec that ends an abandoned download's command


@dataclass(frozen=True)
class Uploads:
    """A JSON upload: deleted first, then directories made, then files written."""

    delete: Sequence[str] = ()
    directories: Sequence[str] = ()
    files: Sequence[tuple[str, str, int]] = ()  # path, base64 content, mode


@dataclass
class _Run:
    exit_code: int | None = None
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)

    def reason(self) -> str:
        text = bytes(self.stderr[:STDERR_LIMIT]).decode("utf-8", "replace").strip()
        return text or f"exit code {self.exit_code}"


class FileOperations:
    def __init__(self, activity: Activity, exec_client: NomadExec, metrics: Metrics) -> None:
        self.activity = activity
        self.exec = exec_client
        self.metrics = metrics

    # ---- uploads --------------------------------------------------------------------------

    def check_uploads(self, runner_id: str, uploads: Uploads) -> tuple[list[RunnerPath], Spool]:
        """The paths to delete and the archive to extract, checked against the pool's
        settings (400 InvalidRequest, 413 PayloadTooLarge) before anything is written."""
        limit = self.activity.spec(runner_id).max_upload_bytes
        total = sum(decoded_size(content) for _, content, _ in uploads.files)
        if total > limit:
            raise ServiceError(
                ErrorCode.PAYLOAD_TOO_LARGE,
                f"the files hold {total} bytes; the pool takes at most {limit} per request",
            )
        delete = [_path(f"delete[{i}]", p, allow_base=False) for i, p in enumerate(uploads.delete)]
        directories = [
            _path(f"directories[{i}]", p, allow_base=False)
            for i, p in enumerate(uploads.directories)
        ]
        files = [
            UploadedFile(_path(f"files[{i}].path", p, allow_base=False), content, mode)
            for i, (p, content, mode) in enumerate(uploads.files)
        ]
        try:
            return delete, build_archive(directories, files)
        except InvalidValue as error:
            raise _invalid(str(error)) from None

    async def upload(
        self,
        runner_id: str,
        delete: Sequence[RunnerPath],
        archive: Spool,
        *,
        own: bool,
        clear: bool = False,
    ) -> None:
        """Delete (with `clear`, first the working directory's contents but dot files),
        then extract `archive`: poolkeeper's own (`own`, from check_uploads) into the
        working directory, or a client's (checked here first)."""
        await self._upload(runner_id, delete, None, archive, own=own, clear=clear)

    @staticmethod
    def extraction_target(into: str | None) -> RunnerPath | None:
        """Where a tar body is to be extracted (None: the working directory), checked
        before the body is read: 400 for a path that cannot be (empty, with NUL, out)."""
        return None if into is None else _path("path", into, allow_base=True)

    async def upload_tar(self, runner_id: str, into: RunnerPath | None, archive: Spool) -> None:
        """Extract a client's tar archive under `into` (default the working directory)."""
        await self._upload(runner_id, (), into, archive, own=False)

    async def _upload(
        self,
        runner_id: str,
        delete: Sequence[RunnerPath],
        into: RunnerPath | None,
        archive: Spool,
        *,
        own: bool,
        clear: bool = False,
    ) -> None:
        checked = archive
        if not own:  # what is extracted is the copy of what the check read
            try:
                checked = await asyncio.to_thread(checked_copy, archive)
            except InvalidValue as error:
                raise _invalid(str(error)) from None
        try:
            async with self._counted(runner_id, "upload") as target:
                argv = upload_command(target.spec.working_dir, delete, into, own=own, clear=clear)
                run = await self._run(target, argv, checked.chunks())
                self._check_exit(run, target, what="the upload")
        finally:
            if checked is not archive:
                checked.close()

    # ---- listing and download -------------------------------------------------------------

    async def listing(
        self, runner_id: str, path: str | None, recursive: bool
    ) -> list[dict[str, object]]:
        return [entry.to_dict() for entry in await self.entries(runner_id, path, recursive)]

    async def entries(self, runner_id: str, path: str | None, recursive: bool) -> list[FileEntry]:
        """The entries below `path` (default the working directory), or `path` itself
        when it is no directory."""
        listed = _path("path", "." if path is None else path, allow_base=True)
        async with self._counted(runner_id, "list") as target:
            argv = list_command(target.spec.working_dir, listed, recursive=recursive)
            run = await self._run(target, argv, (), stdout_limit=LISTING_LIMIT)
            if run.exit_code == FIND_PARTIAL and run.stdout:
                log.info("listing %s of %s is partial: %s", listed.shown, runner_id, run.reason())
            else:
                self._check_exit(run, target, what="the listing", path=listed)
            try:
                return parse_listing(bytes(run.stdout), listed)
            except ValueError as error:
                raise _failed(f"the listing could not be read: {error}") from None

    @contextlib.asynccontextmanager
    async def download(self, runner_id: str, path: str) -> AsyncIterator[Download]:
        """The file's size and its bytes as they come; 404 FileNotFound, 400 for what is
        not a regular file. The exec stays open while the caller streams; a download the
        caller leaves before its end (the client went away) has its command killed."""
        wanted = _path("path", path, allow_base=False)
        async with self._counted(runner_id, "download") as target:
            argv = download_command(target.spec.working_dir, wanted)
            try:
                async with self._session(target, argv) as session:
                    await session.close_stdin()
                    download = Download(session, wanted)
                    if not await download.start():
                        run = _Run(session.exit_code, stderr=download.stderr)
                        self._check_exit(run, target, what="the download", path=wanted)
                    try:
                        yield download
                    finally:
                        if download.left and session.exit_code is None:
                            await self._end(target, download)
            except ExecError as error:
                raise _failed(await self.activity.explain_failure(target, error)) from None

    async def _end(self, target: Target, download: Download) -> None:
        """Kill the `cat` of a download left before its end: closing Nomad's exec does
        not end it, and blocked on its full pipe it would stay until the runner ends."""
        runner_id = target.record.runner_id
        log.info(
            "a download from %s was left after %d of %d bytes: ending its command",
            runner_id,
            download.size - download.left,
            download.size,
        )
        try:
            async with asyncio.timeout(END_SECONDS):
                await self._run(target, kill_command(download.pid, group=False), ())
        except (ServiceError, TimeoutError) as error:
            log.warning("could not end a download's command on %s: %s", runner_id, error)

    # ---- plumbing -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _counted(self, runner_id: str, op: str) -> AsyncIterator[Target]:
        """The runner's claim, moved (the request is activity), for one operation,
        counted in poolkeeper_file_requests_total by how it ended."""
        target = await self.activity.claimed(runner_id)
        result = "error"
        try:
            yield target
            result = "ok"
        except ServiceError as error:
            if error.code is ErrorCode.FILE_NOT_FOUND:
                result = "not_found"
            elif error.code.status < 500:
                result = "rejected"
            raise
        finally:
            self.metrics.file_requests_total.labels(
                pool=target.record.pool, op=op, result=result
            ).inc()

    @contextlib.asynccontextmanager
    async def _session(self, target: Target, argv: list[str]) -> AsyncIterator[ExecSession]:
        try:
            async with self.exec.session(
                target.record.allocation_id, TASK_NAME, argv, namespace=target.record.namespace
            ) as session:
                yield session
        except NomadUnavailable as error:
            raise ServiceError(ErrorCode.NOMAD_UNAVAILABLE, str(error)) from None

    async def _run(
        self,
        target: Target,
        argv: list[str],
        stdin: Iterable[bytes],
        *,
        stdout_limit: int = STDERR_LIMIT,
    ) -> _Run:
        """One exec to its end: `stdin` in, its output kept (at most `stdout_limit`)."""
        run = _Run()
        try:
            async with asyncio.timeout(OPERATION_SECONDS):
                async with self._session(target, argv) as session:
                    sending = asyncio.create_task(_send(session, stdin))
                    try:
                        async for output in session.output():
                            kept = run.stdout if output.stream == "stdout" else run.stderr
                            kept += output.data
                            if len(run.stdout) > stdout_limit:
                                raise _failed(f"the output is larger than {stdout_limit} bytes")
                    finally:
                        sending.cancel()
                        await asyncio.gather(sending, return_exceptions=True)
                    run.exit_code = session.exit_code
        except TimeoutError:
            raise _failed(f"the runner did not answer within {OPERATION_SECONDS:g} s") from None
        except ExecError as error:
            raise _failed(await self.activity.explain_failure(target, error)) from None
        return run

    def _check_exit(
        self, run: _Run, target: Target, *, what: str, path: RunnerPath | None = None
    ) -> None:
        code = run.exit_code
        if code == 0:
            return
        if code == EXIT_MISSING and path is not None:
            raise ServiceError(ErrorCode.FILE_NOT_FOUND, f"no such file or directory: {path.shown}")
        if code == EXIT_NOT_REGULAR and path is not None:
            raise _invalid(f"not a regular file: {path.shown}")
        if code == EXIT_NO_WORKING_DIR:
            raise _failed(f"the working directory {target.spec.working_dir!r} cannot be entered")
        raise _failed(f"{what} failed in the runner: {run.reason()}")


class Download:
    """A download in progress: its command's `pid` and the file's `size` once started,
    then the bytes (`left`: how many are still to come)."""

    def __init__(self, session: ExecSession, path: RunnerPath) -> None:
        self._output = session.output()
        self.path = path
        self.pid = 0
        self.size = 0
        self.left = 0
        self.stderr = bytearray()
        self._first = b""

    async def start(self) -> bool:
        """Read up to the size line; False when the command ended first (an error)."""
        head = b""
        async for output in self._output:
            if output.stream == "stderr":
                self.stderr += output.data
                continue
            head += output.data
            try:
                found = parse_download_head(head)
            except ValueError as error:
                raise _failed(f"the download could not be read: {error}") from None
            if found is not None:
                self.pid, self.size, self._first = found
                self.left = self.size
                return True
        return False

    async def chunks(self) -> AsyncIterator[bytes]:
        """Exactly `size` bytes: bytes a growing file gained are left out; a file that
        shrank while being read is an error (the response, begun, must be aborted)."""
        data = self._first
        while True:
            if data and self.left:
                piece = data[: self.left]
                self.left -= len(piece)
                yield piece
            if not self.left:
                return
            data = b""
            async for output in self._output:
                if output.stream == "stdout":
                    data = output.data
                    break
            else:
                raise _failed(f"{self.path.shown} shrank while it was read")


async def _send(session: ExecSession, chunks: Iterable[bytes]) -> None:
    with contextlib.suppress(ExecError):  # the exec ended: its output says how
        for chunk in chunks:
            await session.send(chunk)
        await session.close_stdin()


def _path(field_name: str, path: str, *, allow_base: bool) -> RunnerPath:
    try:
        checked = runner_path(path)
    except InvalidValue as error:
        raise _invalid(f"{field_name}: {error}") from None
    if not allow_base and checked.shown in (".", "/"):
        raise _invalid(f"{field_name}: must name something below the working directory or /")
    return checked


def _invalid(message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_REQUEST, message)


def _failed(message: str) -> ServiceError:
    return ServiceError(ErrorCode.EXEC_FAILED, message)
