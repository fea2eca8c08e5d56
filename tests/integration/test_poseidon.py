"""The Poseidon API (`run --poseidon-api`) against the simulator, called as CodeOcean calls
it: environments from labelled pools (readonly) or kept in Nomad (managed), claims and
releases, tokens and scopes, and Poseidon's answers to bad input, to the byte."""

from __future__ import annotations

import inspect
import json
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.api_tier import ApiTier
from controller.core.paths import RECONCILER_RECORDS
from controller.core.runner_ids import META_POOL
from controller.lab.simulator import SimServer
from controller.poseidon.context import EnvironmentMode, PoseidonSettings
from controller.standalone import Controller
from tests.support.documents import pool_doc
from tests.support.waiting import wait_until

from .conftest import TOKEN, FakeClock, Harness, write_pools
from .test_process import API_TOKEN, Process

LABEL = "poolkeeper.dev/poseidon-environment"
NO_RUNNER = b'{"message":"abstract manager wrapped: no runner found with this id"}'
NO_ENVIRONMENT = b'{"message":"nomad wrapped: execution environment not found"}'
OVERLOAD = (
    b'{"message":"no runners available for this execution environment",'
    b'"errorCode":"NOMAD_OVERLOAD"}'
)
PYTHON_IMAGE = "openhpi/co_execenv_python:3.8"
READONLY = PoseidonSettings(enabled=True)
MANAGED = PoseidonSettings(enabled=True, environments=EnvironmentMode.MANAGED)


def environment_pool(name: str, env_id: int, idle: int = 2, **spec: Any) -> dict[str, Any]:
    """A pool serving execution environment `env_id`, as CodeOcean's sync would describe:
    cpuLimit 20, memoryLimit 256, no network."""
    spec.setdefault("runner", {"image": PYTHON_IMAGE, "cpu": 20, "memoryMB": 256})
    document = pool_doc(name, idle, **spec)
    document["metadata"]["labels"] = {LABEL: str(env_id)}
    return document


def synced(
    env_id: int, *, image: str = PYTHON_IMAGE, size: int = 2, **fields: Any
) -> dict[str, Any]:
    """The body of CodeOcean's `sync_environment` (ExecutionEnvironment#to_json)."""
    return {
        "id": env_id,
        "image": image,
        "prewarmingPoolSize": size,
        "cpuLimit": 20,
        "memoryLimit": 256,
        "networkAccess": False,
        "exposedPorts": [],
        **fields,
    }


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


class CodeOcean:
    """Requests as CodeOcean's Poseidon strategy sends them: a JSON body, the
    `Content-Type: application/json` and `Poseidon-Token` headers on every request."""

    def __init__(self, http: aiohttp.ClientSession, server: Controller | ApiTier) -> None:
        self.http = http
        self.server = server
        self.base = server.url + "/api/v1"

    @property
    def controller(self) -> Controller:
        """The reconciling controller it talks to (not an API replica)."""
        assert isinstance(self.server, Controller)
        return self.server

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = TOKEN,
        raw: bytes | None = None,
        params: dict[str, str] | None = None,
    ) -> Answer:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Poseidon-Token"] = token
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        async with self.http.request(
            method, self.base + path, data=data, headers=headers, params=params
        ) as response:
            return Answer(response.status, await response.read(), dict(response.headers))

    async def claim(self, env_id: int, inactivity: int = 180, **kwargs: Any) -> Answer:
        body = {"executionEnvironmentId": env_id, "inactivityTimeout": inactivity}
        return await self.call("POST", "/runners", body, **kwargs)

    async def statistics(self) -> dict[str, Any]:
        answer = await self.call("GET", "/statistics/execution-environments")
        assert answer.status == 200
        stats: dict[str, Any] = answer.json()
        return stats


@pytest.fixture
async def http() -> Any:
    async with aiohttp.ClientSession() as session:
        yield session


async def start(
    harness: Harness,
    tmp_path: Path,
    *documents: dict[str, Any],
    poseidon: PoseidonSettings = READONLY,
    **kwargs: Any,
) -> Controller:
    pools = write_pools(tmp_path / "pools.yaml", *documents)
    controller = await harness.start(pools, poseidon=poseidon, **kwargs)
    await harness.settled(controller)
    return controller


