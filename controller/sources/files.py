"""RunnerPool documents from YAML files.

``load_pools`` never raises for bad content: every invalid document becomes a
``PoolFileError`` and the valid pools are returned beside them. Only a path that does
not exist (or is neither file nor folder) raises ``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from controller.model import RunnerPool, pool_key, validation_errors

YAML_SUFFIXES = (".yaml", ".yml")


class ConfigError(Exception):
    """The pools path itself is unusable (missing, not a file or folder)."""


@dataclass(frozen=True)
class PoolFileError:
    """One problem in a pool file. ``field`` is "" when the problem is not one field's
    (YAML syntax, an unreadable file, a document that is not a mapping)."""

    file: Path
    document: int
    field: str
    message: str
    key: str | None = None

    def __str__(self) -> str:
        """`file:document: field: message`, documents counted from 0."""
        where = f"{self.file}:{self.document}"
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


@dataclass(frozen=True)
class Location:
    file: Path
    document: int


@dataclass
class LoadResult:
    pools: list[RunnerPool] = field(default_factory=list)
    errors: list[PoolFileError] = field(default_factory=list)
    # Every pool key seen, valid or not, with the document that defines it (the first
    # one when duplicated); insertion order is document order.
    locations: dict[str, Location] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every document could be attributed to a pool: no syntax error, no
        unreadable file, no document without a readable name. Only then can a pool that
        is missing from the files be told apart from one that merely failed to parse."""
        return all(error.key is not None for error in self.errors)


def _pool_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        # Dotfiles are editor and tooling leftovers (``.#pools.yaml``), never pools.
        return sorted(
            child
            for child in path.iterdir()
            if child.suffix in YAML_SUFFIXES and not child.name.startswith(".") and child.is_file()
        )
    if path.exists():
        raise ConfigError(f"--pools {path}: neither a file nor a folder")
    raise ConfigError(f"--pools {path}: no such file or folder")


def _read_key(document: Any) -> str | None:
    """``<namespace>/<name>`` if the document's metadata says so, even when invalid."""
    if not isinstance(document, Mapping):
        return None
    metadata = document.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    name = metadata.get("name")
    namespace = metadata.get("namespace", "default")
    if not isinstance(name, str) or not name or not isinstance(namespace, str):
        return None
    return pool_key(namespace, name)


def _syntax_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"YAML syntax error: {problem}{where}; no pool of this file was loaded"


def _load_file(path: Path, result: LoadResult) -> None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        result.errors.append(PoolFileError(path, 0, "", f"cannot read the file: {exc}"))
        return
    documents: list[Any] = []
    try:
        # Parse the whole file first: a syntax error anywhere makes the file suspect.
        for document in yaml.safe_load_all(text):
            documents.append(document)
    except yaml.YAMLError as exc:
        result.errors.append(PoolFileError(path, len(documents), "", _syntax_message(exc)))
        return

    for index, document in enumerate(documents):
        if document is None:  # an empty document, e.g. after a trailing "---"
            continue
        key = _read_key(document)
        if key is not None and key in result.locations:
            first = result.locations[key]
            result.errors.append(
                PoolFileError(
                    path,
                    index,
                    "metadata.name",
                    f"duplicate RunnerPool {key} (first defined in {first.file} "
                    f"document {first.document})",
                    key,
                )
            )
            continue
        if key is not None:
            result.locations[key] = Location(path, index)
        if not isinstance(document, Mapping):
            result.errors.append(
                PoolFileError(path, index, "", "a RunnerPool document must be a mapping")
            )
            continue
        try:
            pool = RunnerPool.parse_document(document)
        except ValidationError as exc:
            result.errors.extend(
                PoolFileError(path, index, error.path, error.message, key)
                for error in validation_errors(exc)
            )
            continue
        result.pools.append(pool)


def load_pools(path: Path | str) -> LoadResult:
    """Every RunnerPool of ``path`` (a YAML file, or a folder's ``*.yaml``/``*.yml``
    files sorted by name, not recursive), in document order, with every problem found."""
    result = LoadResult()
    for file in _pool_files(Path(path)):
        _load_file(file, result)
    return result
