"""`poolkeeper demo`: the simulator and the controller on free loopback ports, a scripted
story with a live table, and the invariants checked after every step.

Exit 0 when every invariant held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from controller.api.routes import pool_summaries
from controller.core.runner_ids import META_POOL
from controller.core.views import RunnerState
from controller.errors import EXIT_FAILURE, EXIT_OK
from controller.lab.invariants import NomadJob, PoolSnapshot, check_invariants
from controller.lab.simulator import SimServer, Simulator, start_sim
from controller.nomad.config import NomadConfig
from controller.standalone import Controller, Settings
from controller.status_command import pools_table

EXAMPLES = Path(__file__).resolve().parent / "examples" / "pools.yaml"
SETTLE_SECONDS = 20.0
START_DELAY = 0.3
RESYNC_SECONDS = 2.0


@dataclass
class Story:
    controller: Controller
    sim: Simulator
    server: SimServer
    pools_file: Path
    console: Console
    log: list[tuple[str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic
    # When the step being played began: when the one before it had settled.
    step_began: float = field(init=False)

    def __post_init__(self) -> None:
        self.step_began = self.clock()

    def say(self, step: str, outcome: str = "…") -> None:
        self.log.append((step, outcome))

    def table(self, last: int | None = 12) -> Group:
        """The pools, and the story's last steps (every step with `last=None`)."""
        pools = pools_table(pool_summaries(self.controller.directory))
        steps = Table(title="story", show_header=False, expand=False)
        steps.add_column("step")
        steps.add_column("outcome")
        for step, outcome in self.log if last is None else self.log[-last:]:
            style = "green" if outcome.startswith("ok") else "red" if "violat" in outcome else ""
            steps.add_row(step, Text(outcome, style=style))
        return Group(pools, steps)

    async def snapshot(self) -> tuple[list[PoolSnapshot], list[NomadJob]]:
        engine = self.controller.engine
        for namespace in engine.namespaces():
            await engine.reconcile_namespace(namespace)
        pools = []
        for managed in engine.pools.values():
            runners = managed.runners
            pools.append(
                PoolSnapshot(
                    key=managed.key,
                    desired_idle=managed.policy.desired_idle,
                    max_runners=managed.policy.max_runners,
                    idle=sum(r.state in (RunnerState.IDLE, RunnerState.OUTDATED) for r in runners),
                    total=len(runners),
                    runner_ids=frozenset(r.id for r in runners),
                )
            )
        jobs = []
        for namespace in engine.namespaces():
            for stub in await self.controller.client.list_jobs(namespace):
                pool = (stub.get("Meta") or {}).get(META_POOL)
                if pool:
                    live = stub.get("Status") != "dead" and not stub.get("Stop")
                    jobs.append(NomadJob(stub["ID"], pool, live))
        return pools, jobs

    async def settle(
        self, step: str, extra: Callable[[], Awaitable[list[str]]] | None = None
    ) -> bool:
        """Wait until the invariants hold (bounded); record the outcome of the step and
        how long it took, its action (played since the step before settled) included."""
        self.say(step)
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            pools, jobs = await self.snapshot()
            violations = check_invariants(pools, jobs)
            if extra is not None:
                violations += await extra()
            if not violations:
                self.log[-1] = (step, f"ok in {self.clock() - self.step_began:.1f} s")
                self.step_began = self.clock()
                return True
            if time.monotonic() > deadline:
                self.log[-1] = (step, "invariants violated: " + "; ".join(violations))
                self.violations += [f"{step}: {v}" for v in violations]
                self.step_began = self.clock()
                return False
            await asyncio.sleep(0.25)

    async def edit_pools(self, change: Callable[[list[dict[str, object]]], None]) -> None:
        documents = list(yaml.safe_load_all(self.pools_file.read_text()))
        change(documents)
        self.pools_file.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        await self.controller.reload()  # what SIGHUP does


