"""An async Nomad client for the few calls poolkeeper makes, on aiohttp.

Transport: one aiohttp session on the event loop, created on first use, with at most
`max_connections` connections kept alive; a call beyond that waits for a free one. The
event stream (events.py) uses the same TLS context and proxy, so both transports trust
the same servers. The token travels only in the X-Nomad-Token header.

Why not python-nomad: it is synchronous (on `requests`), so every call needed a worker
thread and its own Session, and under a claim burst those threads cost about twice the CPU
of the request itself and competed with the event loop for the GIL (docs/performance.md
has the numbers). python-nomad's own test suite still runs against the simulator.

Retries: reads (and the idempotent purge and unconditional variable delete) are retried
on NomadUnavailable with exponential backoff and jitter. Other writes are retried only
when the failure proves the request had no effect (no connection was made, or Nomad
answered "No cluster leader"). A check-and-set write whose outcome is unknown (timeout
after sending) is not retried: a retry that succeeded the first time would come back as
a conflict and look like a lost race, so the caller gets NomadUnavailable with
`maybe_applied=True` and decides from a fresh read.

Timeouts: `timeout` bounds the wait for a free connection, connecting and each wait for
response data, not the whole call, so a large list that keeps arriving is not cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from controller import __version__
from controller.nomad.config import NomadConfig
from controller.nomad.errors import (
    NomadBadRequest,
    NomadConflict,
    NomadError,
    NomadNotFound,
    NomadPermissionDenied,
    NomadUnavailable,
)
from controller.nomad.port import LockTerms

log = logging.getLogger(__name__)

OnRequest = Callable[[str, str], None]

_CAS_JOB_PREFIX = "Enforcing job modify index"
_NO_LEADER = "No cluster leader"
_BODY_LIMIT = 500


# What each call needs in Nomad's ACL policies, for a 403 to name it (lock operations are
# writes of the variable).
_VARIABLES = "on the poolkeeper/* variables of the namespace"
NEEDED_CAPABILITY = {
    "GET /v1/jobs": "the list-jobs capability",
    "POST /v1/jobs": "the submit-job capability",
    "DELETE /v1/job/:id": "the submit-job capability",
    "GET /v1/job/:id/evaluations": "the read-job capability",
    "GET /v1/allocations": "the read-job capability",
    "GET /v1/nodes": 'node { policy = "read" }',
    "GET /v1/node/:id": 'node { policy = "read" }',
    "GET /v1/vars": f"list {_VARIABLES}",
    "GET /v1/var/:path": f"read {_VARIABLES}",
    "PUT /v1/var/:path": f"write {_VARIABLES}",
    "DELETE /v1/var/:path": f"destroy {_VARIABLES}",
}


class _Retry(Enum):
    ALWAYS = "always"  # reads and idempotent writes
    IF_NOT_APPLIED = "if-not-applied"  # other writes
    NEVER = "never"


@dataclass(slots=True)
class _Outcome:
    code: str  # for the metrics hook: HTTP status or "error"
    body: Any = None
    next_token: str | None = None
    index: int | None = None  # X-Nomad-Index
    error: NomadError | None = None
    retryable: bool = True


@dataclass(frozen=True, slots=True)
class Proxy:
    """The HTTP(S) proxy the environment names for the Nomad address, if any."""

    url: URL | None = None
    auth: aiohttp.BasicAuth | None = None

    @classmethod
    def for_address(cls, address: str) -> Proxy:
        """HTTP_PROXY / HTTPS_PROXY / NO_PROXY, read once: aiohttp's `trust_env` would
        read the whole environment again on every request."""
        try:
            url, auth = get_env_proxy_for_url(URL(address))
        except LookupError:
            return cls()
        return cls(url, auth)


def tls_connector(config: NomadConfig, limit: int = 100) -> aiohttp.TCPConnector:
    """A connector trusting what `config` says (NOMAD_CACERT, NOMAD_SKIP_VERIFY, client
    certificate); shared by the API calls and the event stream."""
    context = config.ssl_context()
    return aiohttp.TCPConnector(limit=limit, ssl=context if context is not None else False)


@dataclass
class NomadSession:
    """The aiohttp session to Nomad, opened at first use, as every connection to it is
    made: `config`'s TLS settings, the token only in X-Nomad-Token, a User-Agent naming
    this process."""

    _config: NomadConfig
    _max_connections: int
    _timeout: aiohttp.ClientTimeout
    _user_agent: str
    _session: aiohttp.ClientSession | None = field(default=None, init=False)

    def get(self) -> aiohttp.ClientSession:
        if self._session is None:
            token = self._config.token
            self._session = aiohttp.ClientSession(
                self._config.address,
                connector=tls_connector(self._config, self._max_connections),
                headers={"User-Agent": self._user_agent}
                | ({"X-Nomad-Token": token} if token else {}),
                timeout=self._timeout,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def report(on_request: OnRequest | None, template: str, code: str) -> None:
    """Tell the metrics hook of a Nomad request; a failing hook never fails the request."""
    if on_request is None:
        return
    try:
        on_request(template, code)
    except Exception:
        log.exception("on_request hook failed")


DEFAULT_USER_AGENT = f"poolkeeper/{__version__}"
_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_LARGE_BODY = 64 * 1024
# Connections a client keeps alive to Nomad (a call beyond them waits for a free one).
DEFAULT_MAX_CONNECTIONS = 16


async def decode_json(raw: bytes) -> Any:
    """`json.loads(raw)`, except that a large body is decoded in a worker thread and an
    array one element at a time.

    A list of a few thousand allocations is megabytes of JSON: one json.loads call held
    the event loop (and the GIL, since the C decoder never lets go of it) for 10 to 40 ms
    in every reconcile pass, and a claim arriving then waited that long. Between two
    elements the interpreter can hand the GIL to the loop thread. Raises ValueError for
    what is not JSON, as json.loads does.
    """
    if len(raw) < _LARGE_BODY:
        return json.loads(raw)
    return await asyncio.to_thread(_decode_large, raw)


def _decode_large(raw: bytes) -> Any:
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads does
    position = _skip_space(text, 0)
    if not text.startswith("[", position):
        return json.loads(text)  # only lists grow large
    items: list[Any] = []
    position = _skip_space(text, position + 1)
    closed = text.startswith("]", position)
    if closed:
        position = _skip_space(text, position + 1)
    while not closed:
        item, position = _DECODER.raw_decode(text, position)
        items.append(item)
        position = _skip_space(text, position)
        separator = text[position : position + 1]
        if separator not in (",", "]"):
            raise ValueError(f"expected ',' or ']' at {position} of a JSON array")
        position = _skip_space(text, position + 1)
        closed = separator == "]"
    if position != len(text):
        raise ValueError(f"extra data after the JSON array at {position}")
    return items


def _skip_space(text: str, position: int) -> int:
    match = _WHITESPACE.match(text, position)
    return match.end() if match else position


# Job prefixes are lowercase letters, digits and "-" (docs/reference.md): literal in Go's
# regular expressions and inside a filter's quoted string, so nothing needs escaping.
_JOB_PREFIX_PATTERN = re.compile(r"[a-z0-9-]+\Z")


def _job_id_filter(job_prefixes: Sequence[str]) -> str:
    """A filter expression for the objects whose JobID starts with one of the prefixes."""
    for prefix in job_prefixes:
        if not _JOB_PREFIX_PATTERN.match(prefix):
            raise ValueError(f"not a job prefix: {prefix!r}")
    alternatives = "|".join(sorted(set(job_prefixes)))
    # An empty alternation would match every job: match none instead.
    return f'JobID matches "^(?:{alternatives})"' if job_prefixes else 'JobID == ""'


class NomadClient:
    """Async Nomad calls; see the module docstring for the transport and retry rules."""

    def __init__(
        self,
        config: NomadConfig,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        timeout: float = 10.0,
        on_request: OnRequest | None = None,
        attempts: int = 4,
        backoff_base: float = 0.1,
        backoff_max: float = 2.0,
        user_agent: str = DEFAULT_USER_AGENT,
    ) -> None:
        """`user_agent` names this process to Nomad (its audit log, a proxy's access log):
        the service puts its lease identity in it."""
        if max_connections < 1 or attempts < 1 or timeout <= 0:
            raise ValueError("max_connections and attempts must be >= 1, timeout > 0")
        self._config = config
        # `connect` also bounds the wait for a free pooled connection.
        self._sessions = NomadSession(
            config,
            max_connections,
            aiohttp.ClientTimeout(
                total=None, connect=timeout, sock_connect=timeout, sock_read=timeout
            ),
            user_agent,
        )
        self._close_wait = timeout
        self._on_request = on_request
        self._attempts = attempts
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._proxy = Proxy.for_address(config.address)
        self._params: dict[str, str] = {"region": config.region} if config.region else {}
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        if config.skip_verify and config.secure:
            log.warning("TLS certificate verification is off (NOMAD_SKIP_VERIFY)")

    def __repr__(self) -> str:
        return f"NomadClient(address={self._config.address!r})"

    # -- public API ------------------------------------------------------------------

    async def list_jobs(self, namespace: str, prefix: str = "") -> list[dict[str, Any]]:
        """The namespace's job stubs with Meta (`meta=true`), only those whose ID starts
        with `prefix` if one is given; consistent read."""
        params = {"namespace": namespace, "meta": "true", "prefix": prefix or None}
        return (await self._list("/v1/jobs", "/v1/jobs", params))[0]

    async def job_evaluations(self, job_id: str, namespace: str) -> list[dict[str, Any]]:
        """A job's evaluations (why a runner was not placed); [] for an unknown job."""
        path = f"/v1/job/{job_id}/evaluations"
        params = {"namespace": namespace}
        outcome = await self._call("GET", "/v1/job/:id/evaluations", path, params)
        return list(outcome.body or [])

    async def list_allocations(
        self, namespace: str, job_prefixes: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """The namespace's allocation stubs with task states; consistent read. With
        `job_prefixes`, only the allocations of jobs whose ID starts with one of them (a
        filter Nomad evaluates, so the rest never crosses the wire)."""
        params = {"namespace": namespace, "task_states": "true"}
        if job_prefixes is not None:
            params["filter"] = _job_id_filter(job_prefixes)
        return (await self._list("/v1/allocations", "/v1/allocations", params))[0]

    async def read_allocation(self, allocation_id: str, namespace: str) -> dict[str, Any] | None:
        """One allocation with its task states and events, or None when it is gone."""
        path = f"/v1/allocation/{allocation_id}"
        try:
            outcome = await self._call("GET", "/v1/allocation/:id", path, {"namespace": namespace})
        except NomadNotFound:
            return None
        return dict(outcome.body)

    async def list_nodes(self) -> list[dict[str, Any]]:
        """The client nodes' stubs (drain and eligibility); consistent read."""
        return (await self._list("/v1/nodes", "/v1/nodes", {}))[0]

    async def read_node(self, node_id: str) -> dict[str, Any] | None:
        """One node with its drain strategy (the deadline), or None when it is gone."""
        try:
            outcome = await self._call("GET", "/v1/node/:id", f"/v1/node/{node_id}", {})
        except NomadNotFound:
            return None
        return dict(outcome.body)

    async def register_job(
        self, job: dict[str, Any], *, enforce_index: int | None = None
    ) -> dict[str, Any]:
        """Register `job`. `enforce_index=0` means it must not exist yet (a retried creation
        can never make a second job); a lost check raises NomadConflict."""
        body: dict[str, Any] = {"Job": job}
        if enforce_index is not None:
            body["EnforceIndex"] = True
            body["JobModifyIndex"] = enforce_index
        namespace = job.get("Namespace")
        params = {"namespace": namespace} if namespace else {}
        outcome = await self._call(
            "POST", "/v1/jobs", "/v1/jobs", params, json=body, retry=_Retry.IF_NOT_APPLIED
        )
        return dict(outcome.body or {})

    async def purge_job(self, job_id: str, namespace: str) -> None:
        """Stop and purge a job; a job that is already gone is success."""
        params = {"namespace": namespace, "purge": "true"}
        with contextlib.suppress(NomadNotFound):
            await self._call(
                "DELETE", "/v1/job/:id", f"/v1/job/{job_id}", params, retry=_Retry.ALWAYS
            )

    async def list_variables(self, prefix: str, namespace: str) -> list[dict[str, Any]]:
        """Variable metadata (no Items) under `prefix`; consistent read."""
        params = {"namespace": namespace, "prefix": prefix or None}
        return (await self._list("/v1/vars", "/v1/vars", params))[0]

    async def wait_variables(
        self, prefix: str, namespace: str, index: int, wait_seconds: float
    ) -> tuple[list[dict[str, Any]], int]:
        """A blocking list: returns once the variables table's index passes `index` (any
        variable's change, in any path), or after `wait_seconds`; the metadata under
        `prefix` and the index to wait from next."""
        params = {
            "namespace": namespace,
            "prefix": prefix or None,
            "index": str(index),
            "wait": f"{wait_seconds:g}s",
        }
        items, seen = await self._list("/v1/vars", "/v1/vars", params)
        return items, seen if seen is not None else index

    async def wait_variable(
        self, path: str, namespace: str, index: int, wait_seconds: float
    ) -> tuple[dict[str, Any] | None, int]:
        """A blocking read: returns once the variable's ModifyIndex passes `index`, or
        after `wait_seconds` (Nomad may add a sixteenth); the variable (None when it does
        not exist) and the index to wait from next."""
        params = {"namespace": namespace, "index": str(index), "wait": f"{wait_seconds:g}s"}
        try:
            outcome = await self._call("GET", "/v1/var/:path", f"/v1/var/{path}", params)
        except NomadNotFound as missing:
            return None, missing.index if missing.index is not None else index
        return dict(outcome.body), outcome.index if outcome.index is not None else index

    async def read_variable(self, path: str, namespace: str) -> dict[str, Any] | None:
        """The variable at `path` with its Items, or None when it does not exist."""
        try:
            outcome = await self._call(
                "GET", "/v1/var/:path", f"/v1/var/{path}", {"namespace": namespace}
            )
        except NomadNotFound:
            return None
        return dict(outcome.body)

    async def put_variable(
        self, path: str, items: dict[str, str], namespace: str, *, cas: int | None
    ) -> dict[str, Any]:
        """Check-and-set write (`cas=0`: must not exist; None: a plain write, whatever is
        there). Returns the stored variable with its new ModifyIndex; a lost check raises
        NomadConflict with `.current`."""
        body = {"Namespace": namespace, "Path": path, "Items": items}
        params = {"namespace": namespace, "cas": None if cas is None else str(cas)}
        return await self._write_variable(path, params, body)

    async def acquire_lock(
        self, path: str, items: dict[str, str], namespace: str, terms: LockTerms
    ) -> dict[str, Any] | None:
        """Take the variable's lock (`?lock-acquire`, Nomad 1.7+) and write `items`. The
        stored variable with its `Lock.ID`, or None when another process holds the lock
        (or it is in its lock delay)."""
        lock = {"TTL": f"{terms.ttl_seconds:g}s", "LockDelay": f"{terms.delay_seconds:g}s"}
        body = {"Namespace": namespace, "Path": path, "Items": items, "Lock": lock}
        try:
            outcome = await self._lock_call(path, namespace, "lock-acquire", body)
        except NomadConflict:
            return None
        return dict(outcome.body)

    async def renew_lock(self, path: str, namespace: str, lock_id: str) -> bool:
        """Renew a held lock; False when it is not ours any more (expired, taken, or gone
        with its variable: a Nomad that lost its state answers 404). Other failures
        raise: the caller fences itself by time."""
        body = {"Namespace": namespace, "Path": path, "Lock": {"ID": lock_id}}
        try:
            await self._lock_call(path, namespace, "lock-renew", body)
        except (NomadConflict, NomadNotFound):
            return False
        except NomadUnavailable as error:
            # Nomad 1.7.0 answered a lost lock with a 500 naming it (in its answer: the
            # message names the lock-renew request too); one without a leader is no answer.
            if error.status == 500 and error.maybe_applied and "lock" in error.body:
                return False
            raise
        return True

    async def release_lock(self, path: str, namespace: str, lock_id: str) -> None:
        """Give a held lock back so that another process takes it at once; a lock that is
        not ours any more is success."""
        body = {"Namespace": namespace, "Path": path, "Lock": {"ID": lock_id}}
        with contextlib.suppress(NomadConflict, NomadNotFound):
            await self._lock_call(path, namespace, "lock-release", body)

    async def write_locked(
        self, path: str, items: dict[str, str], namespace: str, lock_id: str
    ) -> dict[str, Any]:
        """The holder's write of a locked variable's items (the lock is kept)."""
        body = {"Namespace": namespace, "Path": path, "Items": items, "Lock": {"ID": lock_id}}
        return await self._write_variable(path, {"namespace": namespace}, body)

    async def _write_variable(
        self, path: str, params: Mapping[str, str | None], body: dict[str, Any]
    ) -> dict[str, Any]:
        outcome = await self._call(
            "PUT", "/v1/var/:path", f"/v1/var/{path}", params, json=body,
            retry=_Retry.IF_NOT_APPLIED,
        )  # fmt: skip
        return dict(outcome.body)

    async def _lock_call(
        self, path: str, namespace: str, operation: str, body: dict[str, Any]
    ) -> _Outcome:
        # A lock operation changes nothing when it was refused, so only unsent ones retry.
        params = {"namespace": namespace, operation: ""}
        return await self._call(
            "PUT", f"/v1/var/:path?{operation}", f"/v1/var/{path}", params, json=body,
            retry=_Retry.IF_NOT_APPLIED,
        )  # fmt: skip

    async def delete_variable(self, path: str, namespace: str, *, cas: int | None = None) -> None:
        """Delete a variable (with check-and-set when `cas` is given); missing is success."""
        params = {"namespace": namespace}
        if cas is not None:
            params["cas"] = str(cas)
        # Without cas a repeated delete is harmless; with cas a retry that follows an
        # applied delete would report a false conflict, so only provably unsent ones.
        retry = _Retry.ALWAYS if cas is None else _Retry.IF_NOT_APPLIED
        with contextlib.suppress(NomadNotFound):
            await self._call(
                "DELETE", "/v1/var/:path", f"/v1/var/{path}", params, retry=retry, parse=False
            )

    async def leader(self) -> str:
        """The leader's RPC address: a cheap reachability probe, tried once."""
        outcome = await self._call(
            "GET", "/v1/status/leader", "/v1/status/leader", {}, retry=_Retry.NEVER
        )
        return str(outcome.body)

    async def close(self) -> None:
        """Refuse new calls, wait (at most the call timeout) for those in flight, then
        close every connection."""
        if self._closed:
            return
        self._closed = True
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._close_wait):
                    await self._idle.wait()
        finally:
            await self._sessions.close()

    # -- plumbing ----------------------------------------------------------------------

    async def _list(
        self, template: str, path: str, params: Mapping[str, str | None]
    ) -> tuple[list[dict[str, Any]], int | None]:
        """Every page, and the index of the first (a blocking list blocks on it only)."""
        items: list[dict[str, Any]] = []
        next_token: str | None = None
        index: int | None = None
        while True:
            page_params = dict(params)
            if next_token:
                page_params["next_token"] = next_token
                page_params.pop("index", None)
                page_params.pop("wait", None)
            # Each page is retried on its own, so a blip on page 5 does not restart the list.
            outcome = await self._call("GET", template, path, page_params)
            items.extend(outcome.body or [])
            index = outcome.index if index is None else index
            next_token = outcome.next_token
            if not next_token:
                return items, index

    async def _call(
        self,
        method: str,
        template: str,
        path: str,
        params: Mapping[str, str | None],
        *,
        json: Any = None,
        retry: _Retry = _Retry.ALWAYS,
        parse: bool = True,
    ) -> _Outcome:
        if self._closed:
            raise NomadUnavailable(f"{method} {template}: client closed", maybe_applied=False)
        query = {**self._params, **{k: v for k, v in params.items() if v is not None}}
        self._in_flight += 1
        self._idle.clear()
        try:
            attempt = 0
            while True:
                attempt += 1
                outcome = await self._send(method, template, path, query, json, parse)
                self._report(template, outcome.code)
                error = outcome.error
                if error is None:
                    return outcome
                if not self._may_retry(error, outcome, retry, attempt):
                    raise error
                delay = min(self._backoff_max, self._backoff_base * 2 ** (attempt - 1))
                delay = random.uniform(delay / 2, delay)
                log.debug(
                    "%s %s failed (%s); attempt %d of %d in %.2fs",
                    method, template, error, attempt + 1, self._attempts, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    def _may_retry(self, error: NomadError, outcome: _Outcome, retry: _Retry, attempt: int) -> bool:
        if attempt >= self._attempts or not outcome.retryable:
            return False
        if not isinstance(error, NomadUnavailable) or retry is _Retry.NEVER:
            return False
        return retry is _Retry.ALWAYS or not error.maybe_applied

    def _report(self, template: str, code: str) -> None:
        report(self._on_request, template, code)

    async def _send(
        self,
        method: str,
        template: str,
        path: str,
        query: dict[str, str],
        json_body: Any,
        parse: bool,
    ) -> _Outcome:
        """One HTTP request; Nomad's errors come back in the outcome, never raised."""
        where = f"{method} {template}"
        try:
            async with self._sessions.get().request(
                method,
                path,
                params=query,
                json=json_body,
                proxy=self._proxy.url,
                proxy_auth=self._proxy.auth,
                allow_redirects=False,  # Nomad never redirects; a redirect must not get the token
            ) as response:
                status = response.status
                raw = await response.read()
                next_token = response.headers.get("X-Nomad-NextToken") or None
                index_header = response.headers.get("X-Nomad-Index", "")
        except aiohttp.ClientSSLError as exc:
            # A certificate problem does not go away by retrying.
            err = NomadUnavailable(
                f"{where}: TLS failed ({self._describe(exc)})", maybe_applied=False
            )
            return _Outcome("error", error=err, retryable=False)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # Refused, unreachable, DNS failure, connect timeout: not a byte was sent.
            return self._unreachable(where, exc, maybe_applied=False)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            return self._unreachable(where, exc, maybe_applied=True)
        if status >= 300:
            failure = self._http_failure(where, status, raw)
            if failure.error is not None and index_header.isdigit():
                failure.error.index = int(index_header)
            return failure
        body: Any = None
        if parse:
            try:
                body = await decode_json(raw)
            except ValueError:
                text = self._text(raw)[:_BODY_LIMIT]
                return _Outcome(str(status), error=NomadUnavailable(f"{where}: not JSON: {text!r}"))
        index = int(index_header) if index_header.isdigit() else None
        return _Outcome(str(status), body=body, next_token=next_token, index=index)

    def _describe(self, exc: BaseException) -> str:
        return self._config.redact(f"{type(exc).__name__}: {exc}")[:_BODY_LIMIT]

    def _text(self, raw: bytes) -> str:
        return self._config.redact(raw.decode("utf-8", "replace"))

    def _unreachable(self, where: str, exc: BaseException, *, maybe_applied: bool) -> _Outcome:
        err = NomadUnavailable(
            f"{where}: cannot reach Nomad at {self._config.address} ({self._describe(exc)})",
            maybe_applied=maybe_applied,
        )
        return _Outcome("error", error=err)

    def _http_failure(self, where: str, status: int, raw: bytes) -> _Outcome:
        code = str(status)
        text = self._text(raw)
        body = text[:_BODY_LIMIT].strip()
        message = f"{where}: {status} {body}"
        error: NomadError
        if status == 409:
            try:
                current = json.loads(raw)
            except ValueError:
                current = None
            error = NomadConflict(
                message, status=status, current=current if isinstance(current, dict) else None
            )
        elif status == 400:
            error = NomadBadRequest(message, status=status)
        elif status == 403:
            needs = NEEDED_CAPABILITY.get(where.split("?")[0])
            if needs:
                message += f" (the Nomad token needs {needs}: see examples/nomad-policy.hcl)"
            error = NomadPermissionDenied(message, status=status)
        elif status == 404:
            error = NomadNotFound(message, status=status)
        elif _CAS_JOB_PREFIX in text:
            error = NomadConflict(message, status=status)
        elif _NO_LEADER in text or status == 429:
            # Refused before anything was applied: safe to resend even a write.
            error = NomadUnavailable(message, status=status, maybe_applied=False)
        elif status >= 500:
            error = NomadUnavailable(message, status=status)
        else:
            error = NomadError(message, status=status)
        error.body = body
        return _Outcome(code, error=error)
