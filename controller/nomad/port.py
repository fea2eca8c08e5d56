"""What the engine and the claim store need of Nomad: the calls they make, as a protocol.

`controller.nomad.client.NomadClient` is the implementation; tests drive the engine's
real apply code through an in-memory one. Errors are those of `controller.nomad.errors`:
a lost check-and-set raises NomadConflict (with the current variable, if any).
"""

from __future__ import annotations

from typing import Any, Protocol


class NomadPort(Protocol):
    async def list_jobs(self, namespace: str) -> list[dict[str, Any]]: ...

    async def list_allocations(self, namespace: str) -> list[dict[str, Any]]: ...

    async def register_job(
        self, job: dict[str, Any], *, enforce_index: int | None = None
    ) -> dict[str, Any]: ...

    async def purge_job(self, job_id: str, namespace: str) -> None: ...

    async def list_variables(self, prefix: str, namespace: str) -> list[dict[str, Any]]: ...

    async def read_variable(self, path: str, namespace: str) -> dict[str, Any] | None: ...

    async def put_variable(
        self, path: str, items: dict[str, str], namespace: str, *, cas: int
    ) -> dict[str, Any]: ...

    async def delete_variable(
        self, path: str, namespace: str, *, cas: int | None = None
    ) -> None: ...

    async def leader(self) -> str: ...
