"""What `dlu history` and `dlu plan` print, read from the Brain's database (no Brain process needed)."""

from __future__ import annotations

from dlu_brain.db import BrainDatabase


def history_lines(db: BrainDatabase, limit: int = 20) -> list[str]:
    """Finished jobs, newest first: outcome, duration, and per role the sizes it ran at with their
    throughput (the best marked *)."""
    lines: list[str] = []
    for job in db.finished_jobs(limit=limit):
        took = (job.ended_at or job.started_at) - job.started_at
        lines.append(
            f"{job.name} run {job.run_id}: {job.outcome} after {took:.0f} s (signature {job.signature[:12]})"
        )
        for role in sorted(job.roles):
            by_size = db.throughput_by_size(job.id, role)
            if not by_size:
                lines.append(f"  {role}: size {job.roles[role].get('size')}, no throughput measured")
                continue
            best = max(by_size, key=by_size.__getitem__)
            sizes = ", ".join(f"{n}{'*' if n == best else ''}: {v:.1f}/s" for n, v in sorted(by_size.items()))
            lines.append(f"  {role}: {sizes}")
    return lines or ["no finished jobs in the Brain's database"]


def plan_lines(db: BrainDatabase, name: str) -> list[str]:
    """The job's newest run: each role's current plan and why, then its latest optimize events."""
    job = db.find_job(name)
    if job is None:
        raise KeyError(f"the Brain's database ({db.where}) has no job {name!r}")
    state = "running" if job.ended_at is None else f"finished ({job.outcome})"
    own = job.marginal_threshold
    threshold = "the Brain's threshold" if own is None else f"threshold {own:.0%} of linear"
    if job.backlog_target_s is not None:
        threshold += f", backlog target {job.backlog_target_s:g} s"
    lines = [f"{job.name} run {job.run_id}: {state} ({threshold})"]
    plans = db.current_plans(job.id)
    if not plans:
        lines.append("  no plan: the job runs the sizes its spec gives")
    for plan in plans:
        what = (
            f"size {plan.size}"
            if plan.size is not None
            else f"memory {(plan.memory_bytes or 0) / 2**20:.0f} MiB"
        )
        lines.append(f"  {plan.role}: {what} [{plan.state}, {plan.algorithm}] {plan.reason}")
    events = db.events(job.id)[-5:]
    if events:
        lines.append("  latest optimize events:")
        lines += [f"    {e.kind} {e.role or ''} -> {e.state}".rstrip() for e in events]
    return lines
