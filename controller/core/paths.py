"""Where every record processes keep in Nomad for each other lives: one place for the
variable paths (docs/architecture.md, "Shared records", says who writes and reads each,
and when it goes). Pure.

Variable paths allow letters, digits and `-_~/`; a pool key `<namespace>/<name>` becomes
one segment with `/` and `.` as `~` (a pool name may hold `.`, and `~` is in no name).
"""

from __future__ import annotations

from typing import Final

# In a pool's own Nomad namespace (beside its runner jobs):
CLAIMS_PREFIX: Final = "poolkeeper/claims/"  # + runner ID: a claim, or its tombstone
REQUESTS_PREFIX: Final = "poolkeeper/requests/"  # + requestId: an idempotent claim
LEASES_PREFIX: Final = "poolkeeper/leases/"  # + pool segment: who reconciles the pool

# In the controllers' own (home) Nomad namespace:
CATALOG_PREFIX: Final = "poolkeeper/catalog/"  # + pool segment: a pool for the API tier
MEMBERS_PREFIX: Final = "poolkeeper/members/"  # + replica: a live reconciler
WAITING_PREFIX: Final = "poolkeeper/waiting/"  # + replica: an API replica's waiting claims
DOORBELL_PATH: Final = "poolkeeper/doorbell"  # rung by API replicas
DRAINS_PREFIX: Final = "poolkeeper/pools/"  # + pool key with `.` as `~`: a removal
ENVIRONMENTS_PREFIX: Final = "poolkeeper/environments/"  # + ID: a managed environment

# What reconcilers write on their own schedule, whatever clients do: the catalog, and their
# member records.
RECONCILER_RECORDS: Final = (CATALOG_PREFIX, MEMBERS_PREFIX)


def pool_segment(key: str) -> str:
    """A pool key as one path segment."""
    return key.replace("/", "~").replace(".", "~")


def claim_path(runner_id: str) -> str:
    return CLAIMS_PREFIX + runner_id


def request_path(request_id: str) -> str:
    return REQUESTS_PREFIX + request_id


def lease_path(key: str) -> str:
    return LEASES_PREFIX + pool_segment(key)


def catalog_path(key: str) -> str:
    return CATALOG_PREFIX + pool_segment(key)


def member_path(replica: str) -> str:
    return MEMBERS_PREFIX + replica


def waiting_path(replica: str) -> str:
    return WAITING_PREFIX + replica


def drain_path(key: str) -> str:
    """Only `.` is replaced (records written by earlier releases keep their second level,
    and a restarted controller must find them)."""
    return DRAINS_PREFIX + key.replace(".", "~")


def environment_path(env_id: int) -> str:
    return ENVIRONMENTS_PREFIX + str(env_id)


def replica_segment(identity: str) -> str:
    """A process identity (`host/pid`) as a variable path segment."""
    allowed = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
    return "".join(c if c in allowed else "-" for c in identity)[:80] or "replica"
