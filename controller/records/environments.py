"""Managed Poseidon environments in Nomad (sources/environments.py says what they are):
environment N is the variable `poolkeeper/environments/N` in the controllers' own
namespace, its items the environment's fields. Reading them again where they changed,
writing one over what was read, deleting one as read."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from controller.core.paths import ENVIRONMENTS_PREFIX, environment_path
from controller.nomad.errors import NomadConflict
from controller.nomad.port import Variables
from controller.records.reading import Known, listed, read_changed
from controller.records.writing import index_of, write_over

log = logging.getLogger(__name__)

T = TypeVar("T")

CAS_ATTEMPTS: Final = 5


class EnvironmentRecords:
    def __init__(self, port: Variables, home_namespace: str) -> None:
        self._port = port
        self._home = home_namespace

    async def read(
        self,
        known: Mapping[str, Known[T]],
        decode: Callable[[str, Mapping[str, Any]], T],
        valid: Callable[[str], bool],
    ) -> dict[str, Known[T]]:
        """The environments by path (`known`: as last read), those whose path is `valid`;
        only changed ones are read again. A failed read raises and changes nothing."""
        metas = await self._port.list_variables(ENVIRONMENTS_PREFIX, self._home)
        present = {path: i for path, i in listed(metas).items() if valid(path)}
        found = await read_changed(self._port, self._home, present, known, decode)
        # Nomad leaves out of a list, silently, what the token may not read: a variable is
        # gone only when reading it says so (a 403 stops the refresh).
        for path in known.keys() - present.keys():
            variable = await self._port.read_variable(path, self._home)
            if variable is not None:
                log.debug("Poseidon environment %s: missing from the list but readable", path)
                found[path] = Known(index_of(variable), decode(path, variable))
        return found

    async def put(self, env_id: int, items: dict[str, str]) -> tuple[int, bool]:
        """Create or replace an environment; its ModifyIndex, and whether it was created.
        Raises NomadConflict when it kept changing."""
        path = environment_path(env_id)
        current = await self._port.read_variable(path, self._home)
        stored, over = await write_over(
            self._port, path, items, self._home, cas=index_of(current), attempts=CAS_ATTEMPTS
        )
        if stored is None:
            raise NomadConflict(f"{path} changed {CAS_ATTEMPTS} times while being written")
        return index_of(stored), over == 0

    async def delete(self, env_id: int) -> bool:
        """Delete an environment as it is now; False when there is none. Raises
        NomadConflict when it kept changing."""
        path = environment_path(env_id)
        for _ in range(CAS_ATTEMPTS):
            current = await self._port.read_variable(path, self._home)
            if current is None:
                return False
            try:
                await self._port.delete_variable(path, self._home, cas=index_of(current))
            except NomadConflict:
                continue
            return True
        raise NomadConflict(f"{path} changed {CAS_ATTEMPTS} times while being deleted")
