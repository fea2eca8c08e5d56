"""Everything processes keep in Nomad for each other, in one place: leases, member
records, the catalog's offers, the doorbell, waiting claim requests, claims and their
tombstones, request records, drain records and managed Poseidon environments.

Their paths are in core/paths.py and their formats in core/ (pure); this package holds
every read, write, check-and-set and follow of them. Nothing outside it (and the Nomad
client) calls the Variables or Locks port: tests/unit/test_layering.py checks it.
"""
