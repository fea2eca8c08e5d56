"""The HTTP API's bodies as pydantic models: requests are validated with them, and the
OpenAPI document (openapi.py) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic.alias_generators import to_camel

from controller.claims.service import MAX_WAIT_SECONDS, ClaimRequest

REQUEST_ID_PATTERN = r"^[A-Za-z0-9_~-]{1,64}$"
POOL_KEY_PATTERN = r"^[^/\s]{1,63}/[^/\s]{1,253}$"
MAX_BATCH = 100
MAX_POOLS = 10


class _Body(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, extra="forbid", frozen=True
    )


class ClaimBody(_Body):
    """Claim one idle, running runner (current template preferred)."""

    inactivity_timeout_seconds: Annotated[StrictInt, Field(gt=0)] | None = Field(
        None,
        description="seconds without keepalive before the claim expires; "
        "default and maximum come from the pool",
    )
    request_id: Annotated[StrictStr, Field(pattern=REQUEST_ID_PATTERN)] | None = Field(
        None,
        description="makes the call idempotent: repeated, it answers the same claim (200); "
        "unique per Nomad namespace, remembered while the claim or its tombstone exists",
    )
    wait_seconds: Annotated[StrictInt | StrictFloat, Field(ge=0, le=MAX_WAIT_SECONDS)] = Field(
        0, description="how long to wait for a runner when none is idle"
    )
    count: Annotated[StrictInt, Field(ge=1, le=MAX_BATCH)] | None = Field(
        None,
        description="claim this many runners of one pool, all or nothing; the answer is "
        '{"claims": [...]} (without count: one claim object)',
    )

    def to_request(self) -> ClaimRequest:
        return ClaimRequest(
            self.inactivity_timeout_seconds, self.request_id, float(self.wait_seconds), self.count
        )


class PoolsClaimBody(ClaimBody):
    """Claim from the first pool of a list that has idle runners (or waits on them all)."""

    pools: Annotated[
        list[Annotated[StrictStr, Field(pattern=POOL_KEY_PATTERN)]],
        Field(min_length=1, max_length=MAX_POOLS),
    ] = Field(description="<namespace>/<name> of each pool, in order of preference")

    @field_validator("pools")
    @classmethod
    def _pools_unique(cls, value: list[str]) -> list[str]:
        repeated = sorted({key for key in value if value.count(key) > 1})
        if repeated:
            raise ValueError(f"pools listed twice: {', '.join(repeated)}")
        return value


class Claim(_Body):
    runner_id: str
    pool: str = Field(description="<namespace>/<name>")
    allocation_id: str
    node_name: str
    claimed_at: str = Field(json_schema_extra={"format": "date-time"})
    expires_at: str = Field(json_schema_extra={"format": "date-time"})
    inactivity_timeout_seconds: int
    request_id: str | None
    ports: dict[str, int] = Field(description="container port -> host port")
    node_draining: bool = Field(description="the runner's node is being drained")
    drain_deadline: str | None = Field(
        json_schema_extra={"format": "date-time"},
        description="when the drain stops the runner's allocation (null: no deadline)",
    )


class ClaimList(_Body):
    claims: list[Claim]


class ClaimAnswer(RootModel[Claim | ClaimList]):
    """A claim; for a request with `count`, {"claims": [...]}."""


class PoolSpecSummary(_Body):
    idle_runners: int
    max_runners: int


class PoolSummary(_Body):
    namespace: str
    name: str
    spec: PoolSpecSummary
    status: dict[str, Any] = Field(description="the RunnerPool status (docs/reference.md)")


class PoolList(_Body):
    pools: list[PoolSummary]


class ErrorDetail(_Body):
    code: str
    message: str
    reason: str | None = Field(None, description="RunnerGone: why the runner is gone")


class ErrorBody(_Body):
    error: ErrorDetail
