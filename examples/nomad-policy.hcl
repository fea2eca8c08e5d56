# The Nomad ACL policy poolkeeper's controller needs: exactly the capabilities it uses.
#
#   nomad acl policy apply -description "poolkeeper controller" poolkeeper nomad-policy.hcl
#   nomad acl token create -name poolkeeper -policy poolkeeper
#
# Give one namespace block to each namespace the pools run in ("default" here). The
# controller also asks GET /v1/status/leader, which needs no capability.

# OPTIONAL: drain awareness. GET /v1/nodes and GET /v1/node/:id: which nodes drain or take
# no placements, so that idle runners on them are replaced before Nomad moves them. A
# token without it (a namespace-scoped one) still reconciles every pool, without drain
# awareness: the controller says so once in its log, poolkeeper_capability{name="node_read"}
# is 0 and the pools' Degraded condition (False) has the reason DrainAwarenessOff; it asks
# again every minute and turns drain awareness on once the token may read nodes.
node {
  policy = "read"
}

# REQUIRED: everything below, in each namespace the pools run in.
namespace "default" {
  capabilities = [
    # GET /v1/jobs?meta=true: the pools' runner jobs and their Meta.
    "list-jobs",
    # GET /v1/allocations: the runners' allocations; GET /v1/event/stream with the
    # Job and Allocation topics: what changed since the last look; GET
    # /v1/job/:id/evaluations: why a runner could not be placed; GET /v1/allocation/:id:
    # why an execution ended (a restarted or stopped allocation).
    "read-job",
    # POST /v1/jobs (with EnforceIndex) registers runner jobs;
    # DELETE /v1/job/:id?purge=true purges them.
    "submit-job",
    # GET /v1/client/allocation/:id/exec (a WebSocket): executions and file requests
    # run in the claimed runner's task, so clients need no Nomad token of their own.
    # Docker tasks isolate their filesystem, so alloc-node-exec is not needed.
    "alloc-exec",
  ]

  variables {
    # Claims and the pools' leases live under poolkeeper/ (poolkeeper/leases/<ns>~<pool>).
    #   read:    GET /v1/var/:path
    #   list:    GET /v1/vars?prefix=poolkeeper/
    #   write:   PUT /v1/var/:path (with cas), and the leases' ?lock-acquire,
    #            ?lock-renew and ?lock-release
    #   destroy: DELETE /v1/var/:path (with cas)
    path "poolkeeper/*" {
      capabilities = ["read", "list", "write", "destroy"]
    }
  }
}
