"""A real Kubernetes node on this machine, for the chart's pods: the test cluster
(``controller.lab.kube``) with kube-controller-manager, kube-scheduler, a kubelet on
containerd and runc, kube-proxy, and a bridge network for the pods.

Every Kubernetes component is the same release as the API server (``tools/kube``'s
multicall binary, ``scripts/build-kube.sh``); containerd, runc, the CNI plugins and iptables
are Debian's packages (``scripts/fetch-node.sh``); the pod sandbox image is made here from
``tools/kube/pause``. It needs root. Use::

    with node_cluster() as node:                # or start_node() ... node.stop()
        node.load_image("localhost/poolkeeper:0.1.0-abc")
        node.cluster.kubectl("get", "nodes")

The network, all on this machine: the pods get addresses of ``POD_CIDR`` on the bridge
``BRIDGE``, made before the node starts, whose own address ``NODE_ADDRESS`` is their gateway
and the node's address. kube-apiserver listens there (the pods reach it through the
"kubernetes" Service, as in any cluster), and so may any server of the host the pods must
reach (a Nomad simulator, say). Services get addresses of ``SERVICE_CIDR``, routed to the
bridge, which kube-proxy (iptables) makes reachable from the host too. Nothing is forwarded
off the machine: IP forwarding stays as it is (off here), so a pod reaches this machine's
addresses and the pods beside it, nothing else.

One node at a time on a machine (a lock): containerd keeps its images between runs in
``NODE_ROOT``, and a node's start first clears what a killed run left (pod sandboxes, mounts,
iptables rules). Its stop leaves nothing running: no pod, no shim, no mount, no interface,
no kube-proxy rule; and it puts back the kernel settings the kubelet and the pods' network
changed.

On cgroup v1 (this machine's layout), the kubelet runs with ``failCgroupV1: false`` and the
cgroupfs driver; containerd 1.6 has no RuntimeConfig call, so the kubelet takes the driver
from its own configuration.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import yaml

from controller.lab import image as images
from controller.lab.kube import (
    KubeCluster,
    KubeClusterError,
    Process,
    bin_dir,
    free_port,
    spawn,
    start_cluster,
    wait_for,
)

NODE_NAME: Final = "poolkeeper-node"
POD_CIDR: Final = "10.244.0.0/24"
NODE_ADDRESS: Final = "10.244.0.1"  # the bridge's: the pods' gateway
BRIDGE: Final = "pkbr0"
SERVICE_CIDR: Final = "10.96.0.0/24"
# containerd's images and the kubelet's folder: kept between runs (what a run left is cleared).
NODE_ROOT: Final = Path("/var/lib/poolkeeper/node")
# containerd's state and socket, the lock.
NODE_RUN: Final = Path("/run/poolkeeper/node")
RUNTIME_ENDPOINT: Final = f"unix://{NODE_RUN}/containerd.sock"
CONTAINERD_NAMESPACE: Final = "k8s.io"  # the CRI plugin's
# What the node needs of this machine, beside tools/kube's binaries.
HOST_TOOLS: Final = (
    "containerd",
    "ctr",
    "runc",
    "iptables",
    "ip",
    "/usr/lib/cni/bridge",
    "/usr/lib/cni/host-local",
    "/usr/lib/cni/loopback",
)
NODE_BINARIES: Final = (
    "kubelet",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-proxy",
    "cri-reset",
    "pause",
)
# Kernel settings the kubelet sets at start (vm.overcommit_memory, kernel.panic, ...): each
# is put back as it was when the node stops.
SYSCTLS: Final = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


class NodeError(KubeClusterError):
    """The node could not be started (the message ends with the failing process's log)."""


def unavailable() -> str:
    """Why a node cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "a node (kubelet, containerd, iptables) needs root"
    missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} missing (scripts/fetch-node.sh installs them)"
    folder = bin_dir()
    missing = [name for name in NODE_BINARIES if not os.access(folder / name, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} missing in {folder}: run scripts/build-kube.sh"
    return ""


@dataclass
class NodeTimings:
    """Seconds: the API server and etcd (``cluster``), containerd answering, the pause
    image imported into it, then from the kubelet's spawn until the Node is Ready with the
    controllers and kube-proxy serving (``node``); ``total`` is all of it. ``loads``: the
    images loaded since."""

    cluster: float = 0.0
    containerd: float = 0.0
    images: float = 0.0
    node: float = 0.0
    total: float = 0.0
    loads: float = 0.0  # ``load_image``'s, all together


@dataclass
class KubeNode:
    """The cluster (``cluster``) and its one node. Build it with ``start_node()``."""

    cluster: KubeCluster
    workdir: Path
    name: str = NODE_NAME
    address: str = NODE_ADDRESS
    timings: NodeTimings = field(default_factory=NodeTimings)
    _processes: list[Process] = field(default_factory=list, repr=False)
    _sysctls: dict[str, str] = field(default_factory=dict, repr=False)  # to put back
    _sysctls_before: dict[str, str] = field(default_factory=dict, repr=False)
    _lock: IO[bytes] | None = field(default=None, repr=False)
    _loaded: set[str] = field(default_factory=set, repr=False)

    # --- images ------------------------------------------------------------------------

    def ctr(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """containerd's ctr in the CRI plugin's namespace; a failure raises NodeError."""
        argv = ["ctr", "--address", _socket(), "--namespace", CONTAINERD_NAMESPACE, *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    def images(self) -> set[str]:
        """The references of the images the node has (not their ids, which the CRI plugin
        lists as references too)."""
        listed = self.ctr("images", "list", "--quiet").stdout.split()
        return {reference for reference in listed if not reference.startswith("sha256:")}

    def load_image(self, reference: str) -> float:
        """Give the node the image ``reference`` from the podman store (scripts/
        build-image.sh's), unless it has it; the seconds it took."""
        started = time.monotonic()
        if reference not in self.images():
            with tempfile.TemporaryDirectory(dir=self.workdir) as scratch:
                archive = images.save(reference, Path(scratch) / "image.tar")
                self._import(archive, reference)
        self._loaded.add(reference)
        elapsed = time.monotonic() - started
        self.timings.loads += elapsed
        return elapsed

    def _import(self, archive: Path, reference: str) -> None:
        """Import an OCI archive under ``reference`` and unpack it for the CRI plugin."""
        self.ctr(
            "images", "import", "--index-name", reference, "--snapshotter", "overlayfs",
            str(archive),
        )  # fmt: skip
        if reference not in self.images():
            raise NodeError(f"{archive} imported, but the node has no {reference}")

    def forget_other_images(self) -> None:
        """Remove the images kept from earlier runs that this run has not loaded (the
        pause image stays)."""
        stale = self.images() - self._loaded
        if stale:
            self.ctr("images", "remove", *sorted(stale))

    # --- life cycle ----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop everything and clear what the pods left (see the module's doc); stop the
        cluster. Safe to call twice."""
        atexit.unregister(self.stop)
        try:
            kept = [p for p in self._processes if p.name == "containerd"]
            for process in reversed(self._processes):
                if process.name != "containerd":
                    process.stop()
            self._processes = kept
            if kept and kept[0].alive():
                # A failure here leaves pods behind, which leftovers() then names.
                with contextlib.suppress(NodeError, subprocess.TimeoutExpired):
                    _reset_runtime()
            while self._processes:
                self._processes.pop().stop()
            _kill_shims()
            _clear_host()
            for name, value in self._sysctls.items():
                _write_sysctl(name, value)
            self._sysctls.clear()
        finally:
            self.cluster.stop()
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    def leftovers(self) -> list[str]:
        """After ``stop()``: what the node left on this machine (nothing, it should be): a
        process, shim, mount, interface, iptables chain or kernel setting."""
        found = [f"process {p.name}" for p in self._processes if p.alive()]
        found += [f"shim {pid}" for pid in _shims()]
        found += [f"mount {m}" for m in _mounts(NODE_ROOT / "kubelet") + _mounts(NODE_RUN)]
        if _run("ip", "link", "show", BRIDGE).returncode == 0:
            found.append(f"interface {BRIDGE}")
        found += [f"iptables chain {chain}" for chain in _kube_chains()]
        found += [
            f"sysctl {name}: {_read_sysctl(name)}, was {value}"
            for name, value in self._sysctls_before.items()
            if _read_sysctl(name) != value
        ]
        return found

    def __enter__(self) -> KubeNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_node(
    *, workdir: Path | None = None, timeout: float = 180.0, lock_timeout: float = 600.0
) -> KubeNode:
    """Start a cluster with its node and wait until the node is Ready, the controllers and
    kube-proxy serve, and the pause image is in place; a KubeNode. Raises NodeError with the
    failing process's log (nothing is left running then)."""
    reason = unavailable()
    if reason:
        raise NodeError(reason)
    started = time.monotonic()
    lock = _take_lock(lock_timeout)
    work = workdir or Path(tempfile.mkdtemp(prefix="kube-node-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        sysctls = {name: _read_sysctl(name) for name in SYSCTLS}
        _make_bridge()
        cluster = start_cluster(
            workdir=work / "cluster",
            address=NODE_ADDRESS,
            service_cidr=SERVICE_CIDR,
            disable_admission_plugins=(),  # a pod gets its ServiceAccount's token, as anywhere
            timeout=timeout,
        )
    except BaseException:
        _run("ip", "link", "delete", BRIDGE)
        lock.close()
        raise
    node = KubeNode(cluster, work, _sysctls=sysctls, _sysctls_before=dict(sysctls), _lock=lock)
    atexit.register(node.stop)
    try:
        node.timings.cluster = cluster.timings.total
        _start(node, started + timeout)
    except BaseException:
        node.stop()
        raise
    node.timings.total = time.monotonic() - started
    return node


@contextlib.contextmanager
def node_cluster(**kwargs: Any) -> Iterator[KubeNode]:
    """``start_node(**kwargs)`` as a context manager that always stops it."""
    node = start_node(**kwargs)
    try:
        yield node
    finally:
        node.stop()


def _start(node: KubeNode, deadline: float) -> None:
    cluster, work = node.cluster, node.workdir
    kubeconfig = str(cluster.admin_kubeconfig)
    binaries = cluster.bin_dir

    began = time.monotonic()
    config = _containerd_config(work)
    containerd = spawn("containerd", ["containerd", "--config", str(config)], work)
    node._processes.append(containerd)
    wait_for(containerd, deadline, _containerd_answers, "containerd")
    node.timings.containerd = time.monotonic() - began

    began = time.monotonic()
    # What a killed run left: its containerd finds its shims again, and its pods go.
    _reset_runtime()
    _clear_host(keep_bridge=True)
    pause = _pause_reference(binaries / "pause")
    if pause not in node.images():
        node._import(_pause_archive(binaries / "pause", pause, work), pause)
    node._loaded.add(pause)
    node.timings.images = time.monotonic() - began

    began = time.monotonic()
    kubelet = spawn("kubelet", [
        str(binaries / "kubelet"),
        "--config", str(_kubelet_config(node)),
        "--kubeconfig", kubeconfig,
        "--hostname-override", node.name,
        "--node-ip", node.address,
        "--root-dir", str(NODE_ROOT / "kubelet"),
        "--v", "1",
    ], work)  # fmt: skip
    node._processes.append(kubelet)

    def control_plane(program: str, *options: str) -> Process:
        # Alone on this node: no leader to elect, no port to serve.
        argv = [str(binaries / program), "--kubeconfig", kubeconfig, "--leader-elect=false",
                "--secure-port", "0", *options]  # fmt: skip
        process = spawn(program, argv, work)
        node._processes.append(process)
        return process

    controllers = control_plane(
        "kube-controller-manager",
        "--root-ca-file", str(cluster.ca_file),  # the kube-root-ca.crt ConfigMaps
        "--service-cluster-ip-range", SERVICE_CIDR,
        "--v", "1",
    )  # fmt: skip
    control_plane("kube-scheduler")
    proxy_health = free_port()
    proxy = spawn("kube-proxy", [
        str(binaries / "kube-proxy"), "--config", str(_proxy_config(node, proxy_health)),
    ], work)  # fmt: skip
    node._processes.append(proxy)

    def others_alive() -> None:
        for process in node._processes:
            if not process.alive():
                raise NodeError(
                    f"{process.name} exited ({process.popen.returncode}); the end of"
                    f" {process.log}:\n{process.log_tail()}"
                )

    for process, check, what in (
        (kubelet, lambda: _node_ready(cluster, node.name), "the Node's Ready condition"),
        (controllers, lambda: _controllers_serve(cluster), "the default ServiceAccount"),
        (proxy, lambda: _healthy(f"http://127.0.0.1:{proxy_health}/healthz"), "kube-proxy"),
    ):
        wait_for(process, deadline, _checking(others_alive, check), what)
    node.timings.node = time.monotonic() - began


def _checking(alive: Callable[[], None], check: Callable[[], bool]) -> Callable[[], bool]:
    def both() -> bool:
        alive()
        return check()

    return both


# --- configuration -------------------------------------------------------------------------


def _socket() -> str:
    return str(NODE_RUN / "containerd.sock")


def _containerd_config(work: Path) -> Path:
    """containerd: its own root, state and socket, the CRI plugin with runc (cgroupfs) and
    the pods' network; nothing is ever pulled (the images are imported)."""
    cni = work / "cni"
    cni.mkdir(exist_ok=True)
    (cni / "10-poolkeeper.conflist").write_text(json.dumps(_cni_network(work), indent=2))
    cri = "io.containerd.grpc.v1.cri"
    config = {
        "version": 2,
        "root": str(NODE_ROOT / "containerd"),
        "state": str(NODE_RUN / "containerd"),
        "grpc": {"address": _socket()},
        "ttrpc": {"address": str(NODE_RUN / "containerd.ttrpc.sock")},
        "disabled_plugins": [
            "io.containerd.snapshotter.v1.aufs",
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.tracing.processor.v1.otlp",
            "io.containerd.internal.v1.tracing",
        ],
        "plugins": {
            cri: {
                "sandbox_image": _pause_reference(bin_dir() / "pause"),
                "disable_apparmor": True,
                "enable_selinux": False,
                # Lowering an oom_score_adj needs CAP_SYS_RESOURCE, which root lacks on
                # these machines (runc: "failed to update /proc/self/oom_score_adj:
                # Permission denied"): no container goes below containerd's own.
                "restrict_oom_score_adj": True,
                "containerd": {
                    "snapshotter": "overlayfs",
                    "default_runtime_name": "runc",
                    "runtimes": {
                        "runc": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"SystemdCgroup": False, "BinaryName": shutil.which("runc")},
                        }
                    },
                },
                "cni": {"bin_dir": "/usr/lib/cni", "conf_dir": str(cni), "max_conf_num": 1},
            }
        },
    }
    path = work / "containerd.toml"
    path.write_text(_toml(config))
    return path


def _cni_network(work: Path) -> dict[str, Any]:
    """A bridge with the pods' addresses; the bridge is their gateway to the host."""
    return {
        "cniVersion": "1.0.0",
        "name": "poolkeeper-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,  # the pods reach this machine's addresses only
                "hairpinMode": True,  # a pod reaches itself through its Service
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(work / "cni-addresses"),
                },
            }
        ],
    }


