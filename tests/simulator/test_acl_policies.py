"""ACL policies: the language, the evaluator, and what poolkeeper's calls need."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.lab.simulator import Simulator, start_sim
from controller.lab.simulator.acl_policy import (
    NAMESPACE_SHORTHANDS,
    Permissions,
    PolicyError,
    parse_policy,
)
from controller.lab.simulator.api_exec import NO_LOCAL_EXEC
from tests.simulator.conftest import Client, service_job
from tests.support.waiting import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nomad-policy.hcl"


def _allowed(rules: list[str]) -> Permissions:
    return Permissions(parse_policy(r) for r in rules)


# ---------------------------------------------------------------------- the language
def test_shorthands_expand_as_nomad_does() -> None:
    read = _allowed(['namespace "a" { policy = "read" }'])
    assert read.allow_namespace_op("a", "list-jobs") and read.allow_namespace_op("a", "read-job")
    assert not read.allow_namespace_op("a", "submit-job")
    assert not read.allow_namespace_op("a", "read-fs")  # read has no logs, fs or exec
    write = _allowed(['namespace "a" { policy = "write" }'])
    for capability in ("read-job", "submit-job", "dispatch-job", "read-fs", "alloc-exec"):
        assert write.allow_namespace_op("a", capability), capability
    assert not write.allow_namespace_op("a", "alloc-node-exec")
    scale = _allowed(['namespace "a" { policy = "scale" }'])
    assert scale.allow_namespace_op("a", "scale-job")
    assert not scale.allow_namespace_op("a", "read-job")
    assert set(NAMESPACE_SHORTHANDS["write"]) > set(NAMESPACE_SHORTHANDS["read"])
    both = _allowed(['namespace "a" { policy = "read"\n capabilities = ["alloc-exec"] }'])
    assert both.allow_namespace_op("a", "alloc-exec") and both.allow_namespace_op("a", "read-job")


def test_globs_and_their_precedence() -> None:
    perms = _allowed(
        [
            """
            namespace "*" { policy = "read" }
            namespace "prod-*" { capabilities = ["submit-job"] }
            namespace "prod-api" { capabilities = ["list-jobs"] }
            """
        ]
    )
    assert perms.allow_namespace_op("staging", "read-job")  # only `*` matches
    assert perms.allow_namespace_op("prod-web", "submit-job")  # the closer glob wins ...
    assert not perms.allow_namespace_op("prod-web", "read-job")  # ... and `*` is not merged
    assert perms.allow_namespace_op("prod-api", "list-jobs")  # an exact name beats globs
    assert not perms.allow_namespace_op("prod-api", "submit-job")
    assert perms.allow_namespace_op("*", "submit-job")  # `namespace=*`: any namespace
    assert not perms.allow_namespace_op("*", "alloc-exec")


def test_deny_wins_over_every_other_policy() -> None:
    perms = _allowed(
        [
            'namespace "a" { policy = "write" }',
            'namespace "a" { policy = "deny" }',
            'namespace "b" { capabilities = ["deny", "read-job"] }',
            'node { policy = "write" }',
            'node { policy = "deny" }',
        ]
    )
    assert not perms.allow_namespace_op("a", "read-job") and not perms.allow_namespace("a")
    assert not perms.allow_namespace_op("b", "read-job")
    assert not perms.allow("node", write=False)


def test_variables_path_rules() -> None:
    perms = _allowed(
        [
            """
            namespace "default" {
              variables {
                path "poolkeeper/*" { capabilities = ["read"] }
                path "poolkeeper/leases/*" { capabilities = ["write", "read"] }
                path "poolkeeper/leases/secret" { capabilities = ["deny", "read"] }
                path "exact" { capabilities = ["destroy"] }
              }
            }
            namespace "team-*" {
              variables { path "*" { capabilities = ["list"] } }
            }
            """
        ]
    )
    assert perms.allow_variable_op("default", "poolkeeper/claims/a", "read")
    assert perms.allow_variable_op("default", "poolkeeper/claims/a", "list")  # read brings list
    assert not perms.allow_variable_op("default", "poolkeeper/claims/a", "write")
    assert perms.allow_variable_op("default", "poolkeeper/leases/p", "write")  # closer glob
    assert not perms.allow_variable_op("default", "poolkeeper/leases/secret", "read")  # deny
    assert perms.allow_variable_op("default", "exact", "destroy")
    assert not perms.allow_variable_op("default", "exactly", "destroy")
    assert not perms.allow_variable_op("other", "poolkeeper/claims/a", "read")
    assert perms.allow_variable_op("team-x", "any/path", "list")
    assert not perms.allow_variable_op("team-x", "any/path", "read")
    # Variables are not namespace capabilities: they grant no job access.
    assert not perms.allow_namespace_op("default", "read-job")


def test_json_rules_and_refused_rules() -> None:
    perms = _allowed(
        [
            '{"namespace": {"default": {"policy": "read", "variables": '
            '{"path": {"a/*": {"capabilities": ["write"]}}}}}, "agent": {"policy": "read"}}'
        ]
    )
    assert perms.allow_namespace_op("default", "read-job")
    assert perms.allow_variable_op("default", "a/b", "write") and perms.allow("agent", False)
    for bad in (
        'namespace "a" { policy = "admin" }',
        'namespace "a" { capabilities = ["read-everything"] }',
        'namespace "a b" { policy = "read" }',
        'namespace "a" { variables { path "x" { capabilities = ["delete"] } } }',
        'namespace "a" { variables {} }',
        'node { policy = "scale-everything" }',
        'namespace "a" { policy = "read" ',
        'bogus { policy = "read" }',
    ):
        with pytest.raises(PolicyError):
            parse_policy(bad)


# ---------------------------------------------------------------------- over HTTP
@pytest.fixture
async def acl_sim() -> AsyncIterator[tuple[Client, str]]:
    """A client with ACLs on, and the bootstrap (management) token's secret."""
    sim = Simulator(nodes=["n1"], seed=5, acl_enabled=True, start_delay=0.01)
    server = await start_sim(sim)
    async with aiohttp.ClientSession() as session:
        client = Client(session, server.url)
        status, boot, _ = await client.post("/v1/acl/bootstrap")
        assert status == 200
        yield client, boot["SecretID"]
    await server.stop()


