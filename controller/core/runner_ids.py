"""Runner identity: a runner's ID is its pool's job prefix plus 12 random lowercase hex
characters, and its job's Meta names the pool and the template it was rendered from."""

from __future__ import annotations

import random
import re
import secrets
from typing import Final

META_POOL: Final = "poolkeeper_pool"
META_TEMPLATE: Final = "poolkeeper_template"

RUNNER_ID_HEX: Final = 12
# Any runner ID: a job prefix (docs/reference.md) followed by 12 lowercase hex.
RUNNER_ID_REGEX: Final = r"[a-z0-9][a-z0-9-]{0,62}-[0-9a-f]{12}"
# \Z, not $: "$" would also accept a trailing newline.
RUNNER_ID_PATTERN: Final = re.compile(rf"^(?:{RUNNER_ID_REGEX})\Z")
_SUFFIX_PATTERN: Final = re.compile(r"^[0-9a-f]{12}\Z")


def new_runner_id(prefix: str, rng: random.Random | None = None) -> str:
    """``prefix`` + 12 random lowercase hex characters (``rng`` for reproducible tests)."""
    bits = RUNNER_ID_HEX * 4
    value = rng.getrandbits(bits) if rng is not None else secrets.randbits(bits)
    return f"{prefix}{value:0{RUNNER_ID_HEX}x}"


def is_runner_id(prefix: str, job_id: str) -> bool:
    """Whether ``job_id`` is exactly ``prefix`` + 12 lowercase hex characters."""
    return job_id.startswith(prefix) and bool(_SUFFIX_PATTERN.match(job_id[len(prefix) :]))


def runner_prefix(job_id: str) -> str | None:
    """The job prefix a runner ID belongs to, or None if it is no runner ID.

    Prefixes end in "-" and the suffix has none, so the prefix is unambiguous.
    """
    if not RUNNER_ID_PATTERN.match(job_id):
        return None
    return job_id[:-RUNNER_ID_HEX]
