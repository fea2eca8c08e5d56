"""RunnerPool documents, as a pool file or a Kubernetes client holds them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

API_VERSION: Final = "poolkeeper.dev/v1alpha1"
KIND: Final = "RunnerPool"
IMAGE: Final = "python:3.12-slim"
DELETE: Final = object()  # a value for `with_fields`: remove the field


def pool_doc(
    name: str = "python-312", idle: int = 2, *, namespace: str | None = "default", **spec: Any
) -> dict[str, Any]:
    """A valid pool of ``idle`` runners of ``IMAGE``; ``spec`` (camelCase fields) goes over
    it, ``runner`` replacing the whole runner. ``namespace=None`` leaves the namespace out."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    runner = spec.pop("runner", {"image": IMAGE})
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {"idleRunners": idle, "runner": runner, **spec},
    }


def with_fields(document: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` with dotted paths ("spec.runner.image") set, or removed by ``DELETE``
    (absent afterwards, whether it was there or not); missing parents are created."""
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = document
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return document


def as_integers(value: Any) -> Any:
    """``value`` with every float without a fraction an integer, as Go writes a JSON number
    it holds as a float back (``5.0`` as ``5``). JSON Schema cannot tell 5.0 from 5 either;
    pydantic's and Go's strict integers do."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [as_integers(item) for item in value]
    if isinstance(value, dict):
        return {key: as_integers(item) for key, item in value.items()}
    return value