async def after_passes(
    controller: Controller, check: Callable[[], bool | Awaitable[bool]], what: str
) -> None:
    """Wait until `check` holds after a pass over the pools (the engine's view, which the
    environments' counts come from, is one pass old)."""

    async def passed() -> bool:
        await controller.engine.reconcile_namespace("default")
        outcome = check()
        return await outcome if inspect.isawaitable(outcome) else outcome

    await wait_until(passed, what=what)


def client_records(harness: Harness) -> dict[str, Any]:
    """The variables clients' requests write (claims, request records, environments); not
    what reconcilers write on their own schedule (the catalog, member records)."""
    return {
        path: variable
        for path, variable in harness.sim.variables("default").items()
        if not path.startswith(RECONCILER_RECORDS)
    }


def still_claimed(harness: Harness, runner_id: str) -> bool:
    """Whether the runner's claim is live (`state` absent or `claimed`)."""
    return claim_of(harness, runner_id).get("state", "claimed") == "claimed"


def claim_of(harness: Harness, runner_id: str) -> dict[str, str]:
    variable = harness.sim.variables("default").get(f"poolkeeper/claims/{runner_id}")
    assert variable is not None, runner_id
    items: dict[str, str] = variable["Items"]
    return items


async def test_codeocean_against_labelled_pools(harness: Harness, tmp_path: Path, http) -> None:
    controller = await start(
        harness, tmp_path, environment_pool("python", 10), pool_doc("unlabelled", 1)
    )
    codeocean = CodeOcean(http, controller)

    # Health and version, as CodeOcean's admin dashboard reads them (no token needed).
    health = await codeocean.call("GET", "/health", token=None)
    assert (health.status, health.body) == (204, b"")
    version = await codeocean.call("GET", "/version", token=None)
    assert (version.status, version.json()) == (200, "poolkeeper@0.1.0")
    assert version.headers["Content-Type"] == "application/json"

    # The environments: only the labelled pool is one, its fields in Poseidon's order.
    listing = await codeocean.call("GET", "/execution-environments")
    assert listing.status == 200
    assert listing.body == (
        b'{"executionEnvironments":[{"prewarmingPoolSize":2,"cpuLimit":20,"memoryLimit":256,'
        b'"image":"openhpi/co_execenv_python:3.8","networkAccess":false,"exposedPorts":null,'
        b'"id":10}]}'
    )
    one = await codeocean.call("GET", "/execution-environments/10")
    assert one.json() == listing.json()["executionEnvironments"][0]
    unknown = await codeocean.call("GET", "/execution-environments/11")
    assert (unknown.status, unknown.body) == (404, b"")

    # CodeOcean syncs the environment it knows: it matches the pool, so 204.
    sync = await codeocean.call("PUT", "/execution-environments/10", synced(10))
    assert (sync.status, sync.body) == (204, b"")

    # Claim: CodeOcean sends max(unused_runner_expiration_time, permitted_execution_time).
    claimed = await codeocean.claim(10, 180)
    assert claimed.status == 200
    runner_id = claimed.json()["runnerId"]
    assert claimed.body == b'{"runnerId":"%s","mappedPorts":[]}' % runner_id.encode()
    items = claim_of(harness, runner_id)
    assert (items["pool"], items["inactivityTimeoutSeconds"]) == ("default/python", "180")

    expected = {"10": {"id": 10, "prewarmingPoolSize": 2, "idleRunners": 2, "usedRunners": 1}}

    async def refilled() -> bool:
        return await codeocean.statistics() == expected

    await after_passes(
        controller, refilled, "the claimed runner to count as used, and a new idle one"
    )

    # Destroy: 204, then the runner is unknown (CodeOcean ignores the 410).
    destroyed = await codeocean.call("DELETE", f"/runners/{runner_id}")
    assert (destroyed.status, destroyed.body) == (204, b"")
    assert claim_of(harness, runner_id)["state"] == "released"
    again = await codeocean.call("DELETE", f"/runners/{runner_id}")
    assert (again.status, again.body) == (410, NO_RUNNER)

    # A runner of a pool that serves no environment is unknown here.
    status, other = await harness.api(controller, "POST", "/v1/pools/default/unlabelled/claims", {})
    assert status == 201
    foreign = await codeocean.call("DELETE", f"/runners/{other['runnerId']}")
    assert (foreign.status, foreign.body) == (410, NO_RUNNER)
    assert still_claimed(harness, other["runnerId"])

    # An environment no pool serves: 404, and CodeOcean would sync it (409: read-only).
    missing = await codeocean.claim(99)
    assert (missing.status, missing.body) == (404, NO_ENVIRONMENT)
    sync = await codeocean.call("PUT", "/execution-environments/99", synced(99))
    assert sync.status == 409
    assert sync.json() == {
        "message": "no pool serves execution environment 99: give a pool the label "
        f'{LABEL}: "99" (environments are read-only here)'
    }
    await harness.settled(controller)


