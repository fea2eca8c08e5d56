"""An async facade over python-nomad for the few calls poolkeeper makes.

Threads and sessions: python-nomad is synchronous and built on `requests.Session`, which
is not documented as thread-safe. Every worker thread of a bounded ThreadPoolExecutor
therefore lazily builds its own set of python-nomad endpoint objects sharing one
per-thread Session; the Session keeps its connections alive, so a call costs one HTTP
round trip plus an executor hop. The endpoint objects are built directly rather than
through `nomad.Nomad(...)`, which would fall back to the process environment for the
token, namespace, region and client certificate and so ignore the given NomadConfig.

Retries: reads (and the idempotent purge and unconditional variable delete) are retried
on NomadUnavailable with exponential backoff and jitter. Other writes are retried only
when the failure proves the request had no effect (no connection was made, or Nomad
answered "No cluster leader"). A check-and-set write whose outcome is unknown (timeout
after sending) is not retried: a retry that succeeded the first time would come back as
a conflict and look like a lost race, so the caller gets NomadUnavailable with
`maybe_applied=True` and decides from a fresh read.

Timeouts: the per-call timeout applies to connecting and to each read of the response
(requests' semantics); a call is never abandoned half-way by the event loop, so a write
that returns has really finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any

import nomad.api
import requests
import urllib3.exceptions
from nomad.api.exceptions import BaseNomadException
from nomad.api.status import Leader

from controller.nomad.config import NomadConfig
from controller.nomad.errors import (
    NomadBadRequest,
    NomadConflict,
    NomadError,
    NomadNotFound,
    NomadPermissionDenied,
    NomadUnavailable,
)

log = logging.getLogger(__name__)

OnRequest = Callable[[str, str], None]

_CAS_JOB_PREFIX = "Enforcing job modify index"
_NO_LEADER = "No cluster leader"
_BODY_LIMIT = 500


class _Retry(Enum):
    ALWAYS = "always"  # reads and idempotent writes
    IF_NOT_APPLIED = "if-not-applied"  # other writes
    NEVER = "never"


@dataclass(slots=True, repr=False)  # python-nomad's endpoint reprs include the token
class _Requesters:
    session: requests.Session
    jobs: Any
    job: Any
    allocations: Any
    variable: Any
    variables: Any
    leader: Any


@dataclass(slots=True)
class _Outcome:
    code: str  # for the metrics hook: HTTP status or "error"
    body: Any = None
    next_token: str | None = None
    error: NomadError | None = None
    retryable: bool = True


def _scrub(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, "<redacted>")
    return text


def _never_sent(err: BaseException) -> bool:
    """True when the request cannot have reached Nomad (so any write may be resent)."""
    if isinstance(err, requests.exceptions.ConnectTimeout | requests.exceptions.SSLError):
        return True
    if isinstance(err, requests.exceptions.ConnectionError) and err.args:
        reason = getattr(err.args[0], "reason", None)
        # Connection refused, unreachable, DNS failure: urllib3 never wrote a byte.
        return isinstance(reason, urllib3.exceptions.NewConnectionError)
    return False


def _session(address: str, verify: bool | str) -> tuple[requests.Session, bool | str]:
    """A Session that reads the environment once instead of on every request.

    With `trust_env` on, requests scans the whole process environment for proxy settings
    (and looks for a .netrc) on every call, about a fifth of a call's CPU. Every call of
    this client goes to one address, so the same settings are taken once here: the
    proxies the environment names for that address (HTTP(S)_PROXY, NO_PROXY) and, when
    verification uses the default CA store, REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE as
    requests itself would. A .netrc is no longer consulted: Nomad authenticates with the
    token header, never with basic auth.
    """
    session = requests.Session()
    session.trust_env = False
    session.proxies.update(requests.utils.get_environ_proxies(address))
    if verify is True:
        verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    return session, verify


class NomadClient:
    """Async Nomad calls; see the module docstring for threading and retry rules."""

    def __init__(
        self,
        config: NomadConfig,
        *,
        max_workers: int = 16,
        timeout: float = 10.0,
        on_request: OnRequest | None = None,
        attempts: int = 4,
        backoff_base: float = 0.1,
        backoff_max: float = 2.0,
    ) -> None:
        if max_workers < 1 or attempts < 1 or timeout <= 0:
            raise ValueError("max_workers and attempts must be >= 1, timeout > 0")
        self._config = config
        self._timeout = timeout
        self._on_request = on_request
        self._attempts = attempts
        self._backoff_base = backoff_base
        self._backoff_max = backoff_max
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="nomad-client")
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._sessions_lock = threading.Lock()
        self._closed = False
        if config.skip_verify and config.secure:
            # urllib3 would warn on every request; say it once instead.
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            log.warning("TLS certificate verification is off (NOMAD_SKIP_VERIFY)")

    def __repr__(self) -> str:
        return f"NomadClient(address={self._config.address!r})"

    # -- public API ------------------------------------------------------------------

    async def list_jobs(self, namespace: str, prefix: str = "") -> list[dict[str, Any]]:
        """Job stubs with Meta (`meta=true`) whose ID starts with `prefix`; consistent read."""
        params = {"namespace": namespace, "meta": "true", "prefix": prefix or None}
        return await self._list("jobs", "/v1/jobs", params)

    async def list_allocations(
        self, namespace: str, prefix: str = "", *, job_prefix: str = ""
    ) -> list[dict[str, Any]]:
        """Allocation stubs with task states; consistent read.

        `prefix` is Nomad's `prefix` parameter, which matches allocation IDs. To select
        the allocations of a pool's jobs, pass `job_prefix` (filtered here on JobID, so it
        works against any server without go-bexpr filters).
        """
        params = {"namespace": namespace, "task_states": "true", "prefix": prefix or None}
        allocs = await self._list("allocations", "/v1/allocations", params)
        if job_prefix:
            allocs = [a for a in allocs if str(a.get("JobID", "")).startswith(job_prefix)]
        return allocs

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
            "POST", "/v1/jobs", "jobs", (), params, json=body, retry=_Retry.IF_NOT_APPLIED
        )
        return dict(outcome.body or {})

    async def purge_job(self, job_id: str, namespace: str) -> None:
        """Stop and purge a job; a job that is already gone is success."""
        params = {"namespace": namespace, "purge": "true"}
        with contextlib.suppress(NomadNotFound):
            await self._call("DELETE", "/v1/job/:id", "job", (job_id,), params, retry=_Retry.ALWAYS)

    async def list_variables(self, prefix: str, namespace: str) -> list[dict[str, Any]]:
        """Variable metadata (no Items) under `prefix`; consistent read."""
        params = {"namespace": namespace, "prefix": prefix or None}
        return await self._list("variables", "/v1/vars", params)

    async def read_variable(self, path: str, namespace: str) -> dict[str, Any] | None:
        """The variable at `path` with its Items, or None when it does not exist."""
        try:
            outcome = await self._call(
                "GET", "/v1/var/:path", "variable", (path,), {"namespace": namespace}
            )
        except NomadNotFound:
            return None
        return dict(outcome.body)

    async def put_variable(
        self, path: str, items: dict[str, str], namespace: str, *, cas: int
    ) -> dict[str, Any]:
        """Check-and-set write (`cas=0`: must not exist). Returns the stored variable with
        its new ModifyIndex; a lost check raises NomadConflict with `.current`."""
        body = {"Namespace": namespace, "Path": path, "Items": items}
        params = {"namespace": namespace, "cas": str(cas)}
        outcome = await self._call(
            "PUT", "/v1/var/:path", "variable", (path,), params, json=body,
            retry=_Retry.IF_NOT_APPLIED,
        )  # fmt: skip
        return dict(outcome.body)

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
                "DELETE", "/v1/var/:path", "variable", (path,), params, retry=retry,
                parse=False,
            )  # fmt: skip

    async def leader(self) -> str:
        """The leader's RPC address: a cheap reachability probe, tried once."""
        outcome = await self._call("GET", "/v1/status/leader", "leader", (), {}, retry=_Retry.NEVER)
        return str(outcome.body)

    async def close(self) -> None:
        """Wait for calls in flight, then close every connection."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._executor.shutdown, True)
        with self._sessions_lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

    # -- plumbing ----------------------------------------------------------------------

    async def _list(
        self, requester: str, template: str, params: dict[str, Any]
    ) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        next_token: str | None = None
        while True:
            page_params = dict(params)
            if next_token:
                page_params["next_token"] = next_token
            # Each page is retried on its own, so a blip on page 5 does not restart the list.
            outcome = await self._call("GET", template, requester, (), page_params)
            items.extend(outcome.body or [])
            next_token = outcome.next_token
            if not next_token:
                return items

    async def _call(
        self,
        method: str,
        template: str,
        requester: str,
        path: tuple[str, ...],
        params: dict[str, Any],
        *,
        json: Any = None,
        retry: _Retry = _Retry.ALWAYS,
        parse: bool = True,
    ) -> _Outcome:
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            attempt += 1
            try:
                outcome = await loop.run_in_executor(
                    self._executor,
                    self._send,
                    method,
                    template,
                    requester,
                    path,
                    dict(params),
                    json,
                    parse,
                )
            except RuntimeError as exc:  # executor shut down
                raise NomadUnavailable(f"{method} {template}: client closed") from exc
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

    def _may_retry(self, error: NomadError, outcome: _Outcome, retry: _Retry, attempt: int) -> bool:
        if attempt >= self._attempts or not outcome.retryable:
            return False
        if not isinstance(error, NomadUnavailable) or retry is _Retry.NEVER:
            return False
        return retry is _Retry.ALWAYS or not error.maybe_applied

    def _report(self, template: str, code: str) -> None:
        if self._on_request is None:
            return
        try:
            self._on_request(template, code)
        except Exception:  # a metrics hook must never fail a Nomad call
            log.exception("on_request hook failed")

    def _requesters(self) -> _Requesters:
        found: _Requesters | None = getattr(self._local, "requesters", None)
        if found is not None:
            return found
        cfg = self._config
        session, verify = _session(cfg.address, cfg.verify)
        settings: dict[str, Any] = {
            "address": cfg.address,
            "token": cfg.token,
            "timeout": self._timeout,
            "verify": verify,
            "cert": cfg.cert,
            "region": cfg.region,
            # Every call passes its namespace explicitly; never add a default one.
            "namespace": None,
            "session": session,
        }
        made = _Requesters(
            session=session,
            jobs=nomad.api.Jobs(**settings),
            job=nomad.api.Job(**settings),
            allocations=nomad.api.Allocations(**settings),
            variable=nomad.api.Variable(**settings),
            variables=nomad.api.Variables(**settings),
            leader=Leader(**settings),
        )
        with self._sessions_lock:
            self._sessions.append(session)
        self._local.requesters = made
        return made

    def _send(
        self,
        method: str,
        template: str,
        requester: str,
        path: tuple[str, ...],
        params: dict[str, Any],
        json: Any,
        parse: bool,
    ) -> _Outcome:
        """Runs in a worker thread: one HTTP request, never raises for Nomad errors."""
        where = f"{method} {template}"
        token = self._config.token
        try:
            endpoint = getattr(self._requesters(), requester)
            response = endpoint.request(
                *path, method=method.lower(), params=params, json=json, timeout=self._timeout
            )
        except BaseNomadException as exc:
            return self._failure(where, exc.nomad_resp)
        except requests.RequestException as exc:  # python-nomad wraps these; be safe
            return self._failure(where, exc)
        code = str(response.status_code)
        body: Any = None
        if parse:
            try:
                body = response.json()
            except ValueError:
                text = _scrub(response.text[:_BODY_LIMIT], token)
                return _Outcome(code, error=NomadUnavailable(f"{where}: not JSON: {text!r}"))
        next_token = response.headers.get("X-Nomad-NextToken") or None
        return _Outcome(code, body=body, next_token=next_token)

    def _failure(self, where: str, cause: Any) -> _Outcome:
        token = self._config.token
        if isinstance(cause, requests.Response):
            return self._http_failure(where, cause)
        detail = _scrub(f"{type(cause).__name__}: {cause}", token)[:_BODY_LIMIT]
        if isinstance(cause, requests.exceptions.SSLError):
            # A certificate problem does not go away by retrying.
            err = NomadUnavailable(f"{where}: TLS failed ({detail})", maybe_applied=False)
            return _Outcome("error", error=err, retryable=False)
        err = NomadUnavailable(
            f"{where}: cannot reach Nomad at {self._config.address} ({detail})",
            maybe_applied=not _never_sent(cause),
        )
        return _Outcome("error", error=err)

    def _http_failure(self, where: str, response: requests.Response) -> _Outcome:
        status = response.status_code
        code = str(status)
        text = _scrub(response.text, self._config.token)
        message = f"{where}: {status} {text[:_BODY_LIMIT].strip()}"
        error: NomadError
        if status == 409:
            try:
                current = response.json()
            except ValueError:
                current = None
            error = NomadConflict(
                message, status=status, current=current if isinstance(current, dict) else None
            )
        elif status == 400:
            error = NomadBadRequest(message, status=status)
        elif status == 403:
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
        return _Outcome(code, error=error)
