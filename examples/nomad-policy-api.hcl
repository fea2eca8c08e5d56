# The Nomad ACL policy of poolkeeper's API tier (`poolkeeper api`): exactly what it uses.
# It registers, purges and reads no job and takes no lease: a release writes the claim's
# tombstone and the pool's reconciler purges the runner (the one process that writes the
# pool's jobs), so a compromised API replica cannot destroy or create runners.
#
#   nomad acl policy apply -description "poolkeeper API tier" poolkeeper-api nomad-policy-api.hcl
#   nomad acl token create -name poolkeeper-api -policy poolkeeper-api
#
# Give the pools' namespaces the first block, and the controllers' own namespace
# (NOMAD_NAMESPACE, where reconcilers publish the catalog) the second; here both are
# "default", so their rules sit in one block.

namespace "default" {
  capabilities = [
    # GET /v1/client/allocation/:id/exec (a WebSocket): executions and file requests run
    # in the claimed runner's task. Docker tasks isolate their filesystem, so
    # alloc-node-exec is not needed.
    "alloc-exec",
    # GET /v1/allocation/:id: why an execution ended (a restarted or stopped allocation).
    "read-job",
  ]

  variables {
    # Claims: created with cas=0, kept alive, released (check-and-set); a batch that
    # cannot be completed deletes the claims it wrote (cas); read and listed to answer a
    # runner, a pool's claims and a repeated requestId; busy runners' claims are watched
    # with blocking reads.
    path "poolkeeper/claims/*" {
      capabilities = ["read", "list", "write", "destroy"]
    }
    # Request records of claims with a requestId: created (cas=0), completed, dropped.
    path "poolkeeper/requests/*" {
      capabilities = ["read", "write", "destroy"]
    }

    # -- the controllers' own namespace --------------------------------------------------
    # The catalog the pools' lease holders publish: followed with blocking lists.
    path "poolkeeper/catalog/*" {
      capabilities = ["read", "list"]
    }
    # Ringing the reconcilers when claims change.
    path "poolkeeper/doorbell" {
      capabilities = ["write"]
    }
    # This replica's waiting claim requests (deleted when it stops).
    path "poolkeeper/waiting/*" {
      capabilities = ["write", "destroy"]
    }
    # --poseidon-environments managed only: PUT and DELETE of execution environments;
    # and the reconcilers' member records, read to know whether any runs them.
    path "poolkeeper/environments/*" {
      capabilities = ["read", "list", "write", "destroy"]
    }
    path "poolkeeper/members/*" {
      capabilities = ["read", "list"]
    }
  }
}
