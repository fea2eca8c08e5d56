"""What each /v1 route needs of the caller's ACL token, with Nomad's capability names.

Every route handler has exactly one rule here (the API refuses to start otherwise), so a
new route cannot be served unchecked by accident. Rules of kind `handler` are checked by
the handler itself, once it knows what it needs: the namespace of the job in a body, the
namespace of an allocation, the variable path, the event topics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from controller.lab.simulator.acl_policy import Permissions
from controller.lab.simulator.util import ApiError

RuleKind = Literal["public", "token", "handler", "own_token", "namespace", "coarse", "management"]


@dataclass(frozen=True)
class Rule:
    kind: RuleKind
    # namespace: any one of these capabilities; coarse: ("node" | "agent" | ...,)
    capabilities: tuple[str, ...] = ()
    write: bool = False  # coarse: write rather than read


PUBLIC = Rule("public")  # no token is even looked at
ANY_TOKEN = Rule("token")  # a real token, whatever its policies
IN_HANDLER = Rule("handler")
# The handler also finds the token itself, and answers a refusal its own way, where Nomad
# does: exec after the WebSocket upgrade (its token may come in the first frame), as a
# close frame; the fs routes as a plain or a streaming RPC reports it (403 or 500).
OWN_TOKEN = Rule("own_token")
MANAGEMENT = Rule("management")


def namespace(*capabilities: str) -> Rule:
    return Rule("namespace", capabilities)


def coarse(kind: str, write: bool = False) -> Rule:
    return Rule("coarse", (kind,), write)


READ_JOB = namespace("read-job")
# The namespace capabilities the OWN_TOKEN client routes ask `Api.allows` for.
ALLOC_EXEC = "alloc-exec"
ALLOC_NODE_EXEC = "alloc-node-exec"  # as well, for a task whose driver isolates nothing
READ_FS = "read-fs"
READ_LOGS = "read-logs"
SUBMIT_JOB = namespace("submit-job")

RULES: dict[str, Rule] = {
    "AgentRoutes.leader": PUBLIC,
    "AgentRoutes.peers": PUBLIC,
    "AgentRoutes.regions": PUBLIC,
    "AgentRoutes.jwks": PUBLIC,
    "AgentRoutes.metrics": PUBLIC,  # Nomad checks no token for its metrics
    "AgentRoutes.agent_self": coarse("agent"),
    "AgentRoutes.agent_health": PUBLIC,
    "AgentRoutes.agent_members": coarse("node"),
    "AgentRoutes.scheduler_config": coarse("operator"),
    "AgentRoutes.scheduler_config_set": coarse("operator", write=True),
    "AgentRoutes.system_gc": MANAGEMENT,
    "AgentRoutes.reconcile_summaries": MANAGEMENT,
    "AgentRoutes.namespaces": IN_HANDLER,  # lists the namespaces the token may use
    "AgentRoutes.namespace_read": IN_HANDLER,  # a namespace the token may use
    "AgentRoutes.namespace_write": MANAGEMENT,
    "AgentRoutes.namespace_delete": MANAGEMENT,
    "JobRoutes.jobs_list": IN_HANDLER,  # list-jobs; `namespace=*` lists the allowed ones
    "JobRoutes.job_register": IN_HANDLER,  # submit-job in the job's namespace
    "JobRoutes.job_validate": IN_HANDLER,  # read-job in the job's namespace
    "JobRoutes.job_read": READ_JOB,
    "JobRoutes.job_deregister": SUBMIT_JOB,
    "JobRoutes.job_allocations": READ_JOB,
    "JobRoutes.job_evaluations": READ_JOB,
    "JobRoutes.job_versions": READ_JOB,
    "JobRoutes.job_summary": READ_JOB,
    "JobRoutes.job_submission": READ_JOB,
    "JobRoutes.job_deployments": READ_JOB,
    "JobRoutes.job_deployment": READ_JOB,
    "JobRoutes.job_evaluate": READ_JOB,
    "JobRoutes.job_plan": SUBMIT_JOB,
    "JobRoutes.job_dispatch": namespace("dispatch-job"),
    "JobRoutes.job_periodic_force": namespace("dispatch-job", "submit-job"),
    "JobRoutes.job_revert": SUBMIT_JOB,
    "JobRoutes.job_stable": SUBMIT_JOB,
    "JobRoutes.job_scale": namespace("scale-job", "submit-job"),
    "JobRoutes.job_scale_status": namespace("read-job-scaling", "read-job"),
    "AllocRoutes.allocs_list": IN_HANDLER,  # read-job; `namespace=*` lists allowed ones
    "AllocRoutes.alloc_read": IN_HANDLER,  # read-job in the allocation's namespace
    "AllocRoutes.alloc_stop": IN_HANDLER,  # alloc-lifecycle in the allocation's namespace
    "AllocRoutes.evals_list": IN_HANDLER,
    "AllocRoutes.evals_delete": MANAGEMENT,
    "AllocRoutes.eval_read": IN_HANDLER,
    "AllocRoutes.eval_allocs": IN_HANDLER,
    "AllocRoutes.deployments_list": IN_HANDLER,
    "AllocRoutes.deployment_read": IN_HANDLER,
    "AllocRoutes.deployment_allocs": IN_HANDLER,  # read-job in the deployment's namespace
    "AllocRoutes.deployment_update": IN_HANDLER,  # submit-job in the deployment's namespace
    "NodeRoutes.nodes_list": coarse("node"),
    "NodeRoutes.node_read": coarse("node"),
    "NodeRoutes.node_allocs": coarse("node"),
    "NodeRoutes.node_drain": coarse("node", write=True),
    "NodeRoutes.node_elig": coarse("node", write=True),
    "NodeRoutes.node_evaluate": coarse("node", write=True),
    "NodeRoutes.client_stats": coarse("node"),
    "NodeRoutes.node_purge": coarse("node", write=True),
    "EventRoutes.event_stream": IN_HANDLER,  # per topic
    "VariableRoutes.vars_list": IN_HANDLER,  # `list` per path; others are left out
    "VariableRoutes.var_read": IN_HANDLER,  # `read` on the path
    "VariableRoutes.var_put": IN_HANDLER,  # `write` on the path, locks included
    "VariableRoutes.var_delete": IN_HANDLER,  # `destroy` on the path
    "AclRoutes.acl_bootstrap": PUBLIC,
    "AclRoutes.acl_tokens": MANAGEMENT,
    "AclRoutes.acl_token_write": MANAGEMENT,
    "AclRoutes.acl_token_self": ANY_TOKEN,
    "AclRoutes.acl_token_read": MANAGEMENT,
    "AclRoutes.acl_token_delete": MANAGEMENT,
    "AclRoutes.acl_one_time_token": ANY_TOKEN,  # for the caller's own token
    "AclRoutes.acl_one_time_exchange": PUBLIC,
    "AclRoutes.acl_roles": IN_HANDLER,  # a client token sees its own roles
    "AclRoutes.acl_role_read": IN_HANDLER,  # ... and may read them
    "AclRoutes.acl_role_by_name": IN_HANDLER,
    "AclRoutes.acl_role_write": MANAGEMENT,
    "AclRoutes.acl_role_delete": MANAGEMENT,
    "AclRoutes.acl_policies": IN_HANDLER,  # a client token sees its own policies
    "AclRoutes.acl_policy_read": IN_HANDLER,  # ... and may read them
    "AclRoutes.acl_policy_put": MANAGEMENT,
    "AclRoutes.acl_policy_delete": MANAGEMENT,
    "ExecRoutes.client_allocation": OWN_TOKEN,  # alloc-exec in the allocation's namespace
    "FsRoutes.fs": OWN_TOKEN,  # read-fs in the request's namespace, then the allocation's
}

# The event topics a namespace's read-job covers (nomad/event_endpoint.go); Node needs
# node read; every other topic (ACL ones, `*`) needs a management token.
NAMESPACED_TOPICS = frozenset({"Job", "Allocation", "Evaluation", "Deployment", "Service"})


def denied() -> ApiError:
    return ApiError(403, "Permission denied")


def check(rule: Rule, permissions: Permissions, request_namespace: str) -> None:
    """403 unless the rule allows the request; `handler` rules pass (checked later)."""
    if rule.kind == "namespace":
        if not any(permissions.allow_namespace_op(request_namespace, c) for c in rule.capabilities):
            raise denied()
    elif rule.kind == "coarse":
        if not permissions.allow(rule.capabilities[0], rule.write):
            raise denied()
    elif rule.kind == "management" and not permissions.management:
        raise denied()


def check_topics(topics: set[str], permissions: Permissions, request_namespace: str) -> None:
    for topic in topics:
        if topic in NAMESPACED_TOPICS:
            allowed = permissions.allow_namespace_op(request_namespace, "read-job")
        elif topic == "Node":
            allowed = permissions.allow("node", write=False)
        else:
            allowed = permissions.management
        if not allowed:
            raise denied()