def _kubelet_config(node: KubeNode) -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine has cgroup v1 hierarchies: deprecated, refused by default since 1.35.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": RUNTIME_ENDPOINT,
        "address": node.address,
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": free_port(),
        # The API server's requests (logs, exec, port-forward) with its client certificate.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(node.cluster.client_ca[0])},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(node.workdir / "pod-logs"),
        "failSwapOn": False,
        # A shared test machine's disk may be fuller than a node's would be: evict nothing,
        # collect no image.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 30,
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "2s",
        "shutdownGracePeriod": "0s",
    }
    path = node.workdir / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _proxy_config(node: KubeNode, health_port: int) -> Path:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(node.cluster.admin_kubeconfig)},
        "hostnameOverride": node.name,
        "bindAddress": node.address,
        "healthzBindAddress": f"127.0.0.1:{health_port}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}",
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        # Leave this machine's conntrack settings and loopback routing as they are.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"localhostNodePorts": False, "minSyncPeriod": "0s", "syncPeriod": "10s"},
    }
    path = node.workdir / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _toml(config: dict[str, Any], prefix: str = "") -> str:
    """The TOML of nested dicts of strings, numbers, booleans and lists of strings (enough
    for containerd's configuration; the standard library only reads TOML)."""
    scalars, tables = [], []
    for key, value in config.items():
        if isinstance(value, dict):
            name = f"{prefix}.{_toml_key(key)}" if prefix else _toml_key(key)
            tables.append(f"\n[{name}]\n" + _toml(value, name))
        else:
            scalars.append(f"{_toml_key(key)} = {json.dumps(value)}\n")
    return "".join(scalars) + "".join(tables)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


