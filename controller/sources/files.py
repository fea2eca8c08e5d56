"""RunnerPool documents from YAML files.

``load_pools`` never raises for bad content: every invalid document becomes a
``PoolFileError`` and the valid pools are returned beside them. A path that does not
exist (or is neither file nor folder) raises ``ConfigError``; files over the
``LoadLimits`` raise ``LimitExceeded`` before the cost of loading them can grow: the
bytes are counted before parsing, the nodes YAML aliases expand to while parsing, the
pools before any reaches the caller.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn, Protocol

import yaml
from pydantic import ValidationError

from controller.model import RunnerPool, pool_key, validation_errors

YAML_SUFFIXES = (".yaml", ".yml")


# Deeper nesting is no pool (a Nomad job nests about ten levels) but would exhaust
# Python's recursion while YAML is composed and the spec validated.
MAX_DEPTH = 64


class ConfigError(Exception):
    """The pools path itself is unusable (missing, not a file or folder)."""


@dataclass(frozen=True)
class LoadLimits:
    """What one load of the pool files may hold, all files together. They bound the work
    of a load (parsing, validating and registering), whatever the files hold."""

    # Also the most a Kubernetes ConfigMap holds.
    max_bytes: int = 1024 * 1024
    # Each scalar, sequence and mapping; an alias counts as the nodes it expands to, so
    # an alias fan-out (a "billion laughs") is refused while it is parsed. A pool with a
    # jobTemplate takes 50 to 200.
    max_nodes: int = 200_000
    max_pools: int = 1000

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadLimits:
        """The limits given to `run` or `validate`; the defaults where none was given."""
        given = {
            "max_bytes": args.max_pools_bytes,
            "max_nodes": args.max_pools_nodes,
            "max_pools": args.max_pools,
        }
        return replace(cls(), **{name: value for name, value in given.items() if value})


class LimitExceeded(Exception):
    """The files are over one of the ``LoadLimits``: nothing of them is loaded. The
    message names the limit (as its command-line option) and the value found."""


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
    def empty(self) -> bool:
        """Whether the files hold no document at all, not even an invalid one."""
        return not self.locations and not self.errors

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


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts nodes while it composes, an alias as the nodes it
    expands to (known per node: counting stays linear in the text), and refuses a
    document nested deeper than MAX_DEPTH or holding an alias to a node containing it."""

    def __init__(self, text: str, file: Path, budget: _Budget) -> None:
        super().__init__(text)
        self.file = file
        self.budget = budget
        self.document = 0  # the index of the document being composed, set by its reader
        self.depth = 0
        # id(node) -> its nodes with every alias expanded, for the nodes of the current
        # document composed so far (an alias only names a node of its own document).
        self.expanded: dict[int, int] = {}

    def compose_document(self) -> yaml.Node | None:
        self.expanded = {}
        return super().compose_document()

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        if self.depth == MAX_DEPTH:
            self._refuse(f"nested deeper than {MAX_DEPTH} levels", event)
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        assert node is not None  # there is a node whenever compose_node is called
        if isinstance(event, yaml.AliasEvent):
            nodes = self.expanded.get(id(node))
            if nodes is None:  # still being composed: the alias is inside what it names
                self._refuse("an alias inside the node it names", event)
            reached = event.start_mark
        else:
            nodes = 1
            self.expanded[id(node)] = nodes + sum(
                self._expanded(child) for child in _children(node)
            )
            reached = node.end_mark
        self.budget.spend_nodes(nodes, f"{self.file}:{self.document}", reached)
        return node

    def _expanded(self, node: yaml.Node) -> int:
        return self.expanded[id(node)]

    @staticmethod
    def _refuse(problem: str, event: yaml.Event) -> NoReturn:
        raise yaml.composer.ComposerError(None, None, f"{problem} ({_position(event.start_mark)})")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return node.value if isinstance(node, yaml.SequenceNode) else []


class _Budget:
    """The limits of one load, spent while its files are parsed: refused at the first
    node or document over, the rest is not even parsed."""

    def __init__(self, path: Path, limits: LoadLimits) -> None:
        self.path = path
        self.limits = limits
        self.nodes = 0
        self.documents = 0

    def spend_nodes(self, nodes: int, document: str, reached: _Mark | None) -> None:
        self.nodes += nodes
        if self.nodes > self.limits.max_nodes:
            raise LimitExceeded(
                f"{document}: {self.nodes} YAML nodes by {_position(reached)} "
                f"(an alias counts as the nodes it expands to), over the limit of "
                f"{self.limits.max_nodes} (--max-pools-nodes)"
            )

    def spend_document(self) -> None:
        self.documents += 1
        if self.documents > self.limits.max_pools:
            raise LimitExceeded(
                f"{self.path}: more than {self.limits.max_pools} pool documents, over the "
                f"limit of {self.limits.max_pools} (--max-pools)"
            )


class _Mark(Protocol):
    """A place in a YAML text, counted from 0 (PyYAML's Mark, of either parser)."""

    line: int
    column: int


def _position(mark: _Mark | None) -> str:
    """`line L, column C` of a YAML mark, counted from 1; "" when there is none."""
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _syntax_message(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc)
    where = _position(getattr(exc, "problem_mark", None))
    return (
        f"YAML syntax error: {problem}{f' ({where})' if where else ''}; "
        "no pool of this file was loaded"
    )


def _read_files(
    path: Path, files: list[Path], max_bytes: int
) -> list[tuple[Path, str | PoolFileError]]:
    """Each file's text, or why it cannot be read; never more than ``max_bytes`` in all."""
    texts: list[tuple[Path, str | PoolFileError]] = []
    left = max_bytes
    for file in files:
        try:
            with file.open("rb") as stream:
                data = stream.read(left + 1)  # bounded whatever the file's size
            text: str | PoolFileError = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            text = PoolFileError(file, 0, "", f"cannot read the file: {exc}")
            data = b""
        if len(data) > left:
            total = sum(f.stat().st_size for f in files if f.exists())
            raise LimitExceeded(
                f"{path}: {total} bytes of pool files, over the limit of {max_bytes} "
                "(--max-pools-bytes)"
            )
        left -= len(data)
        texts.append((file, text))
    return texts


def _parse(file: Path, text: str, budget: _Budget) -> list[Any] | PoolFileError:
    """Every document of the file (None for an empty one), or the error that makes the
    whole file suspect."""
    loader = _BoundedLoader(text, file, budget)
    documents: list[Any] = []
    try:
        while loader.check_node():
            loader.document = len(documents)
            node = loader.get_node()
            document = None if node is None else loader.construct_document(node)
            if document is not None:
                budget.spend_document()
            documents.append(document)
    except yaml.YAMLError as exc:
        return PoolFileError(file, len(documents), "", _syntax_message(exc))
    finally:
        loader.dispose()
    return documents


def _load_file(path: Path, documents: list[Any], result: LoadResult) -> None:
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


def load_pools(path: Path | str, limits: LoadLimits = LoadLimits()) -> LoadResult:
    """Every RunnerPool of ``path`` (a YAML file, or a folder's ``*.yaml``/``*.yml``
    files sorted by name, not recursive), in document order, with every problem found.
    Blocking and CPU-bound: a controller runs it beside its event loop."""
    path = Path(path)
    result = LoadResult()
    budget = _Budget(path, limits)
    for file, text in _read_files(path, _pool_files(path), limits.max_bytes):
        documents = text if isinstance(text, PoolFileError) else _parse(file, text, budget)
        if isinstance(documents, PoolFileError):
            result.errors.append(documents)
        else:
            _load_file(file, documents, result)
    return result
