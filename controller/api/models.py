"""The HTTP API's bodies as pydantic models: requests are validated with them, and the
OpenAPI document (openapi.py) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from pydantic.alias_generators import to_camel

from controller.claims.service import MAX_WAIT_SECONDS, ClaimRequest

REQUEST_ID_PATTERN = r"^[A-Za-z0-9_~-]{1,64}$"


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

    def to_request(self) -> ClaimRequest:
        return ClaimRequest(
            self.inactivity_timeout_seconds, self.request_id, float(self.wait_seconds)
        )


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


class ClaimList(_Body):
    claims: list[Claim]


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