# --- the pause image -----------------------------------------------------------------------


def _pause_reference(binary: Path) -> str:
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:12]
    return f"localhost/poolkeeper-pause:{digest}"


def _pause_archive(binary: Path, reference: str, work: Path) -> Path:
    """An OCI image archive of one layer, /pause, run as 65535 (as Kubernetes' own)."""
    layer_bytes = io.BytesIO()
    with tarfile.open(fileobj=layer_bytes, mode="w", format=tarfile.PAX_FORMAT) as layer:
        info = tarfile.TarInfo("pause")
        info.size, info.mode = binary.stat().st_size, 0o755
        with binary.open("rb") as source:
            layer.addfile(info, source)
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_descriptor = blob(layer_bytes.getvalue(), "application/vnd.oci.image.layer.v1.tar")
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [layer_descriptor["digest"]]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [layer_descriptor],
    }
    manifest_descriptor = blob(
        json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json"
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            dict(manifest_descriptor, annotations={"org.opencontainers.image.ref.name": reference})
        ],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
        **{f"blobs/sha256/{d.removeprefix('sha256:')}": data for d, data in blobs.items()},
    }
    archive = work / "pause.tar"
    with tarfile.open(archive, "w") as out:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return archive


# --- checks --------------------------------------------------------------------------------


