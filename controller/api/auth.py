"""API bearer tokens: every `/v1` route needs one (unless --insecure-no-auth)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from controller.errors import ErrorCode, ServiceError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenSet:
    """API bearer tokens; None means --insecure-no-auth."""

    def __init__(self, tokens: Iterable[str] | None) -> None:
        self._tokens: tuple[bytes, ...] | None = None
        self.replace(tokens)

    def replace(self, tokens: Iterable[str] | None) -> None:
        self._tokens = None if tokens is None else tuple(t.encode() for t in tokens if t)

    @property
    def enabled(self) -> bool:
        return self._tokens is not None

    def allows(self, presented: str) -> bool:
        if self._tokens is None:
            return True
        candidate = presented.encode()
        # Compare against every token so timing does not tell which one nearly matched.
        matched = False
        for token in self._tokens:
            matched |= hmac.compare_digest(candidate, token)
        return matched


def read_token_file(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def auth_middleware(tokens: TokenSet) -> Middleware:
    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        if tokens.enabled and (request.path.startswith("/v1/") or request.path == "/v1"):
            header = request.headers.get("Authorization", "")
            scheme, _, presented = header.partition(" ")
            if scheme.lower() != "bearer" or not tokens.allows(presented.strip()):
                raise ServiceError(ErrorCode.UNAUTHORIZED, "a valid bearer token is required")
        return await handler(request)

    return authenticate