async def test_readonly_environments_are_checked_never_changed(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller = await start(harness, tmp_path, environment_pool("python", 10))
    codeocean = CodeOcean(http, controller)
    before = harness.sim.variables("default").keys(), await harness.jobs(controller)

    changed = await codeocean.call(
        "PUT", "/execution-environments/10", synced(10, image="python:3.13", size=4)
    )
    assert changed.status == 409
    assert changed.json() == {
        "message": "execution environment 10 is pool default/python, where image is "
        '"openhpi/co_execenv_python:3.8", not "python:3.13"; prewarmingPoolSize is 2, not 4: '
        "change the pool, not the environment"
    }
    deleted = await codeocean.call("DELETE", "/execution-environments/10")
    assert deleted.status == 409
    assert deleted.json() == {
        "message": "execution environment 10 is pool default/python: remove the pool or its "
        "label instead"
    }
    absent = await codeocean.call("DELETE", "/execution-environments/12")
    assert (absent.status, absent.body) == (404, b"")
    # Ports need network access to count, `[]` and null are the same, order does not matter.
    same = await codeocean.call(
        "PUT", "/execution-environments/10", synced(10, exposedPorts=[8080], id="ignored")
    )
    assert same.status == 204
    assert (harness.sim.variables("default").keys(), await harness.jobs(controller)) == before


async def test_network_and_memory_limits_compare_as_the_pool_runs_them(
    harness: Harness, tmp_path: Path, http
) -> None:
    runner = {
        "image": PYTHON_IMAGE, "cpu": 20, "memoryMB": 64, "memoryMaxMB": 256,
        "network": "bridge", "ports": [8080, 80],
    }  # fmt: skip
    controller = await start(harness, tmp_path, environment_pool("web", 7, runner=runner))
    codeocean = CodeOcean(http, controller)
    listed = (await codeocean.call("GET", "/execution-environments/7")).json()
    assert (listed["memoryLimit"], listed["networkAccess"], listed["exposedPorts"]) == (
        256,
        True,
        [8080, 80],
    )
    matching = synced(7, networkAccess=True, exposedPorts=[80, 8080])
    assert (await codeocean.call("PUT", "/execution-environments/7", matching)).status == 204
    closed = synced(7, exposedPorts=[80, 8080])
    assert (await codeocean.call("PUT", "/execution-environments/7", closed)).status == 409


async def test_an_empty_pool_is_nomad_overload_at_once(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller = await start(harness, tmp_path, environment_pool("python", 10, 1, maxRunners=1))
    codeocean = CodeOcean(http, controller)
    first = await codeocean.claim(10)
    assert first.status == 200
    # The only runner is claimed and maxRunners allows no other: Poseidon does not wait.
    second = await codeocean.claim(10)
    assert (second.status, second.body) == (500, OVERLOAD)
    assert second.headers["Content-Type"] == "application/json"


async def test_inactivity_timeouts(harness: Harness, tmp_path: Path, http) -> None:
    clock = FakeClock()
    document = environment_pool("python", 10, 2, claims={"maxInactivityTimeoutSeconds": 900})
    controller = await start(harness, tmp_path, document, clock=clock)
    codeocean = CodeOcean(http, controller)

    forever = await codeocean.claim(10, 0)  # Poseidon's "no timeout": the pool's maximum
    assert claim_of(harness, forever.json()["runnerId"])["inactivityTimeoutSeconds"] == "900"
    too_long = await codeocean.claim(10, 901)
    assert (too_long.status, too_long.json()) == (
        400,
        {
            "message": "inactivityTimeout 901 exceeds the maximum of execution environment "
            "10 (900 s)"
        },
    )
    negative = await codeocean.claim(10, -1)
    assert negative.json() == {"message": "inactivityTimeout -1 must not be negative"}

    short = await codeocean.claim(10, 30)
    runner_id = short.json()["runnerId"]
    clock.advance(31)
    expired = await codeocean.call("DELETE", f"/runners/{runner_id}")
    assert (expired.status, expired.body) == (410, NO_RUNNER)


async def test_the_token_guards_every_route_but_health_and_version(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller = await start(harness, tmp_path, environment_pool("python", 10))
    codeocean = CodeOcean(http, controller)
    runner_id = (await codeocean.claim(10)).json()["runnerId"]
    before = client_records(harness)
    routes = [
        ("GET", "/statistics/execution-environments", None),
        ("GET", "/execution-environments", None),
        ("GET", "/execution-environments/10", None),
        ("PUT", "/execution-environments/10", synced(10)),
        ("DELETE", "/execution-environments/10", None),
        ("POST", "/runners", {"executionEnvironmentId": 10}),
        ("DELETE", f"/runners/{runner_id}", None),
    ]
    for method, path, body in routes:
        for token in (None, "", "wrong-token"):
            refused = await codeocean.call(method, path, body, token=token)
            assert (refused.status, refused.body) == (401, b""), (method, path, token)
    # The poolkeeper API's header is not Poseidon's.
    async with http.get(
        controller.url + "/api/v1/execution-environments",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as response:
        assert response.status == 401
    assert client_records(harness) == before
    for path in ("/health", "/version"):
        assert (await codeocean.call("GET", path, token="wrong-token")).status in (200, 204)


async def start_with_a_java_token(harness: Harness, tmp_path: Path, idle: int = 2) -> Controller:
    """Environments 10 (pool python) and 20 (pool java), and besides the test's token
    `java-token`, whose scope is the java pool."""
    return await start(
        harness,
        tmp_path,
        environment_pool("python", 10, idle),
        environment_pool("java", 20, idle),
        tokens_text=f"{TOKEN}\njava-token default/java\n",
    )


async def test_a_scoped_token_sees_only_its_environments(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller = await start_with_a_java_token(harness, tmp_path)
    codeocean = CodeOcean(http, controller)
    python_runner = (await codeocean.claim(10)).json()["runnerId"]
    before = client_records(harness)

    listing = await codeocean.call("GET", "/execution-environments", token="java-token")
    assert [e["id"] for e in listing.json()["executionEnvironments"]] == [20]
    assert list(await _statistics(codeocean, "java-token")) == ["20"]
    hidden = await codeocean.call("GET", "/execution-environments/10", token="java-token")
    assert (hidden.status, hidden.body) == (404, b"")
    claim = await codeocean.claim(10, token="java-token")
    assert (claim.status, claim.body) == (404, NO_ENVIRONMENT)
    release = await codeocean.call("DELETE", f"/runners/{python_runner}", token="java-token")
    assert (release.status, release.body) == (410, NO_RUNNER)
    sync = await codeocean.call("PUT", "/execution-environments/10", synced(10), token="java-token")
    assert sync.status == 409 and sync.json()["message"].startswith("no pool serves")
    delete = await codeocean.call("DELETE", "/execution-environments/10", token="java-token")
    assert (delete.status, delete.body) == (404, b"")
    assert client_records(harness) == before  # the runner is still claimed

    java = await codeocean.claim(20, token="java-token")
    assert java.status == 200
    done = await codeocean.call("DELETE", f"/runners/{java.json()['runnerId']}", token="java-token")
    assert done.status == 204


async def _statistics(codeocean: CodeOcean, token: str) -> dict[str, Any]:
    answer = await codeocean.call("GET", "/statistics/execution-environments", token=token)
    stats: dict[str, Any] = answer.json()
    return stats


@pytest.mark.parametrize(
    ("method", "path", "raw", "status", "body"),
    [
        ("POST", "/runners", b"", 400, b'{"message":"EOF"}'),
        (
            "POST", "/runners", b'{"executionEnvironmentId": 10,', 400,
            b'{"message":"unexpected EOF"}',
        ),
        (
            "POST", "/runners", b'{"executionEnvironmentId": "10"}', 400,
            b'{"message":"json: cannot unmarshal string into Go struct field '
            b'RunnerRequest.executionEnvironmentId of type int"}',
        ),
        (
            "POST", "/runners", b"[10]", 400,
            b'{"message":"json: cannot unmarshal array into Go value of type dto.RunnerRequest"}',
        ),
        (
            "PUT", "/execution-environments/10", b'{"exposedPorts": [80, 70000]}', 400,
            b'{"message":"json: cannot unmarshal number 70000 into Go struct field '
            b'ExecutionEnvironmentRequest.exposedPorts of type uint16"}',
        ),
        (
            "PUT", "/execution-environments/10", b'{"prewarmingPoolSize": 1.5}', 400,
            b'{"message":"json: cannot unmarshal number 1.5 into Go struct field '
            b'ExecutionEnvironmentRequest.prewarmingPoolSize of type uint"}',
        ),
        (
            "GET", "/execution-environments/99999999999999999999", None, 400,
            b'{"message":"strconv.Atoi: parsing \\"99999999999999999999\\": value out of range"}',
        ),
        (
            "GET", "/execution-environments?fetch=maybe", None, 400,
            b'{"message":"could not parse fetch parameter: strconv.ParseBool: parsing '
            b'\\"maybe\\": invalid syntax"}',
        ),
        (
            "PUT", "/execution-environments/10", b'{"image": "' + b"x" * 70000 + b'"}', 413,
            b'{"message":"the request body is too large"}',
        ),
        ("GET", "/execution-environments/ten", None, 404, b""),
        ("GET", "/no-such-route", None, 404, b""),
        ("POST", "/health", None, 405, b""),
        ("PATCH", "/runners", None, 405, b""),
        ("DELETE", "/runners/python-000000000000", None, 410, NO_RUNNER),
        ("DELETE", "/runners/..%2F..%2Fv1%2Fpools", None, 410, NO_RUNNER),
    ],
)  # fmt: skip
async def test_bad_input_is_answered_as_poseidon_answers_it(
    harness: Harness, tmp_path: Path, http, method: str, path: str, raw: bytes | None,
    status: int, body: bytes,
) -> None:  # fmt: skip
    controller = await start(harness, tmp_path, environment_pool("python", 10))
    before = client_records(harness), await harness.jobs(controller)
    answer = await CodeOcean(http, controller).call(method, path, raw=raw)
    assert (answer.status, answer.body) == (status, body)
    assert (client_records(harness), await harness.jobs(controller)) == before


async def test_health_reports_a_depleting_prewarming_pool(
    harness: Harness, tmp_path: Path, http
) -> None:
    settings = PoseidonSettings(enabled=True, depleting_threshold=0.5)
    documents = environment_pool("python", 10, 2, maxRunners=2), environment_pool("java", 11, 0)
    controller = await start(harness, tmp_path, *documents, poseidon=settings)
    codeocean = CodeOcean(http, controller)
    assert (await codeocean.call("GET", "/health", token=None)).status == 204
    for _ in range(2):
        assert (await codeocean.claim(10)).status == 200

    async def depleting() -> bool:
        return (await codeocean.call("GET", "/health", token=None)).status == 503

    await after_passes(controller, depleting, "the pool of environment 10 to deplete")
    answer = await codeocean.call("GET", "/health", token=None)
    # Environment 11 keeps no prewarming pool, so it never depletes.
    assert answer.body == (
        b'{"message":"the prewarming pool is depleting: environments 10",'
        b'"errorCode":"PREWARMING_POOL_DEPLETING"}'
    )


async def test_without_the_flag_there_is_no_poseidon_api(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller = await start(
        harness, tmp_path, environment_pool("python", 10), poseidon=PoseidonSettings()
    )
    answer = await CodeOcean(http, controller).call("GET", "/health")
    assert answer.status == 404
    assert answer.json()["error"]["code"] == "NotFound"


# ---- managed environments ----------------------------------------------------------------


def images(harness: Harness, prefix: str) -> dict[str, str]:
    """Runner job ID -> its image, for the live runner jobs of a job prefix."""
    found = {}
    for job in harness.sim.job_list("default"):
        if job["ID"].startswith(prefix) and not job.get("Stop") and job.get("Status") != "dead":
            found[job["ID"]] = job["TaskGroups"][0]["Tasks"][0]["Config"]["image"]
    return found


async def managed_with_a_claim(
    harness: Harness, tmp_path: Path, http: aiohttp.ClientSession
) -> tuple[Controller, CodeOcean, str]:
    """A controller with managed environment 11 (2 idle runners), one of them claimed."""
    controller = await start(harness, tmp_path, poseidon=MANAGED)
    codeocean = CodeOcean(http, controller)
    assert (await codeocean.call("PUT", "/execution-environments/11", synced(11))).status == 201
    await harness.settled(controller)
    runner_id = (await codeocean.claim(11, 600)).json()["runnerId"]
    return controller, codeocean, runner_id


def idle_runners_run(harness: Harness, image: str, claimed: str) -> bool:
    """Whether managed environment 11's two idle runners (all but `claimed`) run `image`."""
    running = images(harness, "environment-11-")
    idle = {job: found for job, found in running.items() if job != claimed}
    return len(idle) == 2 and set(idle.values()) == {image}


async def test_managed_environments_are_pools_kept_in_nomad(
    harness: Harness, tmp_path: Path, http
) -> None:
    tokens = f"{TOKEN}\nmanaged-only poseidon/*\nfiles-only default/*\n"
    controller = await start(
        harness, tmp_path, environment_pool("python", 10), poseidon=MANAGED, tokens_text=tokens
    )
    codeocean = CodeOcean(http, controller)

    created = await codeocean.call("PUT", "/execution-environments/11", synced(11, size=3))
    assert (created.status, created.body) == (201, b"")
    variable = harness.sim.variables("default")["poolkeeper/environments/11"]
    assert variable["Items"] == {
        "image": PYTHON_IMAGE, "prewarmingPoolSize": "3", "cpuLimit": "20",
        "memoryLimit": "256", "networkAccess": "false", "exposedPorts": "",
    }  # fmt: skip
    await harness.settled(controller)
    assert len(images(harness, "environment-11-")) == 3
    assert (await codeocean.statistics())["11"]["idleRunners"] == 3
    replaced = await codeocean.call("PUT", "/execution-environments/11", synced(11, size=3))
    assert (replaced.status, replaced.body) == (204, b"")
    listing = await codeocean.call("GET", "/execution-environments")
    assert [e["id"] for e in listing.json()["executionEnvironments"]] == [10, 11]

    # A pool of the files stays the files': checked, never replaced or deleted.
    changed = await codeocean.call("PUT", "/execution-environments/10", synced(10, size=5))
    assert changed.status == 409
    assert (await codeocean.call("DELETE", "/execution-environments/10")).status == 409
    # A token that does not cover the file pool cannot make a managed copy of it either.
    hidden = await codeocean.call(
        "PUT", "/execution-environments/10", synced(10), token="managed-only"
    )
    assert hidden.json() == {"message": "this token may not act on execution environment 10"}
    outside = await codeocean.call(
        "PUT", "/execution-environments/13", synced(13), token="files-only"
    )
    assert outside.json() == {"message": "this token may not act on pool poseidon/environment-13"}
    # An environment that makes no pool changes nothing.
    invalid = await codeocean.call("PUT", "/execution-environments/12", synced(12, cpuLimit=0))
    assert invalid.json() == {"message": "cpuLimit: input should be greater than or equal to 1"}
    assert "poolkeeper/environments/12" not in harness.sim.variables("default")

    runner_id = (await codeocean.claim(11)).json()["runnerId"]
    assert claim_of(harness, runner_id)["pool"] == "poseidon/environment-11"


async def test_a_managed_image_change_rolls_idle_runners_and_keeps_claimed_ones(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller, codeocean, runner_id = await managed_with_a_claim(harness, tmp_path, http)
    new_image = "openhpi/co_execenv_python:3.12"
    updated = await codeocean.call("PUT", "/execution-environments/11", synced(11, image=new_image))
    assert updated.status == 204

    await after_passes(
        controller,
        lambda: idle_runners_run(harness, new_image, runner_id),
        "the idle runners to roll over to the new image",
    )
    # Unlike Poseidon's PUT, the learner's runner lives on, untouched and still claimed.
    assert images(harness, "environment-11-")[runner_id] == PYTHON_IMAGE
    assert still_claimed(harness, runner_id)
    environment = (await codeocean.call("GET", "/execution-environments/11")).json()
    assert environment["image"] == new_image
    assert (await codeocean.call("DELETE", f"/runners/{runner_id}")).status == 204
    await harness.settled(controller)


async def test_deleting_a_managed_environment_drains_it(
    harness: Harness, tmp_path: Path, http
) -> None:
    controller, codeocean, runner_id = await managed_with_a_claim(harness, tmp_path, http)
    deleted = await codeocean.call("DELETE", "/execution-environments/11")
    assert (deleted.status, deleted.body) == (204, b"")
    assert "poolkeeper/environments/11" not in harness.sim.variables("default")
    gone = await codeocean.call("GET", "/execution-environments/11")
    assert (gone.status, gone.body) == (404, b"")
    assert (await codeocean.claim(11)).body == NO_ENVIRONMENT

    await after_passes(
        controller,
        lambda: set(images(harness, "environment-11-")) == {runner_id},
        "the idle runners to be drained",
    )
    # The drain keeps the claimed runner until it is released (or the drain times out).
    assert (await codeocean.call("DELETE", f"/runners/{runner_id}")).status == 204

    await after_passes(
        controller, lambda: not images(harness, "environment-11-"), "the drained pool to be gone"
    )
    again = await codeocean.call("DELETE", "/execution-environments/11")
    assert (again.status, again.body) == (404, b"")


async def test_a_restarted_controller_serves_the_environments_nomad_keeps(
    harness: Harness, tmp_path: Path, http
) -> None:
    first = await start(harness, tmp_path, poseidon=MANAGED)
    codeocean = CodeOcean(http, first)
    assert (await codeocean.call("PUT", "/execution-environments/11", synced(11))).status == 201
    await harness.settled(first)
    jobs = set(images(harness, "environment-11-"))
    await harness.stop(first)

    # With --prune the environments are read before the first pass: their runners are
    # never taken for orphans.
    second = await start(harness, tmp_path, poseidon=MANAGED, prune=True)
    restarted = CodeOcean(http, second)
    environment = (await restarted.call("GET", "/execution-environments/11")).json()
    assert environment == {
        "prewarmingPoolSize": 2, "cpuLimit": 20, "memoryLimit": 256, "image": PYTHON_IMAGE,
        "networkAccess": False, "exposedPorts": None, "id": 11,
    }  # fmt: skip
    await harness.settled(second)
    assert set(images(harness, "environment-11-")) == jobs  # the same runners, none replaced
    assert {job["Meta"][META_POOL] for job in await harness.jobs(second)} == {
        "poseidon/environment-11"
    }


async def test_a_variable_edited_into_nonsense_keeps_the_last_valid_pool(
    harness: Harness, tmp_path: Path, http, caplog: pytest.LogCaptureFixture
) -> None:
    controller = await start(harness, tmp_path, poseidon=MANAGED)
    codeocean = CodeOcean(http, controller)
    assert (await codeocean.call("PUT", "/execution-environments/11", synced(11))).status == 201
    await harness.settled(controller)
    path = "poolkeeper/environments/11"
    stored = harness.sim.variables("default")[path]
    nonsense = {**stored["Items"], "cpuLimit": "lots"}
    harness.sim.put_variable("default", path, nonsense, stored["ModifyIndex"])
    assert controller.environments is not None
    await controller.environments.refresh()
    assert "item cpuLimit must be a decimal number" in caplog.text
    environment = (await codeocean.call("GET", "/execution-environments/11")).json()
    assert environment["cpuLimit"] == 20  # the last valid version runs on
    await harness.settled(controller)
    assert len(images(harness, "environment-11-")) == 2


async def test_managed_environments_written_through_the_api_tier(
    harness: Harness, tmp_path: Path, http
) -> None:
    reconciler = await start(harness, tmp_path, poseidon=MANAGED, resync_seconds=30.0)
    tier = await harness.start_api_tier(poseidon=MANAGED)
    codeocean = CodeOcean(http, tier)
    assert (await codeocean.call("PUT", "/execution-environments/11", synced(11))).status == 201
    # At once, before any runner of it ran: none available, as Poseidon answers, never a
    # Nomad failure (the replica knows the environment it just wrote).
    first = await codeocean.claim(11)
    assert first.status == 200 or (first.status, first.json()["errorCode"]) == (
        500,
        "NOMAD_OVERLOAD",
    ), first.body

    async def served() -> bool:
        stats = await codeocean.statistics()
        return "11" in stats and stats["11"]["idleRunners"] >= 1

    # The reconciler's resync is 30 s away: the doorbell made it read the environment.
    await wait_until(served, within=10.0, what="the reconciler to run the environment's pool")
    assert (await codeocean.claim(11)).status == 200
    assert (await codeocean.call("DELETE", "/execution-environments/11")).status == 204

    async def drained() -> bool:
        answer = await CodeOcean(http, reconciler).call("GET", "/execution-environments/11")
        return answer.status == 404

    await wait_until(drained, within=10.0, what="the reconciler to learn of the deletion")


async def test_a_runner_asked_for_right_after_a_managed_put_is_none_available(
    harness: Harness, tmp_path: Path, http
) -> None:
    harness.sim.set_start_delay(5.0)  # nothing of the new pool runs for a while
    controller = await start(harness, tmp_path, poseidon=MANAGED)
    codeocean = CodeOcean(http, controller)
    assert (await codeocean.call("PUT", "/execution-environments/12", synced(12))).status == 201
    answer = await codeocean.claim(12)
    assert (answer.status, answer.json()["errorCode"]) == (500, "NOMAD_OVERLOAD"), answer.body


@pytest.mark.slow
async def test_poolkeeper_run_as_a_process(
    sim_server: SimServer, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The command line as docs/poseidon.md gives it: managed environments from a template,
    the --access-log on (the Poseidon-Token must never reach the log)."""
    template = tmp_path / "template.yaml"
    template.write_text("metadata: {namespace: codeocean}\nspec: {maxRunners: 10}\n")
    pools = write_pools(tmp_path / "pools.yaml", environment_pool("python", 10, 1))
    process = Process(pools, sim_server.url, tmp_path)
    process.args += [
        "--poseidon-api", "--poseidon-environments", "managed",
        "--poseidon-environment-template", str(template), "--access-log",
    ]  # fmt: skip
    process.start()
    headers = {"Poseidon-Token": API_TOKEN, "Content-Type": "application/json"}
    base = process.url + "/api/v1"
    try:
        await wait_until(process.ready, within=30, what="the controller")
        async with http.put(
            base + "/execution-environments/11", json=synced(11, size=1), headers=headers
        ) as response:
            assert response.status == 201

        async def idle() -> bool:
            async with http.get(
                base + "/statistics/execution-environments", headers=headers
            ) as response:
                stats = await response.json()
            return "11" in stats and stats["11"]["idleRunners"] == 1

        await wait_until(idle, within=30, what="environment 11's runner")
        async with http.post(
            base + "/runners", json={"executionEnvironmentId": 11}, headers=headers
        ) as response:
            assert response.status == 200
            runner_id = (await response.json())["runnerId"]
        assert runner_id.startswith("environment-11-")
        async with http.delete(base + f"/runners/{runner_id}", headers=headers) as response:
            assert response.status == 204
    finally:
        assert await process.signal(signal.SIGTERM) == 0
    output = process.output()
    assert "PUT /api/v1/execution-environments/{id} 201" in output
    assert API_TOKEN not in output and "Traceback" not in output