def _containerd_answers() -> bool:
    if not Path(_socket()).exists():
        return False
    result = subprocess.run(
        ["ctr", "--address", _socket(), "version"], capture_output=True, timeout=10, check=False
    )
    return result.returncode == 0


def _node_ready(cluster: KubeCluster, name: str) -> bool:
    status, node = cluster.request("GET", f"/api/v1/nodes/{name}", timeout=5)
    if status != 200:
        return False
    conditions = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _controllers_serve(cluster: KubeCluster) -> bool:
    """The controllers a pod needs have run: its namespace's ServiceAccount and the
    cluster's CA ConfigMap exist (in "default")."""
    paths = ("/api/v1/namespaces/default/serviceaccounts/default",
             "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")  # fmt: skip
    return all(cluster.request("GET", path, timeout=5)[0] == 200 for path in paths)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


# --- this machine ------------------------------------------------------------------------


def _take_lock(timeout: float) -> IO[bytes]:
    NODE_RUN.mkdir(parents=True, exist_ok=True)
    lock = (NODE_RUN / "lock").open("wb")
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
        except BlockingIOError as busy:
            if time.monotonic() > deadline:
                lock.close()
                raise NodeError(
                    f"another node runs on this machine ({NODE_RUN / 'lock'})"
                ) from busy
            time.sleep(1)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _make_bridge() -> None:
    """The pods' bridge with the node's address (the CNI plugin finds it and keeps it), and
    the route that keeps Service addresses on it (kube-proxy's rules translate them)."""
    prefix = POD_CIDR.split("/")[1]
    _run("ip", "link", "delete", BRIDGE)  # a killed run's (this one holds the lock)
    for argv in (
        ("ip", "link", "add", BRIDGE, "type", "bridge"),
        ("ip", "address", "add", f"{NODE_ADDRESS}/{prefix}", "dev", BRIDGE),
        ("ip", "link", "set", BRIDGE, "up"),
        ("ip", "route", "add", SERVICE_CIDR, "dev", BRIDGE),
    ):
        result = _run(*argv)
        if result.returncode != 0:
            raise NodeError(f"{' '.join(argv)}: {result.stderr}")