async def play(story: Story) -> None:
    engine = story.controller.engine
    await story.settle("pools fill to their idle counts")

    idle = [r for m in engine.pools.values() for r in m.runners if r.state is RunnerState.IDLE][:3]
    for runner in idle:
        assert runner.allocation is not None
        await story.sim.reschedule_allocation(runner.allocation.id)
    await story.settle(f"instant reschedule of {len(idle)} idle runners (the Poseidon seed order)")

    on_node = Counter(
        r.allocation.node_name for m in engine.pools.values() for r in m.runners if r.allocation
    )
    node, count = on_node.most_common(1)[0]
    await story.sim.node_down(node)
    await story.settle(f"node {node} goes down with {count} runners; they are replaced")

    await claims_step(story)
    await executions_step(story)

    first = sorted(engine.pools)[0]

    def scale(count: int) -> Callable[[list[dict[str, object]]], None]:
        def change(documents: list[dict[str, object]]) -> None:
            for document in documents:
                metadata = document["metadata"]
                assert isinstance(metadata, dict)
                if f"{metadata.get('namespace', 'default')}/{metadata['name']}" == first:
                    spec = document["spec"]
                    assert isinstance(spec, dict)
                    spec["idleRunners"] = count

        return change

    desired = engine.pools[first].policy.desired_idle
    await story.edit_pools(scale(desired + 3))
    await story.settle(f"scale {first} up to {desired + 3}")
    await story.edit_pools(scale(max(1, desired - 1)))
    await story.settle(f"scale {first} down to {max(1, desired - 1)}")

    def new_image(documents: list[dict[str, object]]) -> None:
        for document in documents:
            spec = document["spec"]
            assert isinstance(spec, dict)
            runner = spec["runner"]
            assert isinstance(runner, dict)
            runner["image"] = f"{runner['image']}-patched"

    await story.edit_pools(new_image)

    async def rolled_out() -> list[str]:
        return [
            f"pool {m.key} still has {sum(r.state is RunnerState.OUTDATED for r in m.runners)} "
            "outdated runners"
            for m in engine.pools.values()
            if any(r.state is RunnerState.OUTDATED for r in m.runners)
        ]

    await story.settle("the image changes; runners roll over", rolled_out)


async def claims_step(story: Story) -> None:
    """Two clients claim runners through the HTTP API; one keeps its runner alive, the
    other releases it. Replacements keep every pool at its idle count."""
    controller = story.controller
    key = sorted(controller.engine.pools)[-1]
    namespace, name = key.split("/", 1)
    async with aiohttp.ClientSession(controller.url) as http:
        claimed = []
        for _ in range(2):
            async with http.post(f"/v1/pools/{namespace}/{name}/claims", json={}) as response:
                if response.status != 201:
                    story.violations.append(f"claim answered {response.status}")
                    return
                claimed.append(await response.json())
        first, second = (c["runnerId"] for c in claimed)
        async with http.post(f"/v1/runners/{first}/keepalive") as response:
            kept = response.status
        async with http.delete(f"/v1/runners/{second}") as response:
            released = response.status
        async with http.delete(f"/v1/runners/{second}") as response:
            again = (response.status, (await response.json())["error"].get("reason"))
    if (kept, released, again) != (200, 204, (410, "Released")):
        story.violations.append(
            f"claim API: keepalive {kept}, release {released}, second release {again}"
        )

    async def one_claimed() -> list[str]:
        claimed_now = [
            r.id for r in controller.engine.pools[key].runners if r.state is RunnerState.CLAIMED
        ]
        return [] if claimed_now == [first] else [f"claimed runners {claimed_now}, want [{first}]"]

    await story.settle(
        f"two clients claim from {key}; one keeps its runner, one releases it", one_claimed
    )


# The program the demo runs in a runner: it reads its input file and a name on stdin,
# prints as it goes, and writes an output file.
PROGRAM = """\
import sys, time
numbers = [int(word) for word in open("input.txt").read().split()]
name = sys.stdin.readline().strip()
print(f"hello {name}, adding {len(numbers)} numbers", flush=True)
total = 0
for number in numbers:
    total += number
    print(f"  running total {total}", flush=True)
    time.sleep(0.1)
open("output.txt", "w").write(f"{name}: {total}\\n")
"""
PROGRAM_INPUT = "3 5 8 13 21\n"
PYTHON_POOL = "default/python-312"  # of the example pools


