"""The kopf handlers (thin: each hands its object to the OperatorController) and running
one operator replica."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import kopf

from controller.errors import UsageError
from controller.logs import start_logging
from controller.nomad.config import NomadConfig
from controller.operator.controller import OperatorController
from controller.operator.options import (
    GROUP,
    PLURAL,
    VERSION,
    Connect,
    OperatorOptions,
    default_connect,
    operator_settings,
    options_from_args,
    quiet_routine_lines,
)
from controller.serving import nomad_config_from_env

log = logging.getLogger(__name__)

REGISTRY: Final = kopf.OperatorRegistry()


@dataclass
class Runtime:
    """What the handlers reach through kopf's memo: one per operator replica."""

    controller: OperatorController
    connect: Connect = default_connect


def _runtime(memo: Any) -> Runtime:
    runtime: Runtime = memo.poolkeeper
    return runtime


@kopf.on.login(registry=REGISTRY)
def login(memo: Any, settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
    runtime = _runtime(memo)
    return runtime.controller.connect(settings, runtime.connect)


@kopf.on.cleanup(registry=REGISTRY)
async def cleanup(memo: Any, **_: Any) -> None:
    # Before kopf reaps the tasks left in the loop: stop ours (engine, API) gracefully.
    await _runtime(memo).controller.stop()


@kopf.on.event(GROUP, VERSION, PLURAL, registry=REGISTRY)
async def observe(event: Mapping[str, Any], body: Mapping[str, Any], memo: Any, **_: Any) -> None:
    await _runtime(memo).controller.observe(event.get("type"), body)


@kopf.on.delete(GROUP, VERSION, PLURAL, registry=REGISTRY)
async def finalize(body: Mapping[str, Any], memo: Any, **_: Any) -> None:
    await _runtime(memo).controller.finalize(body)


async def run(
    options: OperatorOptions,
    nomad: NomadConfig,
    *,
    connect: Connect = default_connect,
    stop_flag: asyncio.Event | threading.Event | None = None,
    started: Callable[[OperatorController], None] | None = None,
) -> None:
    """One operator replica until SIGTERM/SIGINT (or `stop_flag`): it reconciles from the
    start, the pools whose leases it holds (kopf runs without peering)."""
    quiet_routine_lines()
    controller = OperatorController(options, nomad)
    await controller.serve_api(controller.readiness)
    if started is not None:
        started(controller)
    try:
        await controller.start()
        await kopf.operator(
            registry=REGISTRY,
            settings=operator_settings(options),
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            liveness_endpoint=options.liveness,
            memo=kopf.Memo(poolkeeper=Runtime(controller, connect)),
            stop_flag=stop_flag,
        )
    finally:
        await controller.stop()


def main(args: argparse.Namespace) -> int:
    start_logging(args.log_format)
    options = options_from_args(args)
    nomad = nomad_config_from_env()
    log.info("poolkeeper operator: %s", ", ".join(options.namespaces) or "all namespaces")
    no_credentials = UsageError(
        "no Kubernetes credentials: run in a pod with a service account, or set KUBECONFIG"
    )
    if default_connect(operator_settings(options)) is None:
        raise no_credentials
    try:
        asyncio.run(run(options, nomad))
    except kopf.LoginError:
        raise no_credentials from None
    return 0
