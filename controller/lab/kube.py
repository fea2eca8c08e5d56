"""A real etcd and kube-apiserver on loopback, for tests and soaks that need a Kubernetes API.

The binaries come from ``scripts/build-kube.sh`` (``tools/kube``: etcd, kube-apiserver and
kubectl built from their Go modules into ``.cache/kube/bin``). The cluster has no
controller-manager, scheduler or kubelet: objects are stored and served, nothing reconciles
them (no pod ever runs, no namespace is finalized, no default ServiceAccount appears).
``controller.lab.node`` adds them: a cluster with a real node.

What it sets up, all made by the test in a temporary folder:

- etcd on free loopback ports with a throwaway data dir (``--unsafe-no-fsync``);
- kube-apiserver on ``https://127.0.0.1:PORT`` with a self-signed serving certificate
  (``controller.lab.tls``), ``--authorization-mode=RBAC``, a client CA whose ``admin``
  certificate is in ``system:masters``, and a service-account signing key pair, so that
  ServiceAccount tokens from the TokenRequest API authenticate (and are authorized by RBAC);
- a kubeconfig for admin, and one per ServiceAccount on request.

Use::

    with kube_cluster() as cluster:             # or start_cluster() ... cluster.stop()
        ns = cluster.create_namespace("demo")
        cluster.kubectl("get", "ns", ns)
        config = cluster.service_account_kubeconfig(ns, "robot")

Everything it starts runs in its own process group and is killed on ``stop()``, when start-up
fails, and at interpreter exit, so nothing is left running.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import http.client
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controller.lab.tls import self_signed

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-kube.sh"
DEFAULT_BIN_DIR = REPO / ".cache" / "kube" / "bin"
BINARIES = ("etcd", "kube-apiserver", "kubectl")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

# ServiceAccount admission wants a namespace's "default" ServiceAccount before a pod is
# admitted, and only the controller-manager (not run here) creates it.
DEFAULT_DISABLED_ADMISSION = ("ServiceAccount",)

_LOG_TAIL_LINES = 40


class KubeClusterError(RuntimeError):
    """The cluster could not be started (the message ends with the failing process's log)."""


def release() -> str:
    """The Kubernetes release tools/kube builds (k8s.io/kubernetes in its go.mod), e.g. v1.37.2."""
    for line in (REPO / "tools" / "kube" / "go.mod").read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "k8s.io/kubernetes" and words[1].startswith("v"):
            return words[1]
    raise KubeClusterError("no k8s.io/kubernetes requirement in tools/kube/go.mod")


def bin_dir() -> Path:
    """Where the binaries are: $KUBE_BIN_DIR, else .cache/kube/bin in this repository."""
    configured = os.environ.get("KUBE_BIN_DIR")
    return Path(configured).resolve() if configured else DEFAULT_BIN_DIR


def missing_binaries(folder: Path | None = None) -> list[str]:
    """The names of the binaries that ``folder`` (default: ``bin_dir()``) lacks."""
    folder = folder or bin_dir()
    return [name for name in BINARIES if not os.access(folder / name, os.X_OK)]


def build_binaries(*, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run scripts/build-kube.sh (a no-op when current; minutes when it must compile).

    Its progress goes to this process's stdout and stderr.
    """
    return subprocess.run(["bash", str(BUILD_SCRIPT)], check=check, stdin=subprocess.DEVNULL)


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Process:
    """A process started in its own session (so its whole group can be killed)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds, reap the leader."""
        pgid = self.popen.pid  # start_new_session: the leader's pid is the group's id
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            try:
                self.popen.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            # The leader is gone; anything else left in its group goes too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the starting thread dies (pytest killed by a
    timeout, say), since a process in its own session outlives its parent otherwise."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_PR_SET_PDEATHSIG = 1


def spawn(name: str, argv: Sequence[str], workdir: Path) -> Process:
    # Only from the main thread: the death signal follows the thread, not the process.
    guard = sys.platform == "linux" and threading.current_thread() is threading.main_thread()
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
            preexec_fn=_die_with_parent if guard else None,
        )
    return Process(name, popen, log)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _make_client_ca(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "client-ca.crt", folder / "client-ca.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "1", "-keyout", str(key), "-out", str(cert), "-subj", "/CN=test-client-ca",
    )  # fmt: skip
    return cert, key


def _make_client_cert(
    folder: Path, ca: tuple[Path, Path], user: str, groups: Sequence[str]
) -> tuple[Path, Path]:
    """A client certificate for ``user`` (CN) in ``groups`` (O), signed by ``ca``."""
    cert, key = folder / f"{user}.crt", folder / f"{user}.key"
    subject = "".join(f"/O={group}" for group in groups) + f"/CN={user}"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-days", "1", "-keyout", str(key), "-out", str(cert), "-subj", subject,
        "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-addext", "basicConstraints=critical,CA:FALSE",
        "-addext", "extendedKeyUsage=clientAuth",
    )  # fmt: skip
    return cert, key


def _make_service_account_keys(folder: Path) -> tuple[Path, Path]:
    """The key pair that signs (private) and verifies (public) ServiceAccount tokens."""
    private, public = folder / "sa.key", folder / "sa.pub"
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(private)
    )
    _openssl("pkey", "-in", str(private), "-pubout", "-out", str(public))
    return private, public


@dataclass
class Timings:
    """Seconds from spawning etcd until it is healthy, and from spawning kube-apiserver until
    its /readyz answers 200; ``total`` includes making the certificates and keys."""

    etcd: float = 0.0
    apiserver: float = 0.0
    total: float = 0.0


@dataclass
class KubeCluster:
    """A running etcd and kube-apiserver. Build it with ``start_cluster()``."""

    workdir: Path
    bin_dir: Path
    server: str  # https://127.0.0.1:PORT
    etcd_url: str  # http://127.0.0.1:PORT
    ca_file: Path  # the apiserver's self-signed serving certificate: trust it
    admin_cert: Path
    admin_key: Path
    admin_kubeconfig: Path
    client_ca: tuple[Path, Path]  # signs user certificates (``user_kubeconfig``)
    audit_log: Path | None = None  # JSON lines, one event per request the policy logs
    timings: Timings = field(default_factory=Timings)
    _processes: list[Process] = field(default_factory=list, repr=False)
    _remove_workdir: bool = field(default=False, repr=False)

    # --- life cycle -------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The pids (and process-group ids) of etcd and kube-apiserver."""
        return [process.popen.pid for process in self._processes]

    def running(self) -> bool:
        return bool(self._processes) and all(process.alive() for process in self._processes)

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd (their whole process groups); remove the temporary
        folder if start_cluster() made it. Safe to call twice."""
        while self._processes:
            self._processes.pop().stop()
        atexit.unregister(self.stop)
        if self._remove_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._remove_workdir = False

    def __enter__(self) -> KubeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> dict[str, str]:
        """The last lines of each process's log (for a failing test's message)."""
        return {process.name: process.log_tail() for process in self._processes}

    # --- talking to the API -----------------------------------------------------------------

    def ssl_context(self, *, admin: bool = True) -> ssl.SSLContext:
        """A client context that trusts the apiserver (and presents admin's certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if admin:
            context.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        return context

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """One API call as admin, or with ``token`` as a bearer token; (status, JSON or text).
        ``content_type`` says what ``body`` is (e.g. application/merge-patch+json).

        A non-2xx status is returned, not raised.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        context = self.ssl_context(admin=token is None)
        try:
            with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
                status, raw = int(response.status), response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def wait_served(self, path: str, timeout: float = 30.0) -> None:
        """Wait until ``GET path`` answers 200: a custom resource answers 429 "storage is
        (re)initializing" for a moment after its CRD is created or changed, Established or
        not."""
        deadline = time.monotonic() + timeout
        while (answer := self.request("GET", path))[0] != 200:
            if time.monotonic() > deadline:
                raise AssertionError(f"GET {path} not served in {timeout} s: {answer}")
            time.sleep(0.05)

    def _ok(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        status, answer = self.request(method, path, body)
        if not 200 <= status < 300:
            raise AssertionError(f"{method} {path}: {status} {answer}")
        return answer

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        check: bool = True,
        input: str | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl (as admin unless ``kubeconfig`` is given); text output."""
        config = kubeconfig or self.admin_kubeconfig
        argv = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(config), *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result

    # --- objects ----------------------------------------------------------------------------

    def create_namespace(self, name: str | None = None) -> str:
        """Create a namespace (a unique ``test-...`` name unless given); return its name."""
        name = name or f"test-{uuid.uuid4().hex[:10]}"
        self._ok("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
        })  # fmt: skip
        return name

    def install_crds(self, *files: Path) -> list[str]:
        """Apply the CustomResourceDefinitions in ``files`` and wait until each is
        Established and its resources served; their names."""
        crds = [
            document
            for path in files
            for document in yaml.safe_load_all(path.read_text())
            if document and document.get("kind") == "CustomResourceDefinition"
        ]
        names = [str(crd["metadata"]["name"]) for crd in crds]
        self.kubectl("apply", *(arg for path in files for arg in ("-f", str(path))))
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{name}" for name in names),
        )  # fmt: skip
        for crd in crds:  # Established is not served yet
            spec = crd["spec"]
            version = next(v["name"] for v in spec["versions"] if v.get("served"))
            self.wait_served(f"/apis/{spec['group']}/{version}/{spec['names']['plural']}")
        return names

    def create_service_account(self, namespace: str, name: str) -> None:
        """Create a ServiceAccount (no error when it already exists)."""
        status, answer = self.request(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )  # fmt: skip
        if status != 409 and not 200 <= status < 300:
            raise AssertionError(f"creating serviceaccount {namespace}/{name}: {status} {answer}")

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        create: bool = True,
        expiration_seconds: int = 3600,
        audiences: Sequence[str] = (),
    ) -> str:
        """A token for ServiceAccount ``namespace/name`` from the TokenRequest API (creating
        the ServiceAccount first unless ``create`` is false)."""
        if create:
            self.create_service_account(namespace, name)
        spec: dict[str, Any] = {"expirationSeconds": expiration_seconds}
        if audiences:
            spec["audiences"] = list(audiences)
        answer = self._ok(
            "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )  # fmt: skip
        return str(answer["status"]["token"])

    def audit_events(self, offset: int = 0) -> list[dict[str, Any]]:
        """The audit log's events from byte ``offset`` on (complete lines only); none when
        the cluster was started without ``audit_policy``."""
        if self.audit_log is None or not self.audit_log.exists():
            return []
        with self.audit_log.open("rb") as log:
            log.seek(offset)
            data = log.read()
        return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]

    def write_kubeconfig(
        self, path: Path, user: Mapping[str, str], *, name: str = "user", namespace: str = ""
    ) -> Path:
        """A kubeconfig for this cluster with ``user`` (a kubeconfig user entry, e.g.
        ``{"token": ...}`` or ``{"client-certificate": ..., "client-key": ...}``)."""
        context: dict[str, str] = {"cluster": "test", "user": name}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": name, "user": dict(user)}],
            "contexts": [{"name": name, "context": context}],
            "current-context": name,
            "preferences": {},
        }  # fmt: skip
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        path: Path | None = None,
        *,
        create: bool = True,
        expiration_seconds: int = 3600,
    ) -> Path:
        """Mint a token for ServiceAccount ``namespace/name`` and write a kubeconfig with it
        (default path: ``<workdir>/sa-<namespace>-<name>.kubeconfig``); return its path."""
        token = self.service_account_token(
            namespace, name, create=create, expiration_seconds=expiration_seconds
        )
        path = path or self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        return self.write_kubeconfig(
            path, {"token": token}, name=f"system:serviceaccount:{namespace}:{name}",
            namespace=namespace,
        )  # fmt: skip

    def user_kubeconfig(
        self, user: str, groups: Sequence[str] = (), path: Path | None = None
    ) -> Path:
        """A kubeconfig for ``user`` in ``groups`` with a client certificate from the
        cluster's client CA (for RBAC tests that need a user rather than a ServiceAccount)."""
        cert, key = _make_client_cert(self.workdir, self.client_ca, user, groups)
        path = path or self.workdir / f"user-{user}.kubeconfig"
        return self.write_kubeconfig(
            path, {"client-certificate": str(cert), "client-key": str(key)}, name=user
        )


