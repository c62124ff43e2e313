"""restart_actors: what a SubMaster asks of the PrimeMaster to replace some of its workers."""

from __future__ import annotations

from typing import Any

import pytest

from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import RestartLimitError
from dlu_prime.master.state import JobState


def test_restart_is_counted_and_saved_before_the_scheduler_acts(make_manager: Any, store: Any) -> None:
    manager, scheduler = make_manager()
    name = next(iter(manager.state.actors))
    role = manager.state.actors[name].role
    manager.restart_actors([name], "node check: faulty")
    (call,) = scheduler.calls_to("restart")
    assert call.stored is not None  # the count was saved before the scheduler replaced the actor
    assert call.stored.actors[name].restart_count == 1
    assert call.stored.actors[name].stage is ActorStage.INIT
    assert manager.state.actors[name].restart_count == 1
    assert manager.state.roles[role].restart_count == 1
    assert manager.state.actors[name].stage is ActorStage.READY
    assert manager.state.actors[name].node_id == f"node-after-restart-{name}"
    kinds = [e.kind for e in manager.state.events]
    assert kinds[-2:] == ["actors_restarting", "actors_restarted"]
    stored = store.get(manager.state.job)
    assert JobState.loads(stored.data).roles[role].restart_count == 1


def test_restart_beyond_max_restart_is_refused_and_changes_nothing(
    make_manager: Any, make_spec: Any, make_role: Any
) -> None:
    manager, scheduler = make_manager(spec=make_spec(roles=[make_role("worker", 2, max_restart=1)]))
    names = sorted(manager.state.actors)
    manager.restart_actors(names[:1], "first")
    with pytest.raises(RestartLimitError, match="max_restart=1"):
        manager.restart_actors(names[1:], "second")
    assert manager.state.actors[names[1]].restart_count == 0
    assert len(scheduler.calls_to("restart")) == 1


def test_unknown_actor_is_refused(make_manager: Any) -> None:
    manager, _ = make_manager()
    with pytest.raises(KeyError):
        manager.restart_actors(["nope.worker.9"], "x")
