"""Resuming a stored job (`dlu resume`): counters, budgets and timeline carry over."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_api.status import EventCursor, JobStage
from dlu_prime.master.lifecycle import resumed_state
from dlu_prime.master.manager import EXIT_FAILED, EXIT_OK, PrimeManager, ResumeError
from dlu_prime.master.state import JobState


def test_resume_keeps_counters_and_timeline(
    make_manager: Any, store: Any, fake_scheduler_factory: Any, fake_clock: Any
) -> None:
    first, _ = make_manager()
    role = next(iter(first.state.roles))
    first.state.roles[role].restart_count = 2
    first.state.global_restart_count = 1
    first.finish(EXIT_FAILED, "the Ray cluster went away")
    old_events = len(first.state.events)

    resumed = PrimeManager.resume(
        first.state.spec, fake_scheduler_factory(first.state.spec), store, clock=fake_clock
    )
    state = resumed.state
    assert state.stage is JobStage.INIT
    assert state.run_id != first.state.run_id
    assert state.job_restart_count == 1
    assert state.roles[role].restart_count == 2
    assert state.global_restart_count == 1
    assert len(state.events) == old_events + 1 and state.events[-1].kind == "job_resumed"
    assert "the Ray cluster went away" in state.events[-1].message


def test_resume_is_refused_for_a_successful_job(
    make_manager: Any, store: Any, fake_scheduler_factory: Any
) -> None:
    first, _ = make_manager()
    first.finish(EXIT_OK, "done")
    with pytest.raises(ResumeError, match="already finished successfully"):
        PrimeManager.resume(first.state.spec, fake_scheduler_factory(first.state.spec), store)


def test_resume_is_refused_past_job_max_restart(
    make_manager: Any, make_spec: Any, store: Any, fake_scheduler_factory: Any
) -> None:
    first, _ = make_manager(spec=make_spec(limits={"job_max_restart": 1}))
    first.state.job_restart_count = 1
    first.finish(EXIT_FAILED, "lost")
    with pytest.raises(ResumeError, match="job_max_restart=1"):
        PrimeManager.resume(first.state.spec, fake_scheduler_factory(first.state.spec), store)


def test_resume_of_an_unknown_job_says_so(make_spec: Any, store: Any, fake_scheduler_factory: Any) -> None:
    spec = make_spec(name="never-ran")
    with pytest.raises(ResumeError, match="no stored state"):
        PrimeManager.resume(spec, fake_scheduler_factory(spec), store)


def test_resume_continues_the_event_numbering(
    make_manager: Any, store: Any, fake_scheduler_factory: Any, fake_clock: Any
) -> None:
    """Issue 27 defect 7: a resumed run numbered its events from 1 again, so the stored timeline
    held 1..n twice and a follower's cursor printed the first run's events again."""
    first, _ = make_manager()
    first.record_event("died", "rank 0 died", role=next(iter(first.state.roles)))
    first.finish(EXIT_FAILED, "the Ray cluster went away")
    cursor = EventCursor()
    seen = cursor.take(first.status(events=1000).events)
    first_failure = first.state.first_failure
    assert first_failure is not None

    resumed = PrimeManager.resume(
        first.state.spec, fake_scheduler_factory(first.state.spec), store, clock=fake_clock
    )
    resumed.record_event("node_check", "after the resume")
    stored = JobState.loads(store.get(first.state.spec.name).data)
    seqs = [e.seq for e in stored.events]
    assert seqs == sorted(set(seqs)) and seqs[0] == 1, seqs
    assert stored.event_seq == seqs[-1]
    assert stored.first_failure == first_failure
    fresh = cursor.take(resumed.status(events=1000).events)
    assert [e.kind for e in fresh] == ["job_resumed", "node_check"]
    assert {e.seq for e in fresh}.isdisjoint(e.seq for e in seen)


MiB = 2**20


def _memory_spec(make_spec: Any, memory: str = "512MiB", total: int = 2) -> Any:
    return make_spec(
        roles=[
            {"name": "prep", "entrypoint": "pkg.prep:main", "total": total, "resources": {"memory": memory}}
        ]
    )


def test_resume_keeps_the_memory_a_relaunch_gave_an_actor_and_tells_the_scheduler_before_placing(
    make_manager: Any, make_spec: Any, store: Any, fake_scheduler_factory: Any, fake_clock: Any
) -> None:
    """Issue 30: after a memory relaunch gave an actor 1.5x, `dlu resume` started it with its
    spec's memory again (the override was left behind with the stored run's records)."""
    first, _ = make_manager(spec=_memory_spec(make_spec))
    first.state.actors["job.prep.1"].memory = 768 * MiB
    first.state.actors["job.prep.1"].memory_raised_at = 5.0
    first.finish(EXIT_FAILED, "the Ray cluster went away")

    spec = first.state.spec
    scheduler = fake_scheduler_factory(spec)
    resumed = PrimeManager.resume(spec, scheduler, store, clock=fake_clock)
    record = resumed.state.actors["job.prep.1"]
    assert (record.memory, record.memory_raised_at) == (768 * MiB, None)  # the settle clock is the old run's
    assert resumed.state.actors["job.prep.0"].memory is None
    stored = JobState.loads(store.get(spec.name).data)
    assert stored.actors["job.prep.1"].memory == 768 * MiB
    resumed.prepare()
    assert scheduler.methods()[:2] == ["set_memory", "prepare"]
    assert scheduler.calls[0].names == (f"job.prep.1={768 * MiB}",)


def test_a_run_with_no_override_places_its_actors_without_a_memory_call(
    make_manager: Any, make_spec: Any
) -> None:
    manager, scheduler = make_manager(spec=_memory_spec(make_spec))
    manager.prepare()
    assert "set_memory" not in scheduler.methods() and "prepare" in scheduler.methods()


@pytest.mark.parametrize(
    ("case", "memory", "total", "kept"),
    [
        ("the same spec", "512MiB", 2, 768 * MiB),
        ("the spec asks for as much now", "768MiB", 2, None),
        ("the spec asks for more now", "1GiB", 2, None),
        ("the spec asks for less now", "256MiB", 2, 768 * MiB),
        ("the actor is not in the new spec", "512MiB", 1, None),
    ],
)
def test_resumed_state_keeps_an_override_only_where_the_new_spec_asks_for_less(
    make_spec: Any, case: str, memory: str, total: int, kept: int | None
) -> None:
    old = resumed_state(_memory_spec(make_spec), JobState(spec=_memory_spec(make_spec)))
    old.actors["job.prep.1"].memory = 768 * MiB
    state = resumed_state(_memory_spec(make_spec, memory, total), old)
    found = state.actors["job.prep.1"].memory if "job.prep.1" in state.actors else None
    assert found == kept, case


def test_resumed_state_drops_an_override_once_the_role_asks_for_no_memory(make_spec: Any) -> None:
    old = resumed_state(_memory_spec(make_spec), JobState(spec=_memory_spec(make_spec)))
    old.actors["job.prep.1"].memory = 768 * MiB
    plain = make_spec(roles=[{"name": "prep", "entrypoint": "pkg.prep:main", "total": 2}])
    assert resumed_state(plain, old).actors["job.prep.1"].memory is None