def _reset_runtime() -> None:
    """Stop and remove every pod sandbox (and so its containers, network and namespace)."""
    result = _run(str(bin_dir() / "cri-reset"), RUNTIME_ENDPOINT)
    if result.returncode != 0:
        raise NodeError(f"cri-reset: {result.stderr}")


def _clear_host(*, keep_bridge: bool = False) -> None:
    """What a node's pods leave on this machine once their runtime is stopped, gone: mounts
    under its folders, the kubelet's folder, kube-proxy's and the kubelet's iptables rules,
    the bridge (unless kept). A no-op when there is none."""
    for folder in (NODE_ROOT / "kubelet", NODE_RUN):
        _unmount_under(folder)
    shutil.rmtree(NODE_ROOT / "kubelet", ignore_errors=True)
    _run(str(bin_dir() / "kube-proxy"), "--cleanup")
    _clear_kubelet_rules()
    if not keep_bridge:
        _run("ip", "link", "delete", BRIDGE)


def _shims() -> list[int]:
    """The pids of the node's containerd's shims (their command line names its socket)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"containerd-shim" in cmdline[0] and _socket().encode() in cmdline:
            found.append(int(entry.name))
    return found


def _kill_shims() -> None:
    """containerd's shims outlive it: any left once the node's pods are removed go."""
    for pid in _shims():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def _mounts(folder: Path) -> list[str]:
    """The mount points at ``folder`` (the kubelet mounts its folder on itself) or under it."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    return [p for p in points if p == str(folder) or p.startswith(f"{folder}/")]


