"""The Poseidon-compatible API (`--poseidon-api`): openHPI Poseidon's REST API v1 under
`/api/v1/`, on the listener of the poolkeeper API, so that Poseidon's client (openHPI
CodeOcean) works unchanged (docs/poseidon.md).

A front door, thin over the engine (pools are execution environments), the claim service
(runners) and the managed environments' source: it translates Poseidon's requests, answers
and errors, and decides nothing of its own.
"""