async def _call(
    client: Client, secret: str, method: str, path: str, body: Any = None, **params: str
) -> tuple[int, Any]:
    headers = {"X-Nomad-Token": secret}
    async with client.session.request(
        method, client.url + path, json=body, params=params, headers=headers
    ) as resp:
        if path == "/v1/event/stream":
            return resp.status, None  # the stream stays open: its status is the answer
        text = await resp.text()
        return resp.status, text


async def _token_with(client: Client, management: str, name: str, rules: str) -> str:
    status, text = await _call(
        client, management, "PUT", f"/v1/acl/policy/{name}", {"Rules": rules}
    )
    assert status == 200, text
    token = {"Name": name, "Type": "client", "Policies": [name]}
    status, text = await _call(client, management, "POST", "/v1/acl/token", token)
    assert status == 200, text
    return str(json.loads(text)["SecretID"])


# Each call poolkeeper's controller makes (controller/nomad/client.py and events.py),
# with the one capability it needs; in order, so each finds what the one before made.
LEASE = "/v1/var/poolkeeper/leases/default~pool"
CLAIM = "/v1/var/poolkeeper/claims/default~pool/r1"
POOLKEEPER_CALLS: list[tuple[str | None, str, str, Any, dict[str, str]]] = [
    (None, "GET", "/v1/status/leader", None, {}),
    ("list-jobs", "GET", "/v1/jobs", None, {"namespace": "default", "meta": "true"}),
    (
        "read-job",
        "GET",
        "/v1/allocations",
        None,
        {"namespace": "default", "task_states": "true"},
    ),
    (
        "read-job",
        "GET",
        "/v1/event/stream",
        None,
        {"namespace": "default", "topic": "Job", "index": "1"},
    ),
    (
        "submit-job",
        "POST",
        "/v1/jobs",
        {"Job": service_job("runner-1"), "EnforceIndex": True, "JobModifyIndex": 0},
        {"namespace": "default"},
    ),
    ("read-job", "GET", "/v1/job/runner-1/evaluations", None, {"namespace": "default"}),
    ("node", "GET", "/v1/nodes", None, {}),
    (
        "submit-job",
        "DELETE",
        "/v1/job/runner-1",
        None,
        {"namespace": "default", "purge": "true"},
    ),
    ("write", "PUT", CLAIM, {"Items": {"owner": "x"}}, {"namespace": "default", "cas": "0"}),
    ("list", "GET", "/v1/vars", None, {"namespace": "default", "prefix": "poolkeeper/"}),
    ("read", "GET", CLAIM, None, {"namespace": "default"}),
    ("destroy", "DELETE", CLAIM, None, {"namespace": "default"}),
    (
        "write",
        "PUT",
        LEASE,
        {"Items": {"holder": "h"}, "Lock": {"TTL": "10s", "LockDelay": "5s"}},
        {"namespace": "default", "lock-acquire": ""},
    ),
]