def _unmount_under(folder: Path) -> None:
    for point in sorted(_mounts(folder), reverse=True):
        _run("umount", "--lazy", point)


# The kubelet's own iptables chains (beside kube-proxy's, which `kube-proxy --cleanup`
# removes): (table, chain), and the built-in chains that jump to one.
KUBELET_CHAINS: Final = (
    ("filter", "KUBE-FIREWALL"),
    ("filter", "KUBE-KUBELET-CANARY"),
    ("nat", "KUBE-KUBELET-CANARY"),
    ("mangle", "KUBE-KUBELET-CANARY"),
    ("mangle", "KUBE-IPTABLES-HINT"),
)
KUBELET_JUMPS: Final = (("filter", "INPUT", "KUBE-FIREWALL"), ("filter", "OUTPUT", "KUBE-FIREWALL"))
IPTABLES: Final = ("iptables", "ip6tables")


def _clear_kubelet_rules() -> None:
    for command in IPTABLES:
        for table, chain, target in KUBELET_JUMPS:
            while _run(command, "-t", table, "-D", chain, "-j", target).returncode == 0:
                pass
        for table, chain in KUBELET_CHAINS:
            _run(command, "-t", table, "-F", chain)
            _run(command, "-t", table, "-X", chain)


def _kube_chains() -> list[str]:
    """The KUBE-* iptables chains of this machine, "command table chain"."""
    found = []
    for command in IPTABLES:
        for table in ("filter", "nat", "mangle"):
            for rule in _run(command, "-t", table, "-S").stdout.splitlines():
                if rule.startswith("-N KUBE-"):
                    found.append(f"{command} {table} {rule.split()[1]}")
    return found


def _read_sysctl(name: str) -> str:
    try:
        return (Path("/proc/sys") / name).read_text().strip()
    except OSError:
        return ""


def _write_sysctl(name: str, value: str) -> None:
    if value:
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(value + "\n")
