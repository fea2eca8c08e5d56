"""A small Kubernetes client for what kopf does not write: RunnerPool status and Events."""

from __future__ import annotations

import json
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kopf

from controller.core.times import format_time, utcnow
from controller.model import (
    API_VERSION,
    KIND,
    pool_key,
)
from controller.operator.options import COMPONENT, GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

# The API server's reason for a refusal, as logged: a 403 names the user, the verb, the
# resource, its group and the namespace, well over 200 characters.
MESSAGE_LIMIT = 1000


def _ssl_context(info: kopf.ConnectionInfo, scratch: Path) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context()
    if info.ca_path:
        context.load_verify_locations(cafile=os.fsdecode(info.ca_path))
    if info.ca_data:
        data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        context.load_verify_locations(cadata=data)
    cert, key = info.certificate_path, info.private_key_path
    if info.certificate_data:
        cert = scratch / "client.crt"
        cert.write_bytes(_as_bytes(info.certificate_data))
    if info.private_key_data:
        key = scratch / "client.key"
        key.write_bytes(_as_bytes(info.private_key_data))
    if cert:
        context.load_cert_chain(os.fsdecode(cert), os.fsdecode(key) if key else None)
    return context


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _server_message(text: str) -> str:
    """The message of the API server's Status answer (the body itself if it has none)."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    message = body.get("message") if isinstance(body, dict) else None
    return (message if isinstance(message, str) else text)[:MESSAGE_LIMIT]


async def _refusal(response: aiohttp.ClientResponse) -> aiohttp.ClientResponseError:
    """The API server's refusal as an error naming its message."""
    return aiohttp.ClientResponseError(
        response.request_info,
        (),
        status=response.status,
        message=_server_message(await response.text()),
    )


@dataclass(frozen=True)
class ObjectRef:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return pool_key(self.namespace, self.name)


class KubeClient:
    """Writes RunnerPool status (the status subresource only) and core/v1 Events, with
    the credentials kopf logged in with. `instance` (the replica's identity) is named in
    the User-Agent, so the API server's audit log tells the replicas apart, and is the
    Events' reportingInstance."""

    def __init__(self, info: kopf.ConnectionInfo, instance: str) -> None:
        self.server = info.server.rstrip("/")
        self.instance = instance
        self._scratch = tempfile.TemporaryDirectory(prefix="poolkeeper-kube-")
        self._ssl = _ssl_context(info, Path(self._scratch.name))
        self._headers = {"User-Agent": f"{COMPONENT}-operator ({instance})"}
        self._auth: aiohttp.BasicAuth | None = None
        if info.token:
            self._headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        elif info.username and info.password:
            self._auth = aiohttp.BasicAuth(info.username, info.password)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                auth=self._auth,
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._scratch.cleanup()

    async def patch_status(self, ref: ObjectRef, status: Mapping[str, Any]) -> bool:
        """Merge-patch .status through the status subresource; False if the object is gone."""
        url = (
            f"{self.server}/apis/{GROUP}/{VERSION}/namespaces/{ref.namespace}/"
            f"{PLURAL}/{ref.name}/status"
        )
        async with self._client().patch(
            url,
            json={"status": status},
            headers={"Content-Type": "application/merge-patch+json"},
            ssl=self._ssl,
        ) as response:
            if response.status == 404:
                return False
            if response.status >= 400:
                raise await _refusal(response)
            return True

    async def list_pools(self, namespaces: tuple[str, ...]) -> set[str]:
        """The keys of the RunnerPools in these namespaces (all namespaces when empty) that
        are not being deleted."""
        base = f"{self.server}/apis/{GROUP}/{VERSION}"
        urls = [f"{base}/namespaces/{ns}/{PLURAL}" for ns in namespaces] or [f"{base}/{PLURAL}"]
        keys: set[str] = set()
        for url in urls:
            async with self._client().get(url, ssl=self._ssl) as response:
                if response.status >= 400:
                    raise await _refusal(response)
                listing = await response.json()
            for item in listing.get("items") or ():
                meta = item.get("metadata") or {}
                if not meta.get("deletionTimestamp"):
                    keys.add(ObjectRef(meta.get("namespace", ""), meta.get("name", ""), "").key)
        return keys

    async def post_event(self, ref: ObjectRef, type_: str, reason: str, message: str) -> None:
        now = format_time(utcnow().replace(microsecond=0))
        name = f"{ref.name}.{time.time_ns():x}"[:253]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": ref.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        url = f"{self.server}/api/v1/namespaces/{ref.namespace}/events"
        async with self._client().post(url, json=body, ssl=self._ssl) as response:
            if response.status >= 400:
                log.warning(
                    "could not post Event %s for %s: HTTP %s: %s",
                    reason,
                    ref.key,
                    response.status,
                    _server_message(await response.text()),
                )
