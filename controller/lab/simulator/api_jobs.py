"""Routes: /v1/jobs and /v1/job/:id with its sub-resources."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from controller.lab.simulator.util import JSON, bad_request, not_found
from controller.lab.simulator.views import alloc_stub, eval_view, job_stub, paginate
from controller.lab.simulator.wire import (
    ENCODE,
    AddRoute,
    block,
    namespace_of,
    parse_bool,
    parse_int,
    query_filter,
    read_json,
    reply,
    reply_raw,
    table_index,
)

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator


class JobRoutes:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self._job_cache: dict[bool, dict[tuple[str, str], tuple[tuple[int, int], bytes]]] = {}

    def register(self, r: AddRoute) -> None:
        r(r"/v1/jobs", GET=self.jobs_list, PUT=self.job_register, POST=self.job_register)
        reads = ("allocations", "evaluations", "versions", "summary", "deployments", "deployment")
        writes = ("evaluate", "plan", "dispatch", "revert", "stable", "scale")
        for suffix in reads + writes:
            handler = getattr(self, f"job_{suffix}")
            methods = {"GET": handler} if suffix in reads else {"PUT": handler, "POST": handler}
            if suffix == "scale":
                methods["GET"] = self.job_scale_status
            r(rf"/v1/job/(?P<id>.+)/{suffix}", **methods)
        r(
            r"/v1/job/(?P<id>.+)",
            GET=self.job_read,
            PUT=self.job_register,
            POST=self.job_register,
            DELETE=self.job_deregister,
        )

    async def jobs_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "jobs", "allocs", "evals"))
        keep = query_filter(request)
        ns = namespace_of(request)
        prefix = request.query.get("prefix", "")
        meta = parse_bool(request, "meta")
        per_page = parse_int(request, "per_page") or 0
        sim = self.sim
        visible = sim.namespace_filter(t, ns, "list-jobs")
        records = [
            sim.jobs[k] for k in sim.job_keys(ns) if k[1].startswith(prefix) and visible(k[0])
        ]
        page, next_token = paginate(
            records,
            lambda rec: f"{rec.key[0]}.{rec.key[1]}",
            request.query.get("next_token") or None,
            per_page,
            (lambda rec: keep(rec.job)) if keep else None,
        )
        cache = self._job_cache.setdefault(meta, {})
        parts: list[bytes] = []
        for rec in page:
            stamp = (rec.job["ModifyIndex"], sim.job_touched.get(rec.key, 0))
            hit = cache.get(rec.key)
            if hit is None or hit[0] != stamp:
                encoded = ENCODE(job_stub(sim, rec, meta)).encode()
                hit = cache[rec.key] = (stamp, encoded)
            parts.append(hit[1])
        resp = reply_raw(b"[" + b",".join(parts) + b"]", index)
        if next_token is not None:
            resp.headers["X-Nomad-NextToken"] = next_token
        return resp

    async def _job_body(self, request: web.Request, job_id: str | None) -> JSON:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        job = body.get("Job")
        if not isinstance(job, dict):
            raise bad_request("Job must be specified")
        if not job.get("ID"):
            raise bad_request("Job ID hasn't been provided")
        if job_id is not None and job["ID"] != job_id:
            raise bad_request("Job ID does not match name")
        return body

    async def job_register(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await self._job_body(request, p.get("id"))
        enforce = body.get("EnforceIndex", False)
        jmi = body.get("JobModifyIndex", 0)
        if not isinstance(enforce, bool) or not isinstance(jmi, int):
            raise bad_request("Failed to decode request body: EnforceIndex/JobModifyIndex type")
        ns = request.query.get("namespace") or body["Job"].get("Namespace") or "default"
        self.sim.require(t, ns, "submit-job")
        out = self.sim.register_job(body["Job"], ns, enforce, jmi)
        self._audit(request, "register", ns, body["Job"].get("ID", ""), body["Job"])
        return reply(out, out["Index"])

    def _audit(
        self, request: web.Request, kind: str, namespace: str, job_id: str, job: JSON | None
    ) -> None:
        user_agent = request.headers.get("User-Agent", "")
        self.sim.audit.record(user_agent, kind, namespace, job_id, job)

    async def job_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        key = (namespace_of(request), p["id"])

        def index_of() -> int:
            rec = self.sim.jobs.get(key)
            return int(rec.job["ModifyIndex"]) if rec else self.sim.table_index["jobs"]

        index = await block(self.sim, request, index_of)
        rec = self.sim.jobs.get(key)
        if rec is None:
            raise not_found("job")
        return reply(rec.job, index)

    async def job_deregister(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        purge = parse_bool(request, "purge")
        namespace = namespace_of(request)
        existing = self.sim.jobs.get((namespace, p["id"]))
        if existing is not None:
            self._audit(request, "purge", namespace, p["id"], existing.job)
        out = self.sim.deregister_job(p["id"], namespace, purge)
        return reply(out, out["Index"] or self.sim.index)

    async def job_allocations(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "allocs"))
        key = (namespace_of(request), p["id"])
        rec = self.sim.jobs.get(key)
        show_all = parse_bool(request, "all")
        allocs = [self.sim.allocs[a] for a in self.sim.job_allocs.get(key, ())]
        if rec is not None and not show_all:
            allocs = [a for a in allocs if a["Job"]["CreateIndex"] == rec.create_index]
        allocs.sort(key=lambda a: a["ID"])
        return reply([alloc_stub(a) for a in allocs], index)

    async def job_evaluations(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "evals"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        evals = [self.sim.evals[e] for e in rec.eval_ids] if rec else []
        return reply([eval_view(e) for e in evals], index)

    async def job_versions(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "jobs"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        if rec is None:
            raise not_found("job versions")
        return reply({"Versions": list(reversed(rec.versions)), "Diffs": None}, index)

    async def job_summary(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "jobs", "allocs"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        if rec is None:
            raise not_found("job summary")
        return reply(self.sim.job_summary(rec), index)

    async def job_deployments(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "deployment"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        deps = [self.sim.deployments[d] for d in reversed(rec.deployment_ids)] if rec else []
        return reply(deps, index)

    async def job_deployment(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "deployment"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        dep = self.sim.deployments[rec.deployment_ids[-1]] if rec and rec.deployment_ids else None
        return reply(dep, index)

    async def job_evaluate(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        await read_json(request, required=False)
        out = self.sim.evaluate_job(p["id"], namespace_of(request))
        return reply(out, out["Index"])

    async def job_plan(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await self._job_body(request, p["id"])
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        updates = {
            g.get("Name", ""): {
                "Place": g.get("Count", 1),
                "Ignore": 0,
                "Stop": 0,
                "Migrate": 0,
                "InPlaceUpdate": 0,
                "DestructiveUpdate": 0,
            }
            for g in body["Job"].get("TaskGroups") or []
            if isinstance(g, dict)
        }
        jmi = rec.job["JobModifyIndex"] if rec else 0
        return reply(
            {
                "Index": jmi,
                "JobModifyIndex": jmi,
                "Diff": {"Type": "None"} if body.get("Diff") else None,
                "Annotations": {"DesiredTGUpdates": updates, "PreemptedAllocs": None},
                "FailedTGAllocs": None,
                "CreatedEvals": None,
                "Warnings": "",
                "NextPeriodicLaunch": "0001-01-01T00:00:00Z",
            },
            self.sim.index,
        )

    async def job_dispatch(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request, required=False) or {}
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        out = self.sim.dispatch_job(p["id"], namespace_of(request), body)
        return reply(out, out["Index"])

    async def job_revert(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("JobVersion"), int):
            raise bad_request("Failed to decode request body: JobVersion must be a number")
        out = self.sim.revert_job(
            p["id"], namespace_of(request), body["JobVersion"], body.get("EnforcePriorVersion")
        )
        return reply(out, out["Index"])

    async def job_stable(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("JobVersion"), int):
            raise bad_request("Failed to decode request body: JobVersion must be a number")
        out = self.sim.stable_job(
            p["id"], namespace_of(request), body["JobVersion"], bool(body.get("Stable"))
        )
        return reply(out, out["Index"])

    async def job_scale(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("Failed to decode request body: expected a JSON object")
        out = self.sim.scale_job(p["id"], namespace_of(request), body)
        return reply(out, out["Index"])

    async def job_scale_status(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await block(self.sim, request, table_index(self.sim, "jobs", "allocs"))
        rec = self.sim.jobs.get((namespace_of(request), p["id"]))
        if rec is None:
            raise not_found("job")
        summary = self.sim.job_summary(rec)["Summary"]
        groups = {
            g["Name"]: {
                "Desired": g["Count"],
                "Placed": sum(summary[g["Name"]][k] for k in ("Starting", "Running")),
                "Running": summary[g["Name"]]["Running"],
                "Healthy": summary[g["Name"]]["Running"],
                "Unhealthy": 0,
                "Events": None,
            }
            for g in rec.job["TaskGroups"]
        }
        return reply(
            {
                "JobID": rec.key[1],
                "Namespace": rec.key[0],
                "JobCreateIndex": rec.create_index,
                "JobModifyIndex": rec.job["JobModifyIndex"],
                "JobStopped": bool(rec.job.get("Stop")),
                "TaskGroups": groups,
            },
            index,
        )
