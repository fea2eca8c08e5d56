"""Options of `poolkeeper operator` and the kopf settings they make."""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final

import kopf

from controller.service import ServiceSettings, shared_settings

log = logging.getLogger(__name__)

GROUP: Final = "poolkeeper.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "runnerpools"
FINALIZER: Final = "poolkeeper.dev/finalizer"
# kopf keeps its handler progress and last-handled spec in annotations with this prefix
# (never in .status, which belongs to poolkeeper, and never in .spec).
ANNOTATION_PREFIX: Final = "poolkeeper.dev"
COMPONENT: Final = "poolkeeper"

Connect = Callable[[kopf.OperatorSettings], kopf.ConnectionInfo | None]

# kopf's logger for lines about one object, and its line for a handler that succeeded
# (kopf 1.45, kopf/_core/actions/execution.py).
KOPF_OBJECT_LOGGER: Final = "kopf.objects"
HANDLER_SUCCEEDED: Final = re.compile(r"Handler '[^']*' succeeded\.")


def pod_identity() -> str:
    """The pod's name (the chart sets POD_NAME), else the host's: a pod's host name is its
    name too."""
    return os.environ.get("POD_NAME") or socket.gethostname()


@dataclass(frozen=True)
class OperatorOptions(ServiceSettings):
    listen: tuple[str, int] = ("0.0.0.0", 8080)
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    liveness: str | None = None
    finalize_retry_seconds: float = 2.0
    api_error_backoffs: tuple[float, ...] | None = None  # None: kopf's own
    # Who this replica is in the pools' leases, its member record, its Kubernetes requests'
    # User-Agent and its Events' reportingInstance.
    identity: str = field(default_factory=pod_identity)


def options_from_args(args: argparse.Namespace) -> OperatorOptions:
    shared = shared_settings(args)
    return OperatorOptions(
        namespaces=tuple(args.namespace or ()) if not args.all_namespaces else (),
        liveness=args.liveness,
        **shared,
    )


def operator_settings(options: OperatorOptions) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # No CRD or namespace scanning: the resources are known, and RBAC stays minimal.
    settings.scanning.disabled = True
    # No kopf peering: every replica handles every RunnerPool, and the pools' leases in
    # Nomad decide which replica reconciles each (docs/operator.md, High availability).
    settings.peering.standalone = True
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # kopf's own per-handler Events only for problems; poolkeeper posts its own.
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = COMPONENT
    if options.api_error_backoffs is not None:
        settings.networking.error_backoffs = options.api_error_backoffs
    return settings


def default_connect(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """In a pod: the service account, at the API server's address the kubelet puts in the
    pod's environment (KUBERNETES_SERVICE_HOST and _PORT, as client-go's in-cluster
    configuration: kopf's https://kubernetes.default.svc would need the cluster's DNS);
    elsewhere: KUBECONFIG or ~/.kube/config."""
    in_pod = kopf.login_with_service_account(settings=settings)
    if in_pod is None:
        return kopf.login_with_kubeconfig(settings=settings)
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not (host and port):
        return in_pod
    address = f"[{host}]" if ":" in host else host
    return replace(in_pod, server=f"https://{address}:{port}")


class _RoutineAtDebug(logging.Filter):
    """Routine INFO lines a library logs with no setting to stop them become DEBUG lines
    (dropped unless DEBUG is on). Failures, retries and everything else keep their level."""

    def routine(self, message: str) -> bool:
        raise NotImplementedError

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not isinstance(record.msg, str):
            return True
        if not self.routine(record.msg):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class HandlerSuccessAtDebug(_RoutineAtDebug):
    """kopf logs "Handler 'observe' succeeded." at INFO for every watch event of every
    RunnerPool."""

    def routine(self, message: str) -> bool:
        return bool(HANDLER_SUCCEEDED.fullmatch(message))


class LivenessProbeAtDebug(_RoutineAtDebug):
    """kopf's liveness endpoint (--liveness) is an aiohttp server with aiohttp's access log:
    an INFO line for every probe, every 10 s from the kubelet, whether --access-log is on or
    not. Probes are DEBUG lines on poolkeeper's own listener too (api/access_log.py)."""

    def routine(self, message: str) -> bool:
        return True


# The logger each filter goes on: kopf's per-object lines, and aiohttp's access lines (in
# the operator, only kopf's liveness endpoint writes them: poolkeeper's listener has its own).
ROUTINE_FILTERS: Final[dict[str, type[_RoutineAtDebug]]] = {
    KOPF_OBJECT_LOGGER: HandlerSuccessAtDebug,
    "aiohttp.access": LivenessProbeAtDebug,
}


def quiet_routine_lines() -> None:
    """Install the routine-line filters on their loggers (once per process)."""
    for name, kind in ROUTINE_FILTERS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
