"""What the engine and the claim store need of Nomad: the calls they make, as protocols.

`controller.nomad.client.NomadClient` implements them all; tests drive the engine's real
apply code through an in-memory model of Nomad. Errors are those of
`controller.nomad.errors`: a lost check-and-set raises NomadConflict (with the current
variable, if any).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class LockTerms:
    """How long a variable lock lives unrenewed, and how long Nomad keeps it after."""

    ttl_seconds: float
    delay_seconds: float


class JobWriter(Protocol):
    """Registering and purging runner jobs (the Applier)."""

    async def register_job(
        self, job: dict[str, Any], *, enforce_index: int | None = None
    ) -> dict[str, Any]: ...

    async def purge_job(self, job_id: str, namespace: str) -> None: ...


class Variables(Protocol):
    """Nomad Variables with check-and-set (the claim store, drain records)."""

    async def list_variables(self, prefix: str, namespace: str) -> list[dict[str, Any]]: ...

    async def read_variable(self, path: str, namespace: str) -> dict[str, Any] | None: ...

    async def put_variable(
        self, path: str, items: dict[str, str], namespace: str, *, cas: int | None
    ) -> dict[str, Any]: ...

    async def delete_variable(
        self, path: str, namespace: str, *, cas: int | None = None
    ) -> None: ...


class VariableLists(Variables, Protocol):
    """Variables, and blocking lists of them (following the catalog)."""

    async def wait_variables(
        self, prefix: str, namespace: str, index: int, wait_seconds: float
    ) -> tuple[list[dict[str, Any]], int]: ...


class VariableWatch(Protocol):
    """Blocking reads of one variable (Nomad's blocking queries)."""

    async def wait_variable(
        self, path: str, namespace: str, index: int, wait_seconds: float
    ) -> tuple[dict[str, Any] | None, int]: ...


class Locks(VariableWatch, Protocol):
    """Nomad's variable locks (1.7+): the pools' leases."""

    async def acquire_lock(
        self, path: str, items: dict[str, str], namespace: str, terms: LockTerms
    ) -> dict[str, Any] | None: ...

    async def renew_lock(self, path: str, namespace: str, lock_id: str) -> bool: ...

    async def release_lock(self, path: str, namespace: str, lock_id: str) -> None: ...

    async def write_locked(
        self, path: str, items: dict[str, str], namespace: str, lock_id: str
    ) -> dict[str, Any]: ...

    async def read_variable(self, path: str, namespace: str) -> dict[str, Any] | None: ...


class NomadPort(JobWriter, VariableLists, Locks, Protocol):
    """Everything the engine calls: the writers above, and the lists a pass observes."""

    async def list_jobs(self, namespace: str, prefix: str = "") -> list[dict[str, Any]]: ...

    async def job_evaluations(self, job_id: str, namespace: str) -> list[dict[str, Any]]: ...

    async def list_allocations(
        self, namespace: str, job_prefixes: Sequence[str] | None = None
    ) -> list[dict[str, Any]]: ...

    async def list_nodes(self) -> list[dict[str, Any]]: ...

    async def read_node(self, node_id: str) -> dict[str, Any] | None: ...

    async def leader(self) -> str: ...
