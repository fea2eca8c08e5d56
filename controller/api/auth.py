"""API bearer tokens and their scopes: every `/v1` route needs a token (unless
--insecure-no-auth), and a token may be limited to some pools.

A line of a token file (or of POOLKEEPER_API_TOKENS) is `TOKEN` (every pool) or
`TOKEN SCOPE[,SCOPE...]`, a SCOPE being a glob over pool keys `<namespace>/<name>`
(`default/python-*`, `team-a/*`). Blank lines and lines starting with `#` are ignored.
"""

from __future__ import annotations

import fnmatch
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from controller.errors import ErrorCode, ServiceError


class TokenFileError(ValueError):
    """A line of a token file that is not `TOKEN [SCOPE,...]`."""


@dataclass(frozen=True, slots=True)
class Scope:
    """The pools a token may act on; no globs means every pool."""

    globs: tuple[str, ...] = ()

    def allows(self, pool_key: str) -> bool:
        return not self.globs or any(fnmatch.fnmatchcase(pool_key, g) for g in self.globs)

    def require(self, pool_key: str) -> None:
        """Raise 403 Forbidden for a pool outside the scope; nothing has been done yet."""
        if not self.allows(pool_key):
            raise ServiceError(ErrorCode.FORBIDDEN, f"this token may not act on pool {pool_key}")


EVERY_POOL = Scope()
SCOPE_KEY: web.RequestKey[Scope] = web.RequestKey("scope", Scope)


@dataclass(frozen=True, slots=True)
class Token:
    secret: bytes
    scope: Scope


def parse_token_lines(text: str, source: str) -> list[Token]:
    tokens: list[Token] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split()
        if len(parts) > 2:
            raise TokenFileError(f"{source} line {number}: expected TOKEN [SCOPE,SCOPE...]")
        globs = tuple(g for g in parts[1].split(",") if g) if len(parts) == 2 else ()
        for glob in globs:
            if "/" not in glob:
                raise TokenFileError(
                    f"{source} line {number}: scope {glob!r} is not <namespace>/<name> "
                    "(globs allowed, e.g. default/python-*)"
                )
        tokens.append(Token(parts[0].encode(), Scope(globs)))
    return tokens


def read_token_file(path: Path) -> list[Token]:
    return parse_token_lines(path.read_text(), str(path))


class TokenSet:
    """API bearer tokens with their scopes; None means --insecure-no-auth."""

    def __init__(self, tokens: Iterable[Token] | None) -> None:
        self._tokens: tuple[Token, ...] | None = None
        self.replace(tokens)

    def replace(self, tokens: Iterable[Token] | None) -> None:
        self._tokens = None if tokens is None else tuple(tokens)

    @property
    def enabled(self) -> bool:
        return self._tokens is not None

    def scope_of(self, presented: str) -> Scope | None:
        """The presented token's scope, or None when it is no token of ours."""
        if self._tokens is None:
            return EVERY_POOL
        candidate = presented.encode()
        # Compare against every token so timing does not tell which one nearly matched.
        found: Scope | None = None
        for token in self._tokens:
            if hmac.compare_digest(candidate, token.secret) and found is None:
                found = token.scope
        return found


def scope(request: web.Request) -> Scope:
    """The scope of the request's token (every pool without authentication)."""
    found: Scope = request.get(SCOPE_KEY, EVERY_POOL)
    return found


def auth_middleware(tokens: TokenSet, open_paths: frozenset[str] = frozenset()) -> Middleware:
    """`open_paths`: route templates under /v1 that check a credential of their own
    (an execution's stream: its ID)."""

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None and resource.canonical in open_paths:
            return await handler(request)
        if request.path.startswith("/v1/") or request.path == "/v1":
            request[SCOPE_KEY] = authorized(tokens, request)
        return await handler(request)

    return authenticate


def authorized(tokens: TokenSet, request: web.Request) -> Scope:
    """The scope of the request's bearer token; 401 without a valid one."""
    if not tokens.enabled:
        return EVERY_POOL
    header = request.headers.get("Authorization", "")
    kind, _, presented = header.partition(" ")
    found = tokens.scope_of(presented.strip()) if kind.lower() == "bearer" else None
    if found is None:
        raise ServiceError(ErrorCode.UNAUTHORIZED, "a valid bearer token is required")
    return found
