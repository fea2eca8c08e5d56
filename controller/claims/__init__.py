"""The claim protocol: handing out runners exactly once, across any number of processes.

Records (all Nomad variables in the runner's Nomad namespace; shapes in core/claims.py):
- `poolkeeper/claims/<runnerId>`: the claim. A live claim (`state` absent or
  `claimed`) holds the runner; any other state is a tombstone saying why the runner is
  gone (`released`, `expired`, `lost`, `retired`), and a tombstoned runner is never
  claimable again.
- `poolkeeper/requests/<requestId>`: what a requestId asked for (its pools, a batch's
  count) and, once claimed, the pool and the runner (or a batch's runners).

Rules (every write goes through ClaimStore, records/claims.py):
1. Claiming creates the claim with cas=0: of two claimers of one runner exactly one wins.
2. Every later change (keepalive, release, expiry, loss, retirement) is a check-and-set
   on the ModifyIndex last read, so two racing changes always have exactly one winner;
   the loser reads again and decides afresh.
3. A runner is destroyed only by whoever holds its claim variable: the engine takes an
   idle runner with a `retired` tombstone (cas=0) before purging its job, so a
   scale-down and a client's claim can never both win.
4. A claim with a requestId first creates the request record (cas=0), then the claim,
   then completes the record with the runner ID. A claimer that finds the record taken
   answers with the claim it names (or, while it is still empty, with the live claim
   carrying that requestId); a record no claim carries is collected after a grace time.
5. A tombstone is deleted only once its job is provably gone and it is ten minutes old,
   so any process, after any restart, answers a late keepalive with 410 and the reason.
6. A batch (`count` runners of one pool, all or nothing) claims its runners one by one,
   each with cas=0 and carrying the batch's requestId. If the pool runs out first, the
   claims it wrote are deleted again by check-and-set on the index it wrote them with
   (the runners were never handed out, so they are idle again), and its request record
   is dropped. Otherwise the record is completed (check-and-set) with `runnerIds` before
   the batch is answered. A repeat answers from the record, or, while the record is
   still empty, from the claims carrying the requestId once all `count` are there. A
   claimer that dies mid-batch leaves claims that end at their inactivity timeout and
   take the record with their tombstones: no runner is ever in two answers.
7. A claim from a list of pools keeps one request record for the whole list, in the
   pools' common Nomad namespace (a requestId is unique per namespace, so a list with a
   requestId must share one); the record names the list, and a repeat must ask for the
   same list and count.
"""
