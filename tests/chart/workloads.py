"""The two tiers' workloads in a render: their Deployments, pods and containers, and which
objects select them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from tests.chart.helm import RELEASE, Manifest

OPERATOR: Final = f"{RELEASE}-poolkeeper"
API: Final = f"{RELEASE}-poolkeeper-api"


def named(manifests: Sequence[Manifest], kind: str, name: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def deployment(manifests: Sequence[Manifest], name: str = OPERATOR) -> Manifest:
    return named(manifests, "Deployment", name)


def pod_labels(manifests: Sequence[Manifest], name: str = OPERATOR) -> dict[str, str]:
    labels: dict[str, str] = deployment(manifests, name)["spec"]["template"]["metadata"]["labels"]
    return labels


def pod(manifests: Sequence[Manifest], name: str = OPERATOR) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(manifests, name)["spec"]["template"]["spec"]
    return spec


def container(manifests: Sequence[Manifest], name: str = OPERATOR) -> dict[str, Any]:
    (only_container,) = pod(manifests, name)["containers"]
    return dict(only_container)


def env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def mounted_secret_files(
    manifests: Sequence[Manifest], name: str = OPERATOR
) -> dict[str, tuple[str, str]]:
    """Mounted file path -> (secret name, key)."""
    volumes = {v["name"]: v for v in pod(manifests, name)["volumes"]}
    files = {}
    for mount in container(manifests, name)["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret:
            assert mount["readOnly"] is True
            for item in secret["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = (
                    secret["secretName"],
                    item["key"],
                )
    return files


def selects(match_labels: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a matchLabels selector (or a Service's selector) selects these labels."""
    return match_labels.items() <= labels.items()


def selected(manifests: Sequence[Manifest], match_labels: Mapping[str, str]) -> set[str]:
    """The Deployments whose pods `match_labels` selects."""
    return {
        m["metadata"]["name"]
        for m in manifests
        if m["kind"] == "Deployment"
        and selects(match_labels, pod_labels(manifests, m["metadata"]["name"]))
    }