def start_cluster(
    *,
    workdir: Path | None = None,
    binaries: Path | None = None,
    timeout: float = 120.0,
    extra_apiserver_args: Sequence[str] = (),
    disable_admission_plugins: Sequence[str] = DEFAULT_DISABLED_ADMISSION,
    port_attempts: int = 3,
    audit_policy: Mapping[str, Any] | None = None,
    address: str = "127.0.0.1",
    service_cidr: str = "10.0.0.0/24",
) -> KubeCluster:
    """Start etcd and kube-apiserver and wait until /readyz answers 200.

    ``workdir`` holds certificates, keys, data, logs and kubeconfigs (default: a temporary
    folder removed by ``stop()``); ``binaries`` defaults to ``bin_dir()``. An
    ``audit_policy`` (an audit.k8s.io/v1 Policy) makes the server log the requests it
    selects to ``cluster.audit_log`` (blocking mode: written as each request completes). Raises
    KubeClusterError with the log's tail when a process exits or ``timeout`` passes; nothing
    is left running then. A start that fails because a port was taken meanwhile is retried.

    The server listens on ``address`` (loopback by default; a node's pods need one they can
    reach, and then the "kubernetes" Service in ``service_cidr`` leads to it) and its
    certificate names that address, 127.0.0.1, the Service's address and DNS names.
    """
    folder = (binaries or bin_dir()).resolve()
    missing = missing_binaries(folder)
    if missing:
        raise KubeClusterError(
            f"{', '.join(missing)} missing in {folder}: run scripts/build-kube.sh"
        )
    for attempt in range(1, port_attempts + 1):
        try:
            return _start_once(
                workdir,
                folder,
                timeout,
                extra_apiserver_args,
                disable_admission_plugins,
                audit_policy,
                _Network(address, service_cidr),
            )
        except _PortTaken:
            if attempt == port_attempts:
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def kube_cluster(**kwargs: Any) -> Iterator[KubeCluster]:
    """``start_cluster(**kwargs)`` as a context manager that always stops it."""
    cluster = start_cluster(**kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()


class _PortTaken(KubeClusterError):
    pass


@dataclass(frozen=True)
class _Network:
    address: str  # where kube-apiserver listens
    service_cidr: str

    @property
    def kubernetes_service(self) -> str:
        """The "kubernetes" Service's address: the range's first."""
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    def apiserver_args(self) -> list[str]:
        loopback = ipaddress.ip_address(self.address).is_loopback
        return [
            "--bind-address", self.address,
            "--advertise-address", self.address,
            # v1.37 refuses a loopback advertise address for the endpoint reconciler (the
            # "kubernetes" Service's endpoints); nothing without a node needs that Service.
            "--endpoint-reconciler-type", "none" if loopback else "lease",
            "--service-cluster-ip-range", self.service_cidr,
        ]  # fmt: skip


def _start_once(
    workdir: Path | None,
    folder: Path,
    timeout: float,
    extra_apiserver_args: Sequence[str],
    disable_admission_plugins: Sequence[str],
    audit_policy: Mapping[str, Any] | None,
    network: _Network,
) -> KubeCluster:
    started = time.monotonic()
    deadline = started + timeout
    remove = workdir is None
    work = Path(tempfile.mkdtemp(prefix="kube-cluster-")) if workdir is None else workdir
    work.mkdir(parents=True, exist_ok=True)
    pki = work / "pki"
    pki.mkdir(exist_ok=True)
    # A fresh etcd: a data dir left by an earlier start (or a retried one) has other ports.
    shutil.rmtree(work / "etcd-data", ignore_errors=True)

    serving_cert, serving_key = self_signed(
        pki,
        "serving-",
        addresses=list(dict.fromkeys([network.address, "127.0.0.1", network.kubernetes_service])),
        names=["kubernetes", "kubernetes.default", "kubernetes.default.svc"],
    )
    client_ca = _make_client_ca(pki)
    admin_cert, admin_key = _make_client_cert(pki, client_ca, "admin", ["system:masters"])
    sa_private, sa_public = _make_service_account_keys(pki)

    etcd_port, peer_port, secure_port = free_port(), free_port(), free_port()
    cluster = KubeCluster(
        workdir=work,
        bin_dir=folder,
        server=f"https://{network.address}:{secure_port}",
        etcd_url=f"http://127.0.0.1:{etcd_port}",
        ca_file=serving_cert,
        admin_cert=admin_cert,
        admin_key=admin_key,
        admin_kubeconfig=work / "admin.kubeconfig",
        client_ca=client_ca,
        audit_log=None if audit_policy is None else work / "audit.log",
        _remove_workdir=remove,
    )
    audit_args: list[str] = []
    if cluster.audit_log is not None:
        policy = work / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(dict(audit_policy or {})))
        cluster.audit_log.unlink(missing_ok=True)
        audit_args = [
            "--audit-policy-file", str(policy),
            "--audit-log-path", str(cluster.audit_log),
            "--audit-log-format", "json",
            "--audit-log-mode", "blocking",
        ]  # fmt: skip
    atexit.register(cluster.stop)
    try:
        peer = f"http://127.0.0.1:{peer_port}"
        etcd_started = time.monotonic()
        etcd = spawn("etcd", [
            str(folder / "etcd"),
            "--name", "test",
            "--data-dir", str(work / "etcd-data"),
            "--listen-client-urls", cluster.etcd_url,
            "--advertise-client-urls", cluster.etcd_url,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}",
            "--initial-cluster-state", "new",
            "--unsafe-no-fsync",
            "--log-level", "warn",
        ], work)  # fmt: skip
        cluster._processes.append(etcd)
        wait_for(etcd, deadline, lambda: _etcd_healthy(cluster.etcd_url), "etcd /health")
        cluster.timings.etcd = time.monotonic() - etcd_started

        apiserver_started = time.monotonic()
        apiserver = spawn("kube-apiserver", [
            str(folder / "kube-apiserver"),
            "--etcd-servers", cluster.etcd_url,
            *network.apiserver_args(),
            "--secure-port", str(secure_port),
            "--tls-cert-file", str(serving_cert),
            "--tls-private-key-file", str(serving_key),
            "--client-ca-file", str(client_ca[0]),
            # A node's kubelet (logs, exec, port-forward) trusts the client CA: admin's
            # certificate, at the address the node registers (no name resolves here).
            "--kubelet-client-certificate", str(admin_cert),
            "--kubelet-client-key", str(admin_key),
            "--kubelet-preferred-address-types", "InternalIP",
            "--authorization-mode", "RBAC",
            "--service-account-issuer", SERVICE_ACCOUNT_ISSUER,
            "--service-account-key-file", str(sa_public),
            "--service-account-signing-key-file", str(sa_private),
            "--disable-admission-plugins", ",".join(disable_admission_plugins),
            "--allow-privileged",
            "--cert-dir", str(work / "apiserver-certs"),
            *audit_args,
            *extra_apiserver_args,
        ], work)  # fmt: skip
        cluster._processes.append(apiserver)
        wait_for(apiserver, deadline, lambda: _ready(cluster), "kube-apiserver /readyz")
        cluster.timings.apiserver = time.monotonic() - apiserver_started

        cluster.write_kubeconfig(
            cluster.admin_kubeconfig,
            {"client-certificate": str(admin_cert), "client-key": str(admin_key)},
            name="admin",
        )
    except BaseException:
        cluster.stop()
        raise
    cluster.timings.total = time.monotonic() - started
    return cluster


def wait_for(process: Process, deadline: float, check: Callable[[], bool], what: str) -> None:
    pause = 0.02
    while True:
        if not process.alive():
            tail = process.log_tail()
            error = _PortTaken if "address already in use" in tail else KubeClusterError
            raise error(
                f"{process.name} exited ({process.popen.returncode}) before {what} was ready;"
                f" the end of {process.log}:\n{tail}"
            )
        if check():
            return
        if time.monotonic() > deadline:
            raise KubeClusterError(
                f"{what} not ready in time; the end of {process.log}:\n{process.log_tail()}"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def _ready(cluster: KubeCluster) -> bool:
    try:
        status, _ = cluster.request("GET", "/readyz", timeout=2)
    except (OSError, http.client.HTTPException):
        return False
    return status == 200