async def _run_poolkeeper_calls(client: Client, secret: str) -> dict[int, int]:
    """Status per call index; the lease's renew and release use the acquired lock."""
    statuses: dict[int, int] = {}
    for i, (_, method, path, body, params) in enumerate(POOLKEEPER_CALLS):
        statuses[i], _ = await _call(client, secret, method, path, body, **params)
    return statuses


async def test_every_poolkeeper_call_is_allowed_by_the_example_policy(
    acl_sim: tuple[Client, str],
) -> None:
    client, management = acl_sim
    secret = await _token_with(client, management, "poolkeeper", EXAMPLE.read_text())
    statuses = await _run_poolkeeper_calls(client, secret)
    assert all(s == 200 for s in statuses.values()), sorted(statuses.items())
    status, text = await _call(client, secret, "GET", LEASE, namespace="default")
    assert status == 200 and '"Lock"' not in text  # only management tokens see locks
    status, _ = await _call(client, secret, "PUT", "/v1/node/x/eligibility", {})
    assert status == 403  # reading nodes, never changing them


@pytest.mark.parametrize(
    "capability",
    ["list-jobs", "read-job", "submit-job", "read", "list", "write", "destroy", "node"],
)
async def test_a_token_lacking_one_capability_is_refused_exactly_where_it_is_needed(
    acl_sim: tuple[Client, str], capability: str
) -> None:
    client, management = acl_sim
    rules = EXAMPLE.read_text()
    if capability == "node":
        lacking = rules.replace('node {\n  policy = "read"\n}\n', "")
    elif capability in ("read", "list", "write", "destroy"):
        caps = '["read", "list", "write", "destroy"]'
        without = caps.replace(f'"{capability}", ', "").replace(f', "{capability}"', "")
        lacking = rules.replace(caps, without)
    else:
        lacking = rules.replace(f'"{capability}",', "")
    assert lacking != rules
    secret = await _token_with(client, management, "lacking", lacking)
    statuses = await _run_poolkeeper_calls(client, secret)
    for i, (needs, method, path, _, _) in enumerate(POOLKEEPER_CALLS):
        # `read` brings `list` (Nomad adds it), so a policy without `list` still lists.
        refused = needs == capability and capability != "list"
        assert (statuses[i] == 403) == refused, (method, path, statuses[i])