async def executions_step(story: Story) -> None:
    """A client runs code in a claimed runner through the API: uploads a program and its
    input, runs it with a streamed execution (stdin sent, output shown as it comes),
    lists and downloads what it wrote, hits a time limit once, and releases the runner."""
    controller = story.controller
    namespace, name = PYTHON_POOL.split("/", 1)
    problems: list[str] = []
    async with aiohttp.ClientSession(controller.url) as http:
        async with http.post(f"/v1/pools/{namespace}/{name}/claims", json={}) as response:
            if response.status != 201:
                story.violations.append(f"claim for executions answered {response.status}")
                return
            runner = (await response.json())["runnerId"]
        files = {
            "files": [
                {"path": "main.py", "content": _b64(PROGRAM)},
                {"path": "input.txt", "content": _b64(PROGRAM_INPUT)},
            ]
        }
        async with http.put(f"/v1/runners/{runner}/files", json=files) as response:
            if response.status != 204:
                problems.append(f"upload answered {response.status}")
        await story.settle(f"upload main.py and input.txt to {runner}", _none(problems))

        # The simulator runs commands on this machine: its Python is the demo's own.
        run = {"command": [sys.executable, "main.py"], "timeLimitSeconds": 30}
        ended = await _stream(story, http, runner, run, stdin="demo\n")
        if ended != {"type": "exit", "exitCode": 0}:
            problems.append(f"main.py ended with {ended}")
        await story.settle("main.py ran, streamed: stdin sent, output shown live", _none(problems))

        async with http.get(f"/v1/runners/{runner}/files") as response:
            listed = [entry["path"] for entry in (await response.json()).get("files", [])]
        async with http.get(
            f"/v1/runners/{runner}/files/content", params={"path": "output.txt"}
        ) as response:
            output = (await response.read()).decode()
        if "output.txt" not in listed or output != "demo: 50\n":
            problems.append(f"listing {listed}, output.txt {output!r}")
        await story.settle(
            f"list the files, download output.txt: {output.strip()!r}", _none(problems)
        )

        ended = await _stream(story, http, runner, {"command": "sleep 60", "timeLimitSeconds": 1})
        if ended != {"type": "timeout"}:
            problems.append(f"sleep 60 with a 1 s limit ended with {ended}")
        await story.settle("sleep 60 with a time limit of 1 s: killed", _none(problems))

        async with http.delete(f"/v1/runners/{runner}") as response:
            if response.status != 204:
                problems.append(f"release answered {response.status}")
    await story.settle(f"release {runner}", _none(problems))


async def _stream(
    story: Story,
    http: aiohttp.ClientSession,
    runner: str,
    body: dict[str, object],
    stdin: str | None = None,
) -> dict[str, object] | None:
    """A streamed execution to its end, its output shown as it comes; its last frame."""
    async with http.post(f"/v1/runners/{runner}/executions", json=body) as response:
        if response.status != 201:
            return {"status": response.status}
        created = await response.json()
    last: dict[str, object] | None = None
    async with http.ws_connect(created["streamUrl"]) as ws:
        if stdin is not None:
            await ws.send_json({"type": "stdin", "data": stdin})
            await ws.send_json({"type": "stdinClose"})
        async for message in ws:
            last = message.json()
            if last["type"] in ("stdout", "stderr"):
                for line in str(last["data"]).splitlines():
                    if line.strip():
                        story.say(f"  │ {line.strip()}", "")
    return last


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _none(problems: list[str]) -> Callable[[], Awaitable[list[str]]]:
    async def check() -> list[str]:
        return list(problems)

    return check


async def run_demo(console: Console) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="poolkeeper-demo-"))
    try:
        pools_file = workdir / "pools.yaml"
        shutil.copy(EXAMPLES, pools_file)
        sim = Simulator(seed=7, start_delay=START_DELAY, exec_mode="local")
        server = await start_sim(sim, host="127.0.0.1", port=0)
        settings = Settings(
            pools_path=pools_file,
            listen=("127.0.0.1", 0),
            resync_seconds=RESYNC_SECONDS,
            insecure_no_auth=True,
        )
        controller = Controller(settings, NomadConfig.from_env({"NOMAD_ADDR": server.url}))
        story = Story(controller, sim, server, pools_file, console)
        await controller.start()
        console.print(f"simulator at {server.url}, controller at {controller.url}")
        try:
            with Live(story.table(), console=console, refresh_per_second=4) as live:
                refresher = asyncio.create_task(_refresh(live, story))
                try:
                    await play(story)
                finally:
                    refresher.cancel()
                live.update(story.table(last=None))
            console.print()
        finally:
            await controller.stop()
            await server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if story.violations:
        console.print("[red]invariants violated:[/red]")
        for violation in story.violations:
            console.print(f"  {violation}")
        return EXIT_FAILURE
    console.print("[green]every invariant held[/green]")
    return EXIT_OK


async def _refresh(live: Live, story: Story) -> None:
    while True:
        live.update(story.table())
        await asyncio.sleep(0.25)


def main(_: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    if not console.is_terminal:  # logs and CI: wide enough that the tables do not wrap
        console = Console(width=110)
    return asyncio.run(run_demo(console))
