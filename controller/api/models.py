"""The HTTP API's bodies as pydantic models: requests are validated with them, and the
OpenAPI document (openapi.py) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)
from pydantic.alias_generators import to_camel

from controller.claims.service import MAX_WAIT_SECONDS, ClaimRequest
from controller.core.gojson import BASE64_PATTERN
from controller.executions.commands import BELOW_PATTERN, ENV_NAME_PATTERN, PATH_PATTERN
from controller.executions.files import MAX_DELETE_BYTES, Uploads
from controller.executions.manager import ExecutionRequest
from controller.model import INT32_MAX, MAX_PATH_LENGTH

REQUEST_ID_PATTERN = r"^[A-Za-z0-9_~-]{1,64}$"
# No slash and no white space, spelled out: `\s` means other characters in pydantic's
# (Rust's), Python's and JSON Schema's (ECMAScript's) regular expressions.
_NAME = r"[^/\t\n\x0b\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
POOL_KEY_PATTERN = rf"^{_NAME}{{1,63}}/{_NAME}{{1,253}}$"
MAX_BATCH = 100
MAX_POOLS = 10


def _integral(value: Any) -> Any:
    """A JSON number without a fraction (`49.0`) as the integer it is."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# After an integer's constraints: it takes a JSON Schema `integer` as the document has
# it, 49 and 49.0 (not "49", not true, not 49.5).
INTEGRAL = BeforeValidator(_integral)


class _Body(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, extra="forbid", frozen=True
    )


class ClaimBody(_Body):
    """Claim one idle, running runner (current template preferred)."""

    inactivity_timeout_seconds: Annotated[StrictInt, Field(gt=0), INTEGRAL] | None = Field(
        None,
        description="seconds without keepalive before the claim expires; "
        "default and maximum come from the pool",
    )
    request_id: Annotated[StrictStr, Field(pattern=REQUEST_ID_PATTERN)] | None = Field(
        None,
        description="makes the call idempotent: repeated, it answers the same claim (200); "
        "unique per Nomad namespace, remembered while the claim or its tombstone exists",
    )
    # StrictFloat takes integers too (not booleans): one JSON Schema number.
    wait_seconds: Annotated[StrictFloat, Field(ge=0, le=MAX_WAIT_SECONDS)] = Field(
        0, description="how long to wait for a runner when none is idle"
    )
    count: Annotated[StrictInt, Field(ge=1, le=MAX_BATCH), INTEGRAL] | None = Field(
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
    ] = Field(
        description="<namespace>/<name> of each pool, in order of preference",
        json_schema_extra={"uniqueItems": True},
    )

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


# ---- executions and files -------------------------------------------------------------------

MAX_LISTED_PATHS = 10_000


def _argument(value: str) -> str:
    """A string that becomes a program argument: UTF-8 without NUL."""
    if "\0" in value:
        raise ValueError("must not contain NUL")
    return _utf8(value)


