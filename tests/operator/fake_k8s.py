"""An HTTP-level fake of the Kubernetes API server, as far as poolkeeper depends on it.

Behaves like the real one where the operator, kopf and kubectl rely on it:
- discovery (/version answers 1.32, /api, /apis, group versions with subresources);
- one global resourceVersion counter; `generation` moves only on spec changes of custom
  resources; 409 on updates and patches carrying a stale resourceVersion;
- list + watch; a watch resumes after a given resourceVersion (replaying what happened
  since) and gets an in-stream 410 Gone for one older than the retained history;
- the status and scale subresources are separate from the main resource;
- finalizers and deletionTimestamp: DELETE only marks while finalizers remain, the
  object goes once the last one is removed; no new finalizers on a deleting object;
- CRDs are served once created (kubectl apply works), and their custom resources are
  pruned, defaulted and validated (OpenAPI and CEL rules) as ``tests/support/
  structural_schema.py`` describes, one emulation with the CRD agreement test's;
- every request is recorded with its user and RBAC attributes (verb, group, resource,
  subresource) so a test can check them against the chart's rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from tests.support.structural_schema import Invalid, StructuralSchema

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

JSON = dict[str, Any]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, causes: list[JSON] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.causes = code, reason, message, causes or []

    def response(self) -> web.Response:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.causes:
            body["details"] = {"causes": self.causes}
        return web.json_response(body, status=self.code)


# ---- resource types -----------------------------------------------------------------------


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = (
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    )
    schema: StructuralSchema | None = None  # of a CRD version
    scale: JSON | None = None  # the CRD's scale subresource paths
    categories: tuple[str, ...] = ()
    printer_columns: tuple[JSON, ...] = ()

    @property
    def status_subresource(self) -> bool:
        return self.schema is not None and self.schema.status_subresource

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)


BUILTINS = [
    ResourceType("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",)),
    ResourceType("", "v1", "events", "Event", True, "event", ("ev",)),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        "customresourcedefinition",
        ("crd", "crds"),
    ),
]

# kopf's peering resources, as its own CRDs declare them (no status subresource).
_ANY_OBJECT: JSON = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
PEERING_CRDS: list[JSON] = [
    {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "group": "kopf.dev",
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": plural[:-1]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": _ANY_OBJECT},
                }
            ],
        },
    }
    for plural, kind, scope in (
        ("kopfpeerings", "KopfPeering", "Namespaced"),
        ("clusterkopfpeerings", "ClusterKopfPeering", "Cluster"),
    )
]


# ---- printing ------------------------------------------------------------------------


def _json_path(obj: Any, path: str) -> Any:
    for part in path.lstrip(".").split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _set_json_path(obj: JSON, path: str, value: Any) -> None:
    parts = path.lstrip(".").split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


_FILTER = re.compile(r'^(.*)\[\?\(@\.(\w+)==["\'](.*)["\']\)\]\.(\w+)$')


def printer_value(obj: Any, path: str) -> Any:
    """The two JSONPath forms printer columns use: `.a.b` and `.a[?(@.k=="v")].f`."""
    match = _FILTER.match(path)
    if match is None:
        return _json_path(obj, path)
    items, key, wanted, leaf = match.groups()
    for item in _json_path(obj, items) or ():
        if isinstance(item, dict) and str(item.get(key)) == wanted:
            return item.get(leaf)
    return None


def _age(timestamp: str) -> str:
    created = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    seconds = int((datetime.now(UTC) - created).total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


# ---- patches ------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(target: Any, operations: list[JSON]) -> Any:
    """RFC 6902 (add, remove, replace, test, copy, move)."""
    doc = copy.deepcopy(target)

    def parent(path: str) -> tuple[Any, str]:
        parts = _pointer(path)
        node = doc
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node, parts[-1]

    def get(path: str) -> Any:
        node, last = parent(path)
        return node[int(last)] if isinstance(node, list) else node[last]

    for op in operations:
        try:
            kind, path = op["op"], op["path"]
            if kind == "test":
                if get(path) != op["value"]:
                    raise ApiError(422, "Invalid", f"test failed at {path}")
                continue
            value = get(op["from"]) if kind in ("copy", "move") else op.get("value")
            if kind == "move":
                node, last = parent(op["from"])
                del node[int(last) if isinstance(node, list) else last]
            if kind in ("remove", "replace"):
                node, last = parent(path)
                if isinstance(node, list):
                    del node[int(last)]
                else:
                    del node[last]
                if kind == "remove":
                    continue
            node, last = parent(path)
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), copy.deepcopy(value))
            else:
                node[last] = copy.deepcopy(value)
        except (KeyError, IndexError, ValueError, TypeError) as error:
            raise ApiError(422, "Invalid", f"json patch failed: {error!r}") from None
    return doc


# ---- the server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    user: str
    method: str
    path: str
    verb: str
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    non_resource: bool = False

    @property
    def rbac_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass
class WatchEvent:
    rv: int
    key: tuple[str, str, str]
    namespace: str
    type: str
    obj: JSON


@dataclass
class _Target:
    rtype: ResourceType
    namespace: str
    name: str
    subresource: str


@dataclass
class FakeKubernetes:
    tokens: dict[str, str] = field(default_factory=lambda: {"admin-token": "admin"})
    history_limit: int = 10_000
    anonymous: bool = False  # accept requests without credentials as system:anonymous
    cel_enabled: bool = True  # False: an API server that skips the CRD's CEL rules

    def __post_init__(self) -> None:
        self.rv = 0
        self.types: dict[tuple[str, str, str], ResourceType] = {t.key: t for t in BUILTINS}
        self.objects: dict[tuple[str, str, str], dict[tuple[str, str], JSON]] = {}
        self.history: list[WatchEvent] = []
        self.oldest_rv = 0  # watches from before this get 410 Gone
        self.requests: list[Request] = []
        self.blocked: set[str] = set()
        self.unauthorized: list[str] = []
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""
        for crd in PEERING_CRDS:
            self.create_object(
                self.types[("apiextensions.k8s.io", "v1", "customresourcedefinitions")], "", crd
            )

    # -- running ----------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        self.blocked.add("*")
        async with self._changed:
            self._changed.notify_all()
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(
        self, path: Path, token: str = "admin-token", namespace: str = "default"
    ) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "user", "user": {"token": token} if token else {}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def compact(self) -> None:
        """Forget the watch history, as etcd compaction does: older watches get 410."""
        self.history.clear()
        self.oldest_rv = self.rv

    # -- direct access for tests --------------------------------------------------------

    def get(self, group: str, plural: str, namespace: str, name: str) -> JSON | None:
        rtype = self._type_by_plural(group, plural)
        found = self.objects.get(rtype.key, {}).get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def items(self, group: str, plural: str, namespace: str | None = None) -> list[JSON]:
        rtype = self._type_by_plural(group, plural)
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(self.objects.get(rtype.key, {}).items())
            if namespace is None or ns == namespace
        ]

    def _type_by_plural(self, group: str, plural: str) -> ResourceType:
        for rtype in self.types.values():
            if rtype.group == group and rtype.plural == plural:
                return rtype
        raise KeyError(f"{plural}.{group}")

    # -- HTTP ---------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip()
        user = self.tokens.get(token)
        if "*" in self.blocked:
            raise web.HTTPServiceUnavailable(text="stopping")
        if token in self.blocked:
            # A replica cut off for good (a crash): refused at once, so it cannot say goodbye.
            return ApiError(403, "Forbidden", "this client is blocked").response()
        if user is None and not token and (self.anonymous or request.path == "/version"):
            # /version is public (system:public-info-viewer); everything else only with
            # anonymous auth on. client-go sends bearer tokens over TLS only, so kubectl
            # talks to this plain-HTTP fake anonymously.
            user = "system:anonymous"
        if user is None:
            self.unauthorized.append(request.path)
            return ApiError(401, "Unauthorized", "Unauthorized").response()
        try:
            return await self._route(request, user)
        except ApiError as error:
            return error.response()

    async def _route(self, request: web.Request, user: str) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if request.path == "/version":
            self._record(user, request, "get", non_resource=True)
            return web.json_response(SERVER_VERSION)
        if parts == ["api"]:
            self._record(user, request, "get", non_resource=True)
            return web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if parts == ["apis"]:
            self._record(user, request, "get", non_resource=True)
            return web.json_response(self._group_list())
        if parts == ["api", "v1"]:
            self._record(user, request, "get", non_resource=True)
            return web.json_response(self._resource_list("", "v1"))
        if len(parts) == 3 and parts[0] == "apis":
            self._record(user, request, "get", non_resource=True)
            if not any(t.group == parts[1] and t.version == parts[2] for t in self.types.values()):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return web.json_response(self._resource_list(parts[1], parts[2]))
        if parts and parts[0] in ("api", "apis"):
            target = self._target(parts)
            if target is not None:
                return await self._resource(request, user, target)
        self._record(user, request, request.method.lower(), non_resource=True)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _record(self, user: str, request: web.Request, verb: str, **attrs: Any) -> None:
        self.requests.append(Request(user, request.method, request.path, verb, **attrs))

    def _target(self, parts: list[str]) -> _Target | None:
        if parts[0] == "api":
            group, version, rest = "", parts[1] if len(parts) > 1 else "", parts[2:]
        else:
            if len(parts) < 4:
                return None
            group, version, rest = parts[1], parts[2], parts[3:]
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        elif len(rest) == 2 and rest[0] == "namespaces" and group == "":
            rest = ["namespaces", rest[1]]
        if not rest or len(rest) > 3:
            return None
        rtype = self.types.get((group, version, rest[0]))
        if rtype is None:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({rest[0]})"
            )
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        return _Target(rtype, namespace, name, sub)

    def _group_list(self) -> JSON:
        groups: dict[str, list[str]] = {}
        for rtype in self.types.values():
            if rtype.group:
                versions = groups.setdefault(rtype.group, [])
                if rtype.version not in versions:
                    versions.append(rtype.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": name,
                    "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
                    "preferredVersion": {
                        "groupVersion": f"{name}/{versions[0]}",
                        "version": versions[0],
                    },
                }
                for name, versions in sorted(groups.items())
            ],
        }

    def _resource_list(self, group: str, version: str) -> JSON:
        resources: list[JSON] = []
        for rtype in self.types.values():
            if rtype.group != group or rtype.version != version:
                continue
            entry = {
                "name": rtype.plural,
                "singularName": rtype.singular,
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": list(rtype.verbs),
            }
            if rtype.short_names:
                entry["shortNames"] = list(rtype.short_names)
            if rtype.categories:
                entry["categories"] = list(rtype.categories)
            resources.append(entry)
            if rtype.status_subresource:
                resources.append(
                    {
                        "name": f"{rtype.plural}/status",
                        "singularName": "",
                        "namespaced": rtype.namespaced,
                        "kind": rtype.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if rtype.scale is not None:
                resources.append(
                    {
                        "name": f"{rtype.plural}/scale",
                        "singularName": "",
                        "namespaced": rtype.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    async def _resource(
        self, request: web.Request, user: str, target: _Target
    ) -> web.StreamResponse:
        rtype, method = target.rtype, request.method
        watching = request.query.get("watch") in ("true", "1")
        if method == "GET":
            verb = "watch" if watching else ("get" if target.name else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
                method, ""
            )
            if method == "DELETE" and not target.name:
                verb = "deletecollection"
        self._record(
            user,
            request,
            verb,
            api_group=rtype.group,
            resource=rtype.plural,
            subresource=target.subresource,
            namespace=target.namespace,
            name=target.name,
        )
        if rtype.namespaced and not target.namespace and verb not in ("list", "watch"):
            raise ApiError(404, "NotFound", "namespace required")
        if target.subresource and target.subresource not in self._subresources(rtype):
            raise ApiError(404, "NotFound", f"no subresource {target.subresource}")
        if verb == "watch":
            return await self._watch(request, target)
        as_table = "as=Table" in request.headers.get("Accept", "")
        if verb == "list":
            listed = self._list(target)
            return web.json_response(self._table(rtype, listed["items"]) if as_table else listed)
        if verb == "get":
            obj = self._existing(target)
            if target.subresource == "scale":
                return web.json_response(self._scale_of(rtype, obj))
            return web.json_response(self._table(rtype, [obj]) if as_table else obj)
        if verb == "create":
            body = await self._body(request)
            if target.name:
                raise ApiError(405, "MethodNotAllowed", "POST to a named resource")
            return web.json_response(self.create_object(rtype, target.namespace, body), status=201)
        if verb == "update":
            body = await self._body(request)
            if not isinstance(body, dict) or not (body.get("metadata") or {}).get(
                "resourceVersion"
            ):
                raise ApiError(
                    422,
                    "Invalid",
                    "metadata.resourceVersion: Invalid value: 0: must be specified for an update",
                )
            return web.json_response(self._write(target, lambda _current: body, precondition=True))
        if verb == "patch":
            body = await self._body(request)
            kind = request.content_type
            if kind == "application/json-patch+json":
                change = lambda current: json_patch(current, body)  # noqa: E731
            elif kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if kind.startswith("application/strategic") and rtype.schema is not None:
                    raise ApiError(
                        415,
                        "UnsupportedMediaType",
                        "strategic merge patch is not supported for custom resources",
                    )
                change = lambda current: merge_patch(current, body)  # noqa: E731
            else:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {kind}")
            return web.json_response(self._write(target, change, precondition=True))
        if verb == "delete":
            return web.json_response(self._delete(target))
        raise ApiError(405, "MethodNotAllowed", f"{method} not supported")

    @staticmethod
    def _subresources(rtype: ResourceType) -> set[str]:
        return ({"status"} if rtype.status_subresource else set()) | (
            {"scale"} if rtype.scale else set()
        )

    async def _body(self, request: web.Request) -> Any:
        try:
            text = await request.text()
            return yaml.safe_load(text) if "yaml" in request.content_type else json.loads(text)
        except (ValueError, yaml.YAMLError) as error:
            raise ApiError(400, "BadRequest", f"cannot decode the body: {error}") from None

    # -- store --------------------------------------------------------------------------

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, rtype: ResourceType, namespace: str, type_: str, obj: JSON) -> None:
        self.history.append(WatchEvent(self.rv, rtype.key, namespace, type_, copy.deepcopy(obj)))
        if len(self.history) > self.history_limit:
            dropped = self.history.pop(0)
            self.oldest_rv = dropped.rv
        with contextlib.suppress(RuntimeError):  # no loop yet: nobody is watching
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _existing(self, target: _Target) -> JSON:
        obj = self.objects.get(target.rtype.key, {}).get((target.namespace, target.name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{target.rtype.plural} "{target.name}" not found')
        return copy.deepcopy(obj)

    def _list(self, target: _Target) -> JSON:
        rtype = target.rtype
        items = [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(self.objects.get(rtype.key, {}).items())
            if not target.namespace or ns == target.namespace
        ]
        return {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }

    def _admit(
        self, rtype: ResourceType, obj: JSON, current: JSON | None, subresource: str = ""
    ) -> JSON:
        """A custom resource as the API server stores it: pruned, defaulted, validated."""
        if rtype.schema is None:
            return obj
        try:
            return rtype.schema.admit(obj, current, subresource=subresource, cel=self.cel_enabled)
        except Invalid as invalid:
            name = (current or obj).get("metadata", {}).get("name", "")
            causes = [cause.as_json() for cause in invalid.causes]
            raise ApiError(
                422, "Invalid", f'{rtype.kind} "{name}" is invalid: {invalid}', causes
            ) from None

    def create_object(self, rtype: ResourceType, namespace: str, body: JSON) -> JSON:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be an object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("resourceVersion"):
            raise ApiError(
                422, "Invalid", "resourceVersion should not be set on objects to be created"
            )
        if rtype.namespaced:
            namespace = namespace or meta.get("namespace") or "default"
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match")
            meta["namespace"] = namespace
        else:
            namespace = ""
            meta.pop("namespace", None)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            else:
                raise ApiError(422, "Invalid", "metadata.name: Required value")
        store = self.objects.setdefault(rtype.key, {})
        if (namespace, meta["name"]) in store:
            raise ApiError(409, "AlreadyExists", f'{rtype.plural} "{meta["name"]}" already exists')
        obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
        obj = self._admit(rtype, obj, None)
        meta = obj["metadata"]
        meta.update(
            uid=str(uuid.uuid4()),
            creationTimestamp=_now(),
            generation=1,
            resourceVersion=self._bump(),
        )
        meta.pop("deletionTimestamp", None)
        store[(namespace, meta["name"])] = obj
        if rtype.key == ("apiextensions.k8s.io", "v1", "customresourcedefinitions"):
            self._serve_crd(obj)
        self._emit(rtype, namespace, "ADDED", obj)
        return copy.deepcopy(obj)

    def _write(self, target: _Target, change: Any, *, precondition: bool) -> JSON:
        rtype = target.rtype
        current = self._existing(target)
        if target.subresource == "scale":
            scale = change(self._scale_of(rtype, current))
            wanted = scale.get("spec", {}).get("replicas") if isinstance(scale, dict) else None
            sent_rv = (
                (scale.get("metadata") or {}).get("resourceVersion")
                if isinstance(scale, dict)
                else None
            )
            if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
                raise self._conflict(rtype, target.name)
            updated = copy.deepcopy(current)
            _set_json_path(updated, rtype.scale["specReplicasPath"], wanted)  # type: ignore[index]
            stored = self._store(rtype, current, updated)
            return self._scale_of(rtype, stored)
        proposed = change(copy.deepcopy(current))
        if not isinstance(proposed, dict):
            raise ApiError(400, "BadRequest", "the object must be a JSON object")
        sent_rv = (proposed.get("metadata") or {}).get("resourceVersion")
        if precondition and sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            raise self._conflict(rtype, target.name)
        return self._store(rtype, current, proposed, subresource=target.subresource)

    def _conflict(self, rtype: ResourceType, name: str) -> ApiError:
        return ApiError(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {rtype.plural}.{rtype.group} "{name}": the object '
            "has been modified; please apply your changes to the latest version and try again",
        )

    def _store(
        self, rtype: ResourceType, current: JSON, updated: JSON, *, subresource: str = ""
    ) -> JSON:
        meta_now = current["metadata"]
        if subresource != "status":  # a write through /status changes the status only
            meta = dict(updated.get("metadata") or {})
            # Immutable and server-owned metadata.
            for key in (
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "namespace",
                "name",
            ):
                if key in meta_now:
                    meta[key] = meta_now[key]
                else:
                    meta.pop(key, None)
            if meta_now.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or ()) - set(meta_now.get("finalizers") or ())
                if added:
                    raise ApiError(
                        422,
                        "Invalid",
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the "
                        f"object is being deleted, found new finalizers {sorted(added)}",
                    )
            updated["metadata"] = meta
        updated["apiVersion"], updated["kind"] = rtype.api_version, rtype.kind
        updated = self._admit(rtype, updated, current, subresource)
        meta = updated["metadata"]
        # Custom resources: every change but metadata (and status, when it has its own
        # subresource) moves the generation.
        ignored = {"metadata", "apiVersion", "kind"} | (
            {"status"} if rtype.status_subresource else set()
        )
        keys = (set(updated) | set(current)) - ignored if rtype.schema is not None else set()
        if any(updated.get(k) != current.get(k) for k in keys):
            meta["generation"] = int(meta_now.get("generation", 1)) + 1
        if updated == current:
            return current  # a no-op write keeps the resourceVersion
        namespace = meta_now.get("namespace", "")
        meta["resourceVersion"] = self._bump()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.objects[rtype.key][(namespace, meta["name"])]
            self._emit(rtype, namespace, "DELETED", updated)
            return copy.deepcopy(updated)
        self.objects[rtype.key][(namespace, meta["name"])] = updated
        if rtype.key == ("apiextensions.k8s.io", "v1", "customresourcedefinitions"):
            self._serve_crd(updated)
        self._emit(rtype, namespace, "MODIFIED", updated)
        return copy.deepcopy(updated)

    def _delete(self, target: _Target) -> JSON:
        rtype = target.rtype
        current = self._existing(target)
        meta = current["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return current
            updated = copy.deepcopy(current)
            updated["metadata"]["deletionTimestamp"] = _now()
            updated["metadata"]["deletionGracePeriodSeconds"] = 0
            updated["metadata"]["resourceVersion"] = self._bump()
            self.objects[rtype.key][(target.namespace, target.name)] = updated
            self._emit(rtype, target.namespace, "MODIFIED", updated)
            return copy.deepcopy(updated)
        meta["resourceVersion"] = self._bump()
        del self.objects[rtype.key][(target.namespace, target.name)]
        self._emit(rtype, target.namespace, "DELETED", current)
        return current

    def _table(self, rtype: ResourceType, objects: list[JSON]) -> JSON:
        """The server-side printing kubectl asks for (a CRD's additionalPrinterColumns)."""
        columns = rtype.printer_columns or (
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        )
        definitions = [{"name": "Name", "type": "string", "format": "name"}] + [
            {"name": c["name"], "type": c["type"], "format": "", "description": ""} for c in columns
        ]
        rows = []
        for obj in objects:
            cells: list[Any] = [obj["metadata"]["name"]]
            for column in columns:
                value = printer_value(obj, column["jsonPath"])
                if column["type"] == "date" and isinstance(value, str):
                    value = _age(value)
                cells.append(value if value is not None else "")
            rows.append(
                {
                    "cells": cells,
                    "object": {
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj["metadata"],
                    },
                }
            )
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": str(self.rv)},
            "columnDefinitions": definitions,
            "rows": rows,
        }

    def _scale_of(self, rtype: ResourceType, obj: JSON) -> JSON:
        assert rtype.scale is not None
        meta = obj["metadata"]
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": meta["name"],
                "namespace": meta.get("namespace", ""),
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"],
            },
            "spec": {"replicas": _json_path(obj, rtype.scale["specReplicasPath"])},
            "status": {
                "replicas": _json_path(obj, rtype.scale["statusReplicasPath"]) or 0,
                "selector": _json_path(obj, rtype.scale.get("labelSelectorPath", ".none")) or "",
            },
        }

    def _serve_crd(self, crd: JSON) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            rtype = ResourceType(
                spec["group"],
                version["name"],
                names["plural"],
                names["kind"],
                spec["scope"] == "Namespaced",
                names.get("singular", names["kind"].lower()),
                tuple(names.get("shortNames", ())),
                schema=StructuralSchema.of_version(version),
                scale=(version.get("subresources") or {}).get("scale"),
                categories=tuple(names.get("categories", ())),
                printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
            )
            self.types[rtype.key] = rtype

    # -- watch --------------------------------------------------------------------------

    async def _watch(self, request: web.Request, target: _Target) -> web.StreamResponse:
        rtype = target.rtype
        since_text = request.query.get("resourceVersion", "")
        timeout = float(request.query.get("timeoutSeconds", "0") or 0) or None
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(type_: str, obj: JSON) -> None:
            await response.write(json.dumps({"type": type_, "object": obj}).encode() + b"\n")

        def matches(event: WatchEvent) -> bool:
            return event.key == rtype.key and (
                not target.namespace or event.namespace == target.namespace
            )

        if since_text in ("", "0"):
            position = self.rv
            for obj in self._list(target)["items"]:
                await send("ADDED", obj)
        else:
            position = int(since_text)
            if position < self.oldest_rv:
                await send(
                    "ERROR",
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "code": 410,
                        "reason": "Expired",
                        "message": f"too old resource version: {position} ({self.oldest_rv})",
                    },
                )
                return response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        with contextlib.suppress(ConnectionResetError, asyncio.CancelledError):
            while "*" not in self.blocked:
                for event in [e for e in self.history if e.rv > position]:
                    position = event.rv
                    if matches(event):
                        await send(event.type, event.obj)
                position = max(position, self.rv)
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                async with self._changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._changed.wait(), timeout=min(remaining or 1.0, 1.0)
                        )
                if request.transport is None or request.transport.is_closing():
                    break
        return response


# ---- RBAC ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()

    @classmethod
    def from_manifest(cls, rule: Mapping[str, Any]) -> Rule:
        return cls(
            tuple(rule.get("apiGroups") or ()),
            tuple(rule.get("resources") or ()),
            tuple(rule.get("verbs") or ()),
            tuple(rule.get("resourceNames") or ()),
        )

    def allows(self, request: Request) -> bool:
        return (
            request.api_group in self.api_groups
            and request.rbac_resource in self.resources
            and request.verb in self.verbs
            and (not self.resource_names or request.name in self.resource_names)
        )


def denied(requests: Iterable[Request], rules: Iterable[Rule]) -> list[Request]:
    """Resource requests none of the rules allows (discovery is allowed to everyone)."""
    rules = list(rules)
    return [r for r in requests if not r.non_resource and not any(rule.allows(r) for rule in rules)]
