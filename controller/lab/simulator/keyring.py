"""The servers' keyring as `/.well-known/jwks.json` shows it: one RS256 signing key.

A Nomad server creates a root key when it is elected (a 2048-bit RSA key among it, for the
workload identities it signs with RS256) and publishes its public half at
`/.well-known/jwks.json`; agents and tools wait for that key as the sign that a leader is
up. The simulator signs no identity: it only publishes the public half of a key made from
the seed (its own RNG, so the IDs of everything else do not depend on whether anyone
asked), the first time someone asks.
"""

from __future__ import annotations

import base64
import math
import random

from controller.lab.simulator.util import JSON, now_ns

RSA_BITS = 2048
PUBLIC_EXPONENT = 65537
# Nomad rotates the root key after 30 days (keyring's RotationThreshold); the JWKS answer
# asks its readers to cache it until then, at least 15 minutes.
ROTATION_SECONDS = 30 * 24 * 3600
_SIEVE_LIMIT = 20_000


def _small_primes_product(limit: int) -> int:
    """The product of the odd primes below `limit`: one gcd with it sieves a candidate."""
    composite = bytearray(limit)
    product = 1
    for n in range(3, limit, 2):
        if not composite[n]:
            product *= n
            composite[n * n :: 2 * n] = bytes(len(range(n * n, limit, 2 * n)))
    return product


class Keyring:
    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"keyring-{seed}")
        self._key: JSON | None = None
        self._created_ns = 0
        self._sieve = 0

    def public_keys(self) -> JSON:
        """The JSON Web Key Set of the active key."""
        if self._key is None:
            self._key = self._make_key()
            self._created_ns = now_ns()
        return {"keys": [self._key]}

    def max_age_seconds(self) -> int:
        """How long a reader may cache the key set (until the key's rotation)."""
        left = ROTATION_SECONDS - (now_ns() - self._created_ns) // 10**9
        return max(int(left), 15 * 60)

    def _make_key(self) -> JSON:
        modulus = self._prime(RSA_BITS // 2) * self._prime(RSA_BITS // 2)
        key_id = f"{self._rng.getrandbits(128):032x}"
        return {
            "use": "sig",
            "kty": "RSA",
            "kid": f"{key_id[:8]}-{key_id[8:12]}-{key_id[12:16]}-{key_id[16:20]}-{key_id[20:]}",
            "alg": "RS256",
            "n": _base64url(modulus),
            "e": _base64url(PUBLIC_EXPONENT),
        }

    def _prime(self, bits: int) -> int:
        """A random prime of exactly `bits` bits whose p - 1 is prime to the exponent."""
        self._sieve = self._sieve or _small_primes_product(_SIEVE_LIMIT)
        while True:
            candidate = self._rng.getrandbits(bits) | (3 << (bits - 2)) | 1
            if math.gcd(candidate, self._sieve) != 1:
                continue
            if (candidate - 1) % PUBLIC_EXPONENT == 0:
                continue
            if _probably_prime(candidate, self._rng):
                return candidate


def _probably_prime(n: int, rng: random.Random, rounds: int = 16) -> bool:
    """Miller-Rabin: False for a composite, True for a prime (error below 4**-rounds)."""
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for _ in range(rounds):
        x = pow(rng.randrange(2, n - 1), d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def _base64url(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
