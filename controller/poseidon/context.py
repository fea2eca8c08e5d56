"""What every route of the Poseidon API is served from, its settings, and how the
errors of poolkeeper's services read in Poseidon's words."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

from aiohttp import web

from controller.api.auth import EVERY_POOL, Scope, TokenSet, scope
from controller.claims.outcomes import ClaimOutcome
from controller.claims.runners import RunnerClaims
from controller.claims.service import ClaimService
from controller.core.environments import Environment
from controller.directory.view import PoolDirectory, PoolEntry
from controller.errors import ErrorCode as ServiceCode
from controller.errors import ServiceError
from controller.executions.files import FileOperations
from controller.executions.manager import ExecutionManager
from controller.poseidon.environments import described, environment_pools
from controller.poseidon.wire import ErrorCode, PoseidonError, bad_request
from controller.sources.environments import EnvironmentStore

PREFIX: Final = "/api/v1"
# Poseidon's texts, which its client may match.
NO_RUNNER: Final = "abstract manager wrapped: no runner found with this id"
NO_ENVIRONMENT: Final = "nomad wrapped: execution environment not found"
NO_IDLE_RUNNER: Final = "no runners available for this execution environment"
NO_FILE: Final = "file not found or insufficient permissions"
NO_EXECUTION: Final = "execution id unknown"


class EnvironmentMode(StrEnum):
    """What `PUT` and `DELETE /execution-environments/{id}` may do."""

    READONLY = "readonly"  # pools come from the files or resources; PUT only checks them
    MANAGED = "managed"  # PUT and DELETE keep environments in Nomad, a pool each


@dataclass(frozen=True)
class PoseidonSettings:
    enabled: bool = False
    environments: EnvironmentMode = EnvironmentMode.READONLY
    # /health is 503 when an environment's idle runners fall below this share of its
    # prewarming pool size; 0 never (Poseidon's default).
    depleting_threshold: float = 0.0
    # managed: the RunnerPool document every environment's pool starts from.
    environment_template: Path | None = None


@dataclass(frozen=True)
class Poseidon:
    """What the routes are served from."""

    directory: PoolDirectory
    claims: ClaimService
    runners: RunnerClaims
    tokens: TokenSet
    settings: PoseidonSettings
    store: EnvironmentStore | None  # managed environments (None: readonly)
    executions: ExecutionManager
    files: FileOperations

    def serving(self, visible: Scope = EVERY_POOL) -> dict[int, PoolEntry]:
        """Environment ID -> its pool; NomadUnavailable rather than what was read before
        Nomad went away."""
        why = self.directory.available()
        if why is not None:
            raise ServiceError(ServiceCode.NOMAD_UNAVAILABLE, why)
        store = self.store
        if store is None:
            return environment_pools(self.directory, frozenset(), visible)
        store.forget_gone(self.directory.pools.keys())
        serving = environment_pools(self.directory, store.keys, visible)
        return {env_id: view for env_id, view in serving.items() if not store.gone(view.key)}

    def environments(self, visible: Scope = EVERY_POOL) -> dict[int, Environment]:
        """Environment ID -> the environment, as the pools serving them describe them; a
        managed one as this process last wrote or read it, whether its pool runs yet or
        not (a replica reads its own writes at once)."""
        serving = self.serving(visible)
        found = {env_id: described(view) for env_id, view in serving.items()}
        if self.store is not None:
            for env_id, environment in self.store.stored().items():
                view = serving.get(env_id)
                key = self.store.template.key(env_id)
                if (view is None or self.is_managed(view)) and visible.allows(key):
                    found[env_id] = environment
        return dict(sorted(found.items()))

    def is_managed(self, view: PoolEntry) -> bool:
        return self.store is not None and view.key in self.store.keys


POSEIDON_KEY: Final = web.AppKey("poseidon", Poseidon)


def poseidon(request: web.Request) -> Poseidon:
    return request.app[POSEIDON_KEY]


# Poseidon's own words for some claim outcomes (others say the service's message).
_CLAIM_TEXTS: Final = {
    ClaimOutcome.EMPTY: NO_IDLE_RUNNER,
    ClaimOutcome.UNKNOWN_POOL: NO_ENVIRONMENT,
    ClaimOutcome.RUNNER_GONE: NO_RUNNER,
}


def from_service_error(error: ServiceError) -> PoseidonError:
    """A service error as Poseidon answers the same situation: a claim's outcome as
    claims/outcomes.py says, the rest here."""
    outcome = ClaimOutcome.for_code(error.code)
    if outcome is not None:
        answers = outcome.answers
        code = ErrorCode(answers.poseidon_code) if answers.poseidon_code else None
        text = _CLAIM_TEXTS.get(outcome, error.message)
        return PoseidonError(answers.poseidon_status, text, code)
    match error.code:
        case ServiceCode.RUNNER_NOT_FOUND:
            return PoseidonError(410, NO_RUNNER)
        case ServiceCode.FILE_NOT_FOUND:
            return PoseidonError(424, NO_FILE)
        case ServiceCode.EXECUTION_NOT_FOUND:
            return PoseidonError(404, NO_EXECUTION)
        case ServiceCode.PAYLOAD_TOO_LARGE:
            return PoseidonError(413, error.message)
        case ServiceCode.REQUEST_TIMEOUT:
            return bad_request(error.message)
        case ServiceCode.TOO_MANY_EXECUTIONS:
            return PoseidonError(409, error.message)
        case _:
            return PoseidonError(500, error.message, ErrorCode.UNKNOWN)


async def claimed_runner(request: web.Request) -> str:
    """The route's runner: claimed, unexpired, of an environment the token sees; 410 with
    Poseidon's text otherwise."""
    runner_id = request.match_info["runnerId"]
    context = poseidon(request)
    try:
        view = context.runners.pool_of_runner(runner_id)
        if (
            view.pool is None
            or view.pool.poseidon_environment is None
            or not scope(request).allows(view.key)
        ):
            raise PoseidonError(410, NO_RUNNER)
        claim = await context.runners.get(runner_id)
    except ServiceError as error:
        raise from_service_error(error) from None
    if claim.is_expired(context.directory.clock()):
        raise PoseidonError(410, NO_RUNNER)  # expired: its end is being written down
    return runner_id