def _utf8(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


# The documents' patterns say what the validators check (`json_schema_extra`: pydantic's
# own patterns would check them again, with another message).
NO_NUL_PATTERN = r"^[^\u0000]*$"
Argument = Annotated[
    StrictStr, AfterValidator(_argument), Field(json_schema_extra={"pattern": NO_NUL_PATTERN})
]
Text = Annotated[StrictStr, AfterValidator(_utf8)]
# A path where something runs or is listed (the working directory itself included), and
# one of something to write or delete (not the working directory or `/` itself).
RunnerPathText = Annotated[
    Argument,
    Field(min_length=1, max_length=MAX_PATH_LENGTH, json_schema_extra={"pattern": PATH_PATTERN}),
]
BelowPathText = Annotated[
    Argument,
    Field(min_length=1, max_length=MAX_PATH_LENGTH, json_schema_extra={"pattern": BELOW_PATTERN}),
]


# An array command's program: not empty, and no `=` (with env, `env` would read it as a
# variable: 400 then; the document says it of every array command).
PROGRAM = {"type": "string", "minLength": 1, "pattern": r"^[^=\u0000]*$"}


class ExecutionBody(_Body):
    """Run a command in the claimed runner's task."""

    command: (
        Annotated[list[Argument], Field(min_length=1, json_schema_extra={"prefixItems": [PROGRAM]})]
        | Annotated[Argument, Field(min_length=1)]
    ) = Field(description="an array runs as is; a string runs as /bin/sh -c")
    env: dict[Annotated[StrictStr, Field(pattern=ENV_NAME_PATTERN)], Argument] = Field(
        default_factory=dict,
        description="variables for the command, passed as they are",
        json_schema_extra={"additionalProperties": False},  # a name not of the pattern is 400
    )
    working_dir: RunnerPathText | None = Field(
        None, description="where it runs; relative: under the pool's workingDir"
    )
    time_limit_seconds: Annotated[StrictInt, Field(ge=1, le=INT32_MAX), INTEGRAL] | None = Field(
        None, description="default and maximum come from the pool"
    )
    tty: StrictBool = Field(False, description="a terminal: stderr merged, input echoed")
    privileged: StrictBool | None = Field(
        None,
        description="false runs under the pool's unprivilegedWrapper; default: true when "
        "the pool has none",
    )
    wait: StrictBool = Field(
        False, description="true: run to the end and answer with the output (200)"
    )
    stdin: Text | None = Field(None, description="input for the command, sent first")

    @field_validator("command")
    @classmethod
    def _command_names_a_program(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and not value[0]:
            raise ValueError("the program (first element) must not be empty")
        return value

    def to_request(self) -> ExecutionRequest:
        return ExecutionRequest(
            command=self.command,
            env=dict(self.env),
            working_dir=self.working_dir,
            time_limit_seconds=self.time_limit_seconds,
            tty=self.tty,
            privileged=self.privileged,
            stdin=self.stdin,
        )


class ExecutionCreated(_Body):
    execution_id: str
    stream_url: str = Field(description="open within 30 s, once (the ID is the credential)")


class ExecutionResult(_Body):
    execution_id: str
    exit_code: int | None = Field(description="null when the time limit ended it")
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool = Field(description="a stream went past 1 MiB; the rest is dropped")
    duration_seconds: float


class FileUpload(_Body):
    path: BelowPathText
    content: StrictStr = Field(
        description="standard base64", json_schema_extra={"pattern": BASE64_PATTERN}
    )
    mode: Annotated[StrictStr, Field(pattern=r"^0?[0-7]{3}$")] = "0644"


class FilesBody(_Body):
    """Delete (recursively), then make directories, then write files (parents made)."""

    delete: Annotated[list[BelowPathText], Field(max_length=MAX_LISTED_PATHS)] = Field(
        default_factory=list
    )
    directories: Annotated[list[BelowPathText], Field(max_length=MAX_LISTED_PATHS)] = Field(
        default_factory=list
    )
    files: Annotated[list[FileUpload], Field(max_length=MAX_LISTED_PATHS)] = Field(
        default_factory=list
    )

    @field_validator("delete")
    @classmethod
    def _delete_fits(cls, value: list[str]) -> list[str]:
        if sum(len(path.encode()) for path in value) > MAX_DELETE_BYTES:
            raise ValueError(f"the paths must take at most {MAX_DELETE_BYTES} bytes together")
        return value

    def to_uploads(self) -> Uploads:
        return Uploads(
            delete=self.delete,
            directories=self.directories,
            files=[(f.path, f.content, int(f.mode, 8)) for f in self.files],
        )


class FileInfo(_Body):
    path: str = Field(description="under the listed path (prog/main.py), absolute if it was")
    type: Literal["file", "directory", "link", "other"]
    size: int
    mode: str = Field(description="octal permission bits, 0644")
    modified_at: str = Field(json_schema_extra={"format": "date-time"})
    link_target: str | None = Field(None, description="links only")


class FileList(_Body):
    files: list[FileInfo]
