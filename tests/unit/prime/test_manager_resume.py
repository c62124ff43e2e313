"""Resuming a stored job (`dlu resume`): counters, budgets and timeline carry over."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_api.status import EventCursor, JobStage
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
