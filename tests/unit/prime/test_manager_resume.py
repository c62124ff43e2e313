"""Resuming a stored job (`dlu resume`): counters, budgets and timeline carry over."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_api.status import JobStage
from dlu_prime.master.manager import EXIT_FAILED, EXIT_OK, PrimeManager, ResumeError


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
