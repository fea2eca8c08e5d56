"""The soak's processes against the simulator: controllers (`python -m controller run`),
each with its own pools file, operators (`python -m controller operator`) reading the same
pools as RunnerPools from a real kube-apiserver, and API replicas (`python -m controller
api`); each with its own port and logs."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from controller.lab.chaos.world import NAMESPACE, POOLS, PoolSpec
from controller.lab.kube import REPO, KubeCluster, start_cluster

TOKEN = "chaos-token"
RESYNC_SECONDS = 2.0
# The second controller reconciles the same pools with this many more idle runners: were
# it ever to write a pool it does not hold, the pools would not converge.
RIVAL_EXTRA_IDLE = 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pool_documents(pools: tuple[PoolSpec, ...], extra_idle: int = 0) -> list[dict[str, Any]]:
    """The soak's pools as RunnerPool documents, `extra_idle` more idle runners each."""
    return [
        {
            "apiVersion": "poolkeeper.dev/v1alpha1",
            "kind": "RunnerPool",
            "metadata": {"name": p.name, "namespace": NAMESPACE},
            "spec": {
                "idleRunners": p.idle + extra_idle,
                "maxRunners": p.max_runners,
                "startupTimeoutSeconds": 10,
                "claims": {"defaultInactivityTimeoutSeconds": 30},
                "runner": {"image": f"{p.name}:latest"},
            },
        }
        for p in pools
    ]


RUNNERPOOL_CRD = REPO / "crds" / "runnerpools.poolkeeper.dev.yaml"


async def kube_with_pools(
    workdir: Path, pools: tuple[PoolSpec, ...], extra_idle: int = 0
) -> KubeCluster:
    """A kube-apiserver on loopback serving `pools` as RunnerPool resources, for operator
    processes (the caller stops it)."""

    def start() -> KubeCluster:
        kube = start_cluster(workdir=workdir)
        try:
            kube.install_crds(RUNNERPOOL_CRD)
            for document in pool_documents(pools, extra_idle):
                namespace = document["metadata"]["namespace"]
                path = f"/apis/poolkeeper.dev/v1alpha1/namespaces/{namespace}/runnerpools"
                status, answer = kube.request("POST", path, document)
                if status != 201:
                    raise RuntimeError(f"creating RunnerPool {document['metadata']}: {answer}")
        except BaseException:
            kube.stop()
            raise
        return kube

    return await asyncio.to_thread(start)


def pools_file(folder: Path, extra_idle: int, pools: tuple[PoolSpec, ...] = POOLS) -> Path:
    """The soak's pools in a pools file, `extra_idle` more idle runners each."""
    path = folder / "pools.yaml"
    path.write_text(yaml.safe_dump_all(pool_documents(pools, extra_idle)))
    return path


