"""Routes: /v1/jobs and /v1/job/:id with its sub-resources."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from controller.lab.simulator.jobs import RegisterOptions
from controller.lab.simulator.jobspec import (
    canonicalize,
    multierror,
    spec_of,
    validation_errors,
)
from controller.lab.simulator.routes import (
    NOT_AN_OBJECT,
    EncodedStubs,
    RouteGroup,
    found,
    object_methods,
    put_or_post,
    read_object,
    with_next_token,
    write_reply,
)
from controller.lab.simulator.store import TERMINAL, JobRecord
from controller.lab.simulator.util import JSON, ApiError, bad_request
from controller.lab.simulator.views import alloc_stub, eval_view, job_stub, paginate
from controller.lab.simulator.wire import (
    AddRoute,
    block,
    namespace_of,
    parse_bool,
    parse_int,
    read_json,
    reply,
    reply_raw,
)

if TYPE_CHECKING:
    from controller.lab.simulator.cluster import Simulator


class JobRoutes(RouteGroup):
    def __init__(self, sim: Simulator) -> None:
        super().__init__(sim)
        # A stub shows the job and its summary: the job's ModifyIndex and the last write
        # to its allocations or evaluations version it.
        self._stubs = EncodedStubs[JobRecord](
            lambda rec: rec.key,
            lambda rec: (rec.job["ModifyIndex"], sim.job_touched.get(rec.key, 0)),
        )

    def register(self, r: AddRoute) -> None:
        r(r"/v1/jobs", GET=self.jobs_list, **put_or_post(self.job_register))
        r(r"/v1/validate/job", **put_or_post(self.job_validate))
        reads = (
            "allocations",
            "evaluations",
            "versions",
            "summary",
            "deployments",
            "deployment",
            "submission",
        )
        writes = ("evaluate", "plan", "dispatch", "revert", "stable", "scale")
        for suffix in reads + writes:
            handler = getattr(self, f"job_{suffix}")
            methods = {"GET": handler} if suffix in reads else put_or_post(handler)
            if suffix == "scale":
                methods["GET"] = self.job_scale_status
            r(rf"/v1/job/(?P<id>.+)/{suffix}", **methods)
        r(r"/v1/job/(?P<id>.+)/periodic/force", **put_or_post(self.job_periodic_force))
        r(
            r"/v1/job/(?P<id>.+)",
            **object_methods(self.job_read, self.job_register, self.job_deregister),
        )

    async def jobs_list(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        query = await self.list_query(request, "jobs", "allocs", "evals")
        ns, keep = query.namespace, query.keep
        meta = parse_bool(request, "meta")
        per_page = parse_int(request, "per_page") or 0
        sim = self.sim
        visible = sim.namespace_filter(t, ns, "list-jobs")
        records = [sim.jobs[k] for k in sim.job_keys(ns, query.prefix) if visible(k[0])]
        page, next_token = paginate(
            records,
            lambda rec: f"{rec.key[0]}.{rec.key[1]}",
            request.query.get("next_token") or None,
            per_page,
            (lambda rec: keep(rec.job)) if keep else None,
        )
        stubs = self._stubs.array(page, meta, lambda rec: job_stub(sim, rec, meta))
        return with_next_token(reply_raw(stubs, query.index), next_token)

    async def _job_body(self, request: web.Request, job_id: str | None) -> JSON:
        body = await read_object(request)
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
        options = _register_options(body)
        ns = request.query.get("namespace") or body["Job"].get("Namespace") or "default"
        self.sim.require(t, ns, "submit-job")
        out = self.sim.register_job(body["Job"], ns, enforce, jmi, options=options)
        self._audit(request, "register", ns, body["Job"].get("ID", ""), body["Job"])
        return write_reply(out)

    async def job_validate(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_object(request)
        raw = body.get("Job")
        if not isinstance(raw, dict):
            raise bad_request("Job must be specified")
        ns = request.query.get("namespace") or raw.get("Namespace") or "default"
        self.sim.require(t, ns, "read-job")
        job = {
            "Region": "global",
            "Type": "service",
            "Datacenters": ["*"],
            **{k: v for k, v in raw.items() if v is not None},
            "Namespace": ns,
        }
        job.setdefault("Name", job.get("ID") or "")
        errors = validation_errors(job)
        if not errors:
            try:
                self.sim.job_registry.admit(canonicalize(job, ns))
            except ApiError as exc:
                errors = [exc.message]
        return reply(
            {
                "DriverConfigValidated": True,
                "ValidationErrors": errors or None,
                "Error": multierror(errors) if errors else "",
                "Warnings": "",
            }
        )

    async def _blocking_job_read(
        self, request: web.Request, p: dict[str, str], *tables: str
    ) -> tuple[int, JobRecord | None]:
        """A blocking read of what the path's job has in `tables`: the index to answer
        with, and the job's record (None when there is no such job)."""
        index = await self.block_on_tables(request, *tables)
        return index, self.sim.jobs.get((namespace_of(request), p["id"]))

    def _audit(
        self, request: web.Request, kind: str, namespace: str, job_id: str, job: JSON | None
    ) -> None:
        user_agent = request.headers.get("User-Agent", "")
        self.sim.audit.record(user_agent, kind, namespace, job_id, job)

    async def job_read(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        job_id, namespace = p["id"], namespace_of(request)

        def job() -> JSON | None:
            return self.sim.get_job(job_id, namespace)

        index = await self.block_on_object(request, "jobs", job)
        return reply(found(job(), "job"), index)

    async def job_deregister(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        purge = parse_bool(request, "purge")
        eval_priority = parse_int(request, "eval_priority") or 0
        if eval_priority > 0:
            _check_eval_priority(eval_priority)
        no_shutdown_delay = parse_bool(request, "no_shutdown_delay")
        namespace = namespace_of(request)
        existing = self.sim.jobs.get((namespace, p["id"]))
        if existing is not None:
            self._audit(request, "purge", namespace, p["id"], existing.job)
        out = self.sim.deregister_job(
            p["id"], namespace, purge, max(eval_priority, 0), no_shutdown_delay
        )
        return reply(out, out["Index"] or self.sim.index)

    async def job_allocations(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index = await self.block_on_tables(request, "allocs")
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
        index, rec = await self._blocking_job_read(request, p, "evals")
        evals = [self.sim.evals[e] for e in rec.eval_ids] if rec else []
        return reply([eval_view(e) for e in evals], index)

    async def job_versions(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index, rec = await self._blocking_job_read(request, p, "jobs")
        rec = found(rec, "job versions")
        return reply({"Versions": list(reversed(rec.versions)), "Diffs": None}, index)

    async def job_summary(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index, rec = await self._blocking_job_read(request, p, "jobs", "allocs")
        return reply(self.sim.job_summary(found(rec, "job summary")), index)

    async def job_submission(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        try:
            version = int(request.query.get("version", ""))
            if version < 0:
                raise ValueError
        except ValueError:
            raise bad_request("Unable to parse job submission version parameter") from None
        namespace = namespace_of(request)

        def submission() -> JSON | None:
            return self.sim.job_registry.submission(namespace, p["id"], version)

        # Its index is that of the version it came with; 0 when there is none.
        index = await block(
            self.sim, request, lambda: (submission() or {}).get("JobModifyIndex", 0)
        )
        found_one = submission()
        if found_one is None:
            raise ApiError(404, "job source not found")
        return reply(found_one, index)

    async def job_deployments(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index, rec = await self._blocking_job_read(request, p, "deployment")
        deps = [self.sim.deployments[d] for d in reversed(rec.deployment_ids)] if rec else []
        return reply(deps, index)

    async def job_deployment(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        index, rec = await self._blocking_job_read(request, p, "deployment")
        dep = self.sim.deployments[rec.deployment_ids[-1]] if rec and rec.deployment_ids else None
        return reply(dep, index)

    async def job_evaluate(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        await read_json(request, required=False)
        out = self.sim.evaluate_job(p["id"], namespace_of(request))
        return write_reply(out)

    async def job_plan(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await self._job_body(request, p["id"])
        namespace = request.query.get("namespace") or body["Job"].get("Namespace") or "default"
        rec = self.sim.jobs.get((namespace, p["id"]))
        job = canonicalize(body["Job"], namespace)
        self.sim.job_registry.admit(job)
        if rec is not None:
            job.update(Version=rec.job["Version"])
        current = rec.job if rec is not None else None
        planned = self.sim.scheduler.plan(job, current)
        if body.get("Diff"):
            kind = "Added" if current is None else "None"
            if current is not None and spec_of(current) != spec_of(job):
                kind = "Edited"
            planned["Diff"] = {"Type": kind, "ID": job["ID"], "Fields": None, "Objects": None}
        else:
            planned["Diff"] = None
        jmi = rec.job["JobModifyIndex"] if rec else 0
        return reply(
            {
                "Index": self.sim.index,
                "JobModifyIndex": jmi,
                **planned,
                "Warnings": "",
                "NextPeriodicLaunch": "0001-01-01T00:00:00Z",
            },
            self.sim.index,
        )

    async def job_periodic_force(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        out = self.sim.job_registry.force_periodic(p["id"], namespace_of(request))
        return write_reply(out)

    async def job_dispatch(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await read_json(request, required=False) or {}
        if not isinstance(body, dict):
            raise bad_request(NOT_AN_OBJECT)
        out = self.sim.dispatch_job(p["id"], namespace_of(request), body)
        return write_reply(out)

    async def job_revert(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await _job_version_body(request)
        out = self.sim.revert_job(
            p["id"], namespace_of(request), body["JobVersion"], body.get("EnforcePriorVersion")
        )
        return write_reply(out)

    async def job_stable(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        body = await _job_version_body(request)
        out = self.sim.stable_job(
            p["id"], namespace_of(request), body["JobVersion"], bool(body.get("Stable"))
        )
        return write_reply(out)

    async def job_scale(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        out = self.sim.scale_job(p["id"], namespace_of(request), await read_object(request))
        return write_reply(out)

    async def job_scale_status(
        self, request: web.Request, p: dict[str, str], t: JSON | None
    ) -> web.Response:
        sim, key = self.sim, (namespace_of(request), p["id"])

        def live_allocs() -> list[JSON]:
            allocs = (sim.allocs[a] for a in sim.job_allocs.get(key, ()))
            return [a for a in allocs if a["ClientStatus"] not in TERMINAL]

        def index_of() -> int:
            # Nomad: the newest of the job, its live allocations and its scaling events;
            # the latest index while there is no such job.
            rec = sim.jobs.get(key)
            if rec is None:
                return sim.index
            allocs = [int(a["ModifyIndex"]) for a in live_allocs()]
            return max([int(rec.job["ModifyIndex"]), rec.scaling_index, *allocs])

        index = await block(sim, request, index_of)
        rec = found(sim.jobs.get(key), "job")
        groups: dict[str, JSON] = {
            g["Name"]: {
                "Desired": g["Count"],
                "Placed": 0,
                "Running": 0,
                "Healthy": 0,
                "Unhealthy": 0,
                "Events": rec.scaling_events.get(g["Name"]),
            }
            for g in rec.job["TaskGroups"]
        }
        for alloc in live_allocs():
            group = groups.get(alloc["TaskGroup"])
            if group is None:
                continue
            group["Placed"] += 1
            group["Running"] += alloc["ClientStatus"] == "running"
            # No health checks here: a running allocation counts as healthy unless its
            # deployment said otherwise.
            healthy = (alloc.get("DeploymentStatus") or {}).get("Healthy")
            group["Healthy"] += healthy is True or (
                healthy is None and alloc["ClientStatus"] == "running"
            )
            group["Unhealthy"] += healthy is False
        return reply(
            {
                "JobID": rec.key[1],
                "Namespace": rec.key[0],
                "JobCreateIndex": rec.create_index,
                "JobModifyIndex": rec.job["ModifyIndex"],
                "JobStopped": bool(rec.job.get("Stop")),
                "TaskGroups": groups,
            },
            index,
        )


def _register_options(body: JSON) -> RegisterOptions:
    """The options of a registration's body, checked as Nomad's agent checks them."""
    flags = {}
    for name in ("PreserveCounts", "PreserveResources"):
        value = body.get(name, False)
        if not isinstance(value, bool):
            raise bad_request(f"Failed to decode request body: {name} must be a bool")
        flags[name] = value
    priority = body.get("EvalPriority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise bad_request("Failed to decode request body: EvalPriority must be a number")
    if priority != 0:
        _check_eval_priority(priority)
    submission = body.get("Submission")
    if submission is not None:
        submission = _submission(submission)
    return RegisterOptions(
        preserve_counts=flags["PreserveCounts"],
        preserve_resources=flags["PreserveResources"],
        eval_priority=priority,
        submission=submission,
    )


def _check_eval_priority(priority: int) -> None:
    if not 1 <= priority <= 100:
        raise bad_request("Eval priority must be between 1 and 100 inclusively")


def _submission(raw: Any) -> JSON:
    """A job's source as registered (JobSubmission): Source, Format, Variables, and the
    -var flags (an empty map is none)."""
    if not isinstance(raw, dict):
        raise bad_request("Failed to decode request body: Submission must be an object")
    texts = {k: raw.get(k) or "" for k in ("Source", "Format", "Variables")}
    flags = raw.get("VariableFlags") or None
    if not all(isinstance(v, str) for v in texts.values()) or not (
        flags is None
        or (isinstance(flags, dict) and all(isinstance(v, str) for v in flags.values()))
    ):
        raise bad_request("Failed to decode request body: Submission fields must be strings")
    return {**texts, "VariableFlags": flags}


async def _job_version_body(request: web.Request) -> JSON:
    """The body of a revert or a stable request: an object with a JobVersion number."""
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("JobVersion"), int):
        raise bad_request("Failed to decode request body: JobVersion must be a number")
    return body
