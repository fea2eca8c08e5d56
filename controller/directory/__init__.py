"""What the claim path knows of pools: the one narrow interface (view.py) through which
claims, executions, files, the HTTP API and the Poseidon API read pools, and tell the
pools' reconcilers what they did.

Two sources implement it:
- in a reconciling process (`run`, `operator`), the engine (engine/directory.py): the
  pools it registered, offered from its own passes;
- in the API tier (`poolkeeper api`), the catalog (directory/catalog.py): what the pools'
  lease holders publish in Nomad, so an API replica needs nothing but Nomad.
"""