class ControllerProcess:
    """`python -m controller run` against the simulator; SIGKILLed, stopped, restarted."""

    name = "controller"  # of its logs and its exits

    def __init__(
        self,
        workdir: Path,
        sim_url: str,
        port: int,
        pools_file: Path | None,
        name: str | None = None,
    ) -> None:
        self.name = name or self.name
        self.workdir = workdir
        self.sim_url = sim_url
        self.port = port
        self.pools_file = pools_file
        self.token_file = workdir / "tokens"
        self.token_file.write_text(TOKEN + "\n")
        self.proc: asyncio.subprocess.Process | None = None
        self.incarnation = 0
        self.started_at = 0.0
        self.logs: list[Path] = []
        self.identities: list[str] = []  # every incarnation's
        self.unexpected_exits: list[str] = []
        self.stopping = False
        self._watch: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def arguments(self) -> list[str]:
        """The command after `python -m controller`."""
        return ["run", "--pools", str(self.pools_file), *self.serving_arguments()]

    def serving_arguments(self) -> list[str]:
        """Where it listens, how often it resyncs, its API token: the same for each kind."""
        return [
            "--listen",
            f"127.0.0.1:{self.port}",
            "--resync-seconds",
            str(RESYNC_SECONDS),
            "--api-token-file",
            str(self.token_file),
        ]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NOMAD_", "POOLKEEPER_"))}
        env["NOMAD_ADDR"] = self.sim_url
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def identity(self) -> str | None:
        """The running incarnation's identity, as its leases and Nomad's write audit name
        it (None when it is down)."""
        return None if self.proc is None else self.identities[-1]

    async def start(self) -> None:
        self.incarnation += 1
        log_path = self.workdir / f"{self.name}-{self.incarnation}.log"
        self.logs.append(log_path)
        env = self.environment()
        with log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "controller",
                *self.arguments(),
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.identities.append(f"{socket.gethostname()}/{self.proc.pid}")
        self.started_at = time.monotonic()
        self._watch = asyncio.create_task(self._watch_exit(self.proc, self.incarnation))

    async def _watch_exit(self, proc: asyncio.subprocess.Process, incarnation: int) -> None:
        code = await proc.wait()
        if self.proc is not proc:
            return  # the driver killed or stopped it
        self.unexpected_exits.append(
            f"{self.name} incarnation {incarnation} exited by itself with code {code}"
        )
        # As a supervisor (systemd, Kubernetes) would: start it again after a second.
        await asyncio.sleep(1.0)
        if not self.stopping and self.proc is proc:
            await self.start()

    async def kill(self) -> None:
        """SIGKILL: no chance to clean up, as after a node crash."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()

    async def terminate(self) -> float:
        """SIGTERM, as a rolling restart does; the seconds until the process exited."""
        proc, self.proc = self.proc, None
        started = time.monotonic()
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                self.unexpected_exits.append(f"{self.name} did not exit within 15 s of SIGTERM")
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
        return time.monotonic() - started

    async def ensure_running(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            await self.start()

    async def stop(self) -> None:
        self.stopping = True
        await self.terminate()
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)

    def tracebacks(self) -> list[str]:
        found = []
        for path in self.logs:
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            for number, line in enumerate(lines):
                if "Traceback (most recent call last)" in line:
                    tail = next(
                        (x for x in lines[number + 1 : number + 60] if not x.startswith(" ")),
                        "",
                    )
                    found.append(f"{path.name}:{number + 1}: traceback: {tail.strip()[:300]}")
        return found

    def error_lines(self) -> list[str]:
        found = []
        for path in self.logs:
            if path.exists():
                for line in path.read_text(errors="replace").splitlines():
                    if " ERROR " in line:
                        found.append(f"{path.name}: {line[:300]}")
        return found


class ApiReplica(ControllerProcess):
    """`python -m controller api`: an API replica, reading its pools from the catalog."""

    name = "api"

    def __init__(self, workdir: Path, sim_url: str, port: int) -> None:
        super().__init__(workdir, sim_url, port, None)

    def arguments(self) -> list[str]:
        return [
            "api",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--api-token-file",
            str(self.token_file),
        ]


class OperatorProcess(ControllerProcess):
    """`python -m controller operator` watching the RunnerPools of the soak's namespace in a
    kube-apiserver, as a chart's replica does. Each incarnation has an
    identity of its own (POD_NAME), as a pod its Deployment replaces does."""

    name = "operator"

    def __init__(self, workdir: Path, sim_url: str, port: int, kubeconfig: Path, name: str) -> None:
        super().__init__(workdir, sim_url, port, None, name)
        self.kubeconfig = kubeconfig

    def arguments(self) -> list[str]:
        return ["operator", "--namespace", NAMESPACE, *self.serving_arguments()]

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["POD_NAME"] = f"{self.name}-{self.incarnation}"
        return env

    async def start(self) -> None:
        await super().start()
        self.identities[-1] = f"{self.name}-{self.incarnation}"  # its POD_NAME