async def test_lock_operations_need_write_on_the_path(acl_sim: tuple[Client, str]) -> None:
    client, management = acl_sim
    rules = 'namespace "default" { variables { path "l/*" { capabilities = ["read"] } } }'
    reader = await _token_with(client, management, "reader", rules)
    writer = await _token_with(
        client, management, "writer", rules.replace('["read"]', '["read", "write"]')
    )
    body = {"Lock": {"TTL": "10s"}}
    assert (await _call(client, reader, "PUT", "/v1/var/l/a", body, **{"lock-acquire": ""}))[
        0
    ] == 403
    status, text = await _call(client, writer, "PUT", "/v1/var/l/a", body, **{"lock-acquire": ""})
    assert status == 200 and '"Lock"' in text  # the holder sees its lock
    lock = {"Lock": {"ID": json.loads(text)["Lock"]["ID"]}}
    for operation in ("lock-renew", "lock-release"):
        assert (await _call(client, reader, "PUT", "/v1/var/l/a", lock, **{operation: ""}))[
            0
        ] == 403
    status, text = await _call(client, management, "GET", "/v1/var/l/a")
    assert status == 200 and '"Lock"' in text  # management tokens see every lock
    status, text = await _call(client, reader, "GET", "/v1/var/l/a")
    assert status == 200 and '"Lock"' not in text
    for operation in ("lock-renew", "lock-release"):
        assert (await _call(client, writer, "PUT", "/v1/var/l/a", lock, **{operation: ""}))[
            0
        ] == 200


async def test_unknown_and_anonymous_tokens(acl_sim: tuple[Client, str]) -> None:
    client, management = acl_sim
    assert await _call(client, "nope", "GET", "/v1/vars") == (403, "Permission denied")
    async with client.session.get(client.url + "/v1/vars") as resp:
        assert resp.status == 200 and await resp.json() == []  # nothing listable, no error
    async with client.session.get(client.url + "/v1/jobs") as resp:
        assert resp.status == 403
    anonymous = {"Rules": 'namespace "default" { policy = "read" }'}
    assert (await _call(client, management, "PUT", "/v1/acl/policy/anonymous", anonymous))[0] == 200
    async with client.session.get(client.url + "/v1/jobs") as resp:
        assert resp.status == 200  # a request without a token gets the anonymous policy
    status, text = await _call(client, management, "PUT", "/v1/acl/policy/bad", {"Rules": "x {"})
    assert status == 400 and "failed to parse rules" in text


async def test_executions_need_alloc_exec_in_the_example_policy(
    acl_sim: tuple[Client, str],
) -> None:
    """Executions and file requests are execs of the runner task; why one ended is read
    from its allocation (read-job)."""
    client, management = acl_sim
    status, _ = await _call(client, management, "POST", "/v1/jobs", {"Job": service_job("r")})
    assert status == 200
    allocations: list[Any] = []

    async def running() -> bool:
        _, text = await _call(client, management, "GET", "/v1/job/r/allocations")
        allocations[:] = json.loads(text)
        return any(a["ClientStatus"] == "running" for a in allocations)

    await wait_until(running, what="the allocation to run")
    alloc_id = allocations[0]["ID"]
    rules = EXAMPLE.read_text()
    without = rules.replace('"alloc-exec",', "")
    assert without != rules
    for name, policy, reason in (
        ("exec", rules, NO_LOCAL_EXEC),  # past the ACL: refused as by a driver that cannot exec
        ("no-exec", without, "Permission denied"),
    ):
        secret = await _token_with(client, management, name, policy)
        status, _ = await _call(client, secret, "GET", f"/v1/allocation/{alloc_id}")
        assert status == 200
        query = {"task": "main", "command": '["true"]'}
        url = f"{client.url}/v1/client/allocation/{alloc_id}/exec"
        async with client.session.ws_connect(
            url, params=query, headers={"X-Nomad-Token": secret}
        ) as ws:
            message = await ws.receive()
        assert (message.type, message.data, message.extra) == (
            aiohttp.WSMsgType.CLOSE, 1011, reason,
        )  # fmt: skip
