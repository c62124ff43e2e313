"""The monitoring policy as a pure function: `assess`, `track_steps` and `track_beats`.

No scheduler and no clock: observations and `now` are plain values, so every rule of the health
seed (death, FAILED, pushed errors, stale heartbeats, hangs) is checked case by case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from dlu_api.spec import spec_from_dict
from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import new_state
from dlu_prime.master.monitor import Failure, assess, track_beats, track_steps
from dlu_prime.master.state import SUB_MASTER_RANK, ActorRecord, JobState
from dlu_prime.scheduler.base import ActorObservation

NOW = 10_000.0
HEARTBEAT_TIMEOUT = 60.0
HANG_TIMEOUT = 30.0

T0, T1, S0, E0 = "job.trainer.0", "job.trainer.1", "job.server.0", "job.evaluator.0"

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 3, in main\n'
    "    raise ValueError('boom')\n"
    "ValueError: boom\n"
)


def make_state(*, drivers: tuple[str, ...] = ("trainer",), hang: float | None = HANG_TIMEOUT) -> JobState:
    """trainer x2, server x1 (non-driver unless listed), evaluator x1; every actor RUNNING on node-<rank>."""
    roles = [
        {"name": name, "entrypoint": f"pkg.{name}:main", "total": total, "is_driver": name in drivers}
        for name, total in (("trainer", 2), ("server", 1), ("evaluator", 1))
    ]
    spec = spec_from_dict(
        {
            "name": "job",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": roles,
            "health": {"heartbeat_timeout_s": HEARTBEAT_TIMEOUT, "hang_timeout_s": hang},
        }
    )
    state = new_state(spec)
    for record in state.actors.values():
        record.stage = ActorStage.RUNNING
        record.node_id = f"node-{record.role}-{record.rank}"
    return state


def obs(stage: ActorStage | None = ActorStage.RUNNING, **fields: Any) -> ActorObservation:
    """A healthy observation (fresh heartbeat) unless told otherwise."""
    values: dict[str, Any] = {
        "last_heartbeat": NOW - 1.0,
        "step": 7,
        "beats": 3,
        "watched": True,
        "steps_reported": True,
        **fields,
    }
    if stage is None:
        return ActorObservation(stage=None, error=values.get("error"))
    return ActorObservation(stage=stage, **values)


def healthy(state: JobState) -> dict[str, ActorObservation]:
    return {name: obs(node_id=record.node_id) for name, record in state.actors.items()}


# failure kinds ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    id: str
    changes: Mapping[str, ActorObservation | None]
    """Observations replacing the healthy ones; None removes the actor from the poll."""
    failures: tuple[tuple[str, str], ...] = ()
    """(actor, kind) of every failure, in order."""
    stage_changes: Mapping[str, ActorStage] = field(default_factory=dict[str, ActorStage])
    steps_seen: Mapping[str, tuple[int, float]] | None = None
    beats_seen: Mapping[str, tuple[int, float]] | None = None
    hang: float | None = HANG_TIMEOUT
    message_has: str = ""


CASES = [
    Case("all-healthy", {}),
    Case(
        "gone-is-died",
        {T1: ActorObservation.gone("actor job.trainer.1 died: node lost")},
        failures=((T1, "died"),),
        message_has="node lost",
    ),
    Case(
        "gone-without-error",
        {T1: ActorObservation(stage=None)},
        failures=((T1, "died"),),
        message_has="actor died",
    ),
    Case(
        "failed-with-traceback",
        {T0: obs(ActorStage.FAILED, error=TRACEBACK)},
        failures=((T0, "failed"),),
        stage_changes={T0: ActorStage.FAILED},
        message_has="ValueError: boom",
    ),
    Case(
        "failed-without-error",
        {S0: obs(ActorStage.FAILED)},
        failures=((S0, "failed"),),
        stage_changes={S0: ActorStage.FAILED},
    ),
    Case(
        "failed-with-reported-errors-counts-once",
        {T0: obs(ActorStage.FAILED, error="x", reported_errors=("y",))},
        failures=((T0, "failed"),),
        stage_changes={T0: ActorStage.FAILED},
    ),
    Case(
        "new-reported-errors-one-failure",
        {T1: obs(reported_errors=("RuntimeError: CUDA out of memory", "second"))},
        failures=((T1, "error_report"),),
        message_has="CUDA out of memory",
    ),
    Case(
        "reported-error-while-finished",
        {E0: obs(ActorStage.FINISH, reported_errors=("late error",))},
        failures=((E0, "error_report"),),
        stage_changes={E0: ActorStage.FINISH},
    ),
    Case(
        "stale-heartbeat",
        {},
        beats_seen={T0: (3, NOW - HEARTBEAT_TIMEOUT - 1), T1: (3, NOW - 1)},
        failures=((T0, "heartbeat_timeout"),),
        message_has="no heartbeat for 61s (timeout 60s)",
    ),
    Case("heartbeat-exactly-at-timeout", {}, beats_seen={T0: (3, NOW - HEARTBEAT_TIMEOUT)}),
    Case("no-heartbeat-yet", {}, beats_seen={}),
    Case(
        "stale-heartbeat-ignored-unless-running",
        {T0: obs(ActorStage.READY)},
        beats_seen={T0: (3, NOW - 1_000)},
        stage_changes={T0: ActorStage.READY},
    ),
    Case(
        "unwatched-actor-never-stale",
        {T0: obs(watched=False, last_heartbeat=NOW - 1_000)},
        beats_seen={T0: (3, NOW - 1_000)},
        steps_seen={T0: (7, NOW - 1_000)},
    ),
    Case(
        "remote-timestamp-not-trusted",
        {T0: obs(last_heartbeat=NOW - 1_000)},
        beats_seen={T0: (3, NOW - 1)},
    ),
    Case(
        "hang",
        {},
        steps_seen={T0: (7, NOW - HANG_TIMEOUT - 1), T1: (7, NOW - 1)},
        failures=((T0, "hang"),),
        message_has="training step stuck at 7 for 31s (hang timeout 30s)",
    ),
    Case("hang-exactly-at-timeout", {}, steps_seen={T0: (7, NOW - HANG_TIMEOUT)}),
    Case("hang-detection-off", {}, steps_seen={T0: (7, NOW - 1_000)}, hang=None),
    Case("hang-needs-steps-seen", {}, steps_seen=None),
    Case("hang-needs-steps-reported", {T0: obs(steps_reported=False)}, steps_seen={T0: (7, NOW - 1_000)}),
    Case(
        "hang-ignored-unless-running",
        {T0: obs(ActorStage.FINISH)},
        steps_seen={T0: (7, NOW - 1_000)},
        stage_changes={T0: ActorStage.FINISH},
    ),
    Case(
        "stale-heartbeat-wins-over-hang",
        {},
        beats_seen={T0: (3, NOW - 100)},
        steps_seen={T0: (7, NOW - 100)},
        failures=((T0, "heartbeat_timeout"),),
    ),
    Case("missing-observation-is-skipped", {T1: None}),
    Case(
        "several-actors-in-actor-order",
        {S0: obs(ActorStage.FAILED, error="s"), T0: ActorObservation.gone("t")},
        failures=((T0, "died"), (S0, "failed")),
        stage_changes={S0: ActorStage.FAILED},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_assess_failure_kinds(case: Case) -> None:
    state = make_state(hang=case.hang)
    observations = healthy(state)
    for name, seen in case.changes.items():
        if seen is None:
            del observations[name]
        else:
            observations[name] = seen
    result = assess(state, observations, NOW, case.steps_seen, beats_seen=case.beats_seen)
    assert [(f.actor, f.kind) for f in result.failures] == list(case.failures)
    assert result.stage_changes == dict(case.stage_changes)
    for failure in result.failures:
        assert failure.role == state.actors[failure.actor].role
    if case.message_has:
        assert case.message_has in result.failures[0].message
    assert not result.all_drivers_finished


def test_sub_master_judged_by_its_beats_never_by_steps() -> None:
    """A SubMaster trains nothing: a stale serving loop is a failure, a step that never moves is not."""
    state = make_state()
    sub = "job.trainer.master"
    state.actors[sub] = ActorRecord(name=sub, role="trainer", rank=SUB_MASTER_RANK, stage=ActorStage.RUNNING)
    observations = healthy(state)
    observations[sub] = obs(step=0)
    quiet = assess(state, observations, NOW, {sub: (0, NOW - 1_000)}, beats_seen={sub: (9, NOW - 1)})
    assert quiet.failures == ()
    stale = assess(state, observations, NOW, {sub: (0, NOW - 1_000)}, beats_seen={sub: (9, NOW - 61)})
    assert [(f.actor, f.kind) for f in stale.failures] == [(sub, "heartbeat_timeout")]


def test_track_beats_uses_its_own_clock_and_forgets_pauses() -> None:
    seen = {T0: obs(beats=4), T1: obs(beats=2)}
    first = track_beats({}, seen, NOW)
    assert first == {T0: (4, NOW), T1: (2, NOW)}
    later = track_beats(first, {T0: obs(beats=4), T1: obs(beats=3)}, NOW + 5)
    assert later == {T0: (4, NOW), T1: (3, NOW + 5)}  # T0 did not move: its time stays
    paused = track_beats(later, {T0: obs(beats=4, watched=False), T1: obs(ActorStage.FINISH)}, NOW + 9)
    assert paused == {}
    again = track_beats(paused, {T0: obs(beats=4)}, NOW + 20)
    assert again == {T0: (4, NOW + 20)}  # back from a pause: judged from when it came back


def test_assess_failure_message_and_node() -> None:
    state = make_state()
    observations = healthy(state)
    observations[T1] = obs(ActorStage.FAILED, error=TRACEBACK, node_id="node-new")
    observations[T0] = ActorObservation.gone("gone for good")
    result = assess(state, observations, NOW)
    died, failed = result.failures
    assert died == Failure(T0, "trainer", "died", "gone for good", "node-trainer-0")  # node from the record
    # The failure belongs to the node the actor ran on; the poll's new node is a node change.
    assert failed == Failure(T1, "trainer", "failed", TRACEBACK, "node-trainer-1")
    assert result.node_changes == {T1: "node-new"}


def test_assess_does_not_mutate_the_state() -> None:
    state = make_state()
    before = state.model_dump()
    observations = healthy(state)
    observations[T0] = obs(ActorStage.FAILED, error="x", node_id="elsewhere")
    observations[T1] = ActorObservation.gone("dead")
    assess(state, observations, NOW, {S0: (1, 0.0)})
    assert state.model_dump() == before


# stage and node changes --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seen_node", "expected"),
    [("node-elsewhere", {T0: "node-elsewhere"}), ("node-trainer-0", {}), (None, {})],
    ids=["moved", "same-node", "no-node-reported"],
)
def test_assess_node_changes(seen_node: str | None, expected: dict[str, str]) -> None:
    state = make_state()
    observations = healthy(state)
    observations[T0] = obs(node_id=seen_node)
    result = assess(state, observations, NOW)
    assert result.node_changes == expected
    assert result.failures == ()


def test_assess_stage_changes_only_for_actors_whose_stage_moved() -> None:
    state = make_state()
    state.actors[T0].stage = ActorStage.READY
    state.actors[S0].stage = ActorStage.READY
    observations = healthy(state)  # everyone reports RUNNING
    result = assess(state, observations, NOW)
    assert result.stage_changes == {T0: ActorStage.RUNNING, S0: ActorStage.RUNNING}


# finished roles and drivers ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("drivers", "finish", "recorded_finish", "finished_roles", "all_drivers"),
    [
        (("trainer",), [T0, T1], [], ("trainer",), True),
        (("trainer",), [T0], [], (), False),
        (("trainer",), [T1], [T0], ("trainer",), True),  # one finished earlier, one now
        (("trainer",), [S0], [], ("server",), False),  # a non-driver finishing ends nothing
        (("trainer", "evaluator"), [T0, T1], [], ("trainer",), False),
        (("trainer", "evaluator"), [T0, T1, E0], [], ("trainer", "evaluator"), True),
        (("trainer", "evaluator"), [E0], [T0, T1], ("trainer", "evaluator"), True),
        (("trainer",), [T0, T1, S0, E0], [], ("trainer", "server", "evaluator"), True),
    ],
    ids=[
        "driver-finished",
        "driver-half-finished",
        "driver-finished-across-passes",
        "only-non-driver-finished",
        "one-of-two-drivers",
        "both-drivers",
        "second-driver-later",
        "everything",
    ],
)
def test_assess_finished_roles(
    drivers: tuple[str, ...],
    finish: list[str],
    recorded_finish: list[str],
    finished_roles: tuple[str, ...],
    all_drivers: bool,
) -> None:
    state = make_state(drivers=drivers)
    for name in recorded_finish:
        state.actors[name].stage = ActorStage.FINISH
    observations = healthy(state)
    for name in [*finish, *recorded_finish]:
        observations[name] = obs(ActorStage.FINISH)
    result = assess(state, observations, NOW)
    assert result.finished_roles == finished_roles
    assert result.all_drivers_finished is all_drivers
    assert result.failures == ()
    assert result.stage_changes == dict.fromkeys(finish, ActorStage.FINISH)


def test_finished_role_uses_the_record_when_the_poll_misses_an_actor() -> None:
    state = make_state()
    state.actors[T0].stage = ActorStage.FINISH
    observations = healthy(state)
    del observations[T0]
    observations[T1] = obs(ActorStage.FINISH)
    result = assess(state, observations, NOW)
    assert result.finished_roles == ("trainer",)
    assert result.all_drivers_finished


def test_a_failure_and_finished_drivers_are_both_reported() -> None:
    state = make_state()
    observations = healthy(state)
    observations[T0] = obs(ActorStage.FINISH)
    observations[T1] = obs(ActorStage.FINISH)
    observations[S0] = obs(ActorStage.FAILED, error="server crashed")
    result = assess(state, observations, NOW)
    assert result.all_drivers_finished
    assert [(f.actor, f.kind) for f in result.failures] == [(S0, "failed")]


def test_a_sub_master_does_not_count_towards_its_role_finishing() -> None:
    spec = spec_from_dict(
        {
            "name": "job",
            "device_type": "CPU",
            "device_per_node": 0,
            "roles": [
                {
                    "name": "rollout",
                    "kind": "custom",
                    "entrypoint": "pkg.r:main",
                    "total": 2,
                    "sub_master": "pkg.r:Master",
                },
            ],
        }
    )
    state = new_state(spec)
    sub = [n for n, a in state.actors.items() if a.rank == SUB_MASTER_RANK]
    assert len(sub) == 1
    observations = {name: obs(ActorStage.FINISH) for name in state.actors}
    observations[sub[0]] = obs(ActorStage.RUNNING)
    result = assess(state, observations, NOW)
    assert result.finished_roles == ("rollout",)
    assert result.all_drivers_finished
    observations["job.rollout.1"] = obs(ActorStage.RUNNING)
    assert not assess(state, observations, NOW).all_drivers_finished


# track_steps -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("previous", "seen", "expected"),
    [
        ({}, {T0: obs(step=3)}, {T0: (3, NOW)}),  # first sight starts the timer
        ({T0: (3, NOW - 50)}, {T0: obs(step=3)}, {T0: (3, NOW - 50)}),  # same step keeps it
        ({T0: (3, NOW - 50)}, {T0: obs(step=4)}, {T0: (4, NOW)}),  # a new step restarts it
        ({T0: (3, NOW - 50)}, {T0: obs(step=2)}, {T0: (2, NOW)}),  # any change counts (restart)
        ({T0: (3, NOW - 50)}, {T0: obs(ActorStage.FINISH, step=3)}, {}),  # not running: forgotten
        ({T0: (3, NOW - 50)}, {T0: ActorObservation.gone("dead")}, {}),
        ({T0: (3, NOW - 50)}, {T1: obs(step=1)}, {T0: (3, NOW - 50), T1: (1, NOW)}),  # unpolled kept
        ({}, {T0: obs(ActorStage.READY, step=9)}, {}),
    ],
    ids=["first", "same", "moved", "moved-back", "finished", "gone", "unpolled", "not-started"],
)
def test_track_steps(
    previous: dict[str, tuple[int, float]], seen: dict[str, ActorObservation], expected: dict[str, Any]
) -> None:
    snapshot = dict(previous)
    assert track_steps(previous, seen, NOW) == expected
    assert previous == snapshot  # the input is not mutated


def test_track_steps_and_assess_detect_a_hang_over_several_passes() -> None:
    state = make_state()
    steps: dict[str, tuple[int, float]] = {}
    judged: list[tuple[float, tuple[str, ...]]] = []
    for now in (NOW, NOW + 10, NOW + 20, NOW + 30, NOW + 31):
        seen = {name: obs(step=5 if name == T0 else int(now), last_heartbeat=now) for name in state.actors}
        steps = track_steps(steps, seen, now)
        result = assess(state, seen, now, steps)
        judged.append((now - NOW, tuple(f"{f.actor}:{f.kind}" for f in result.failures)))
    assert judged == [(0, ()), (10, ()), (20, ()), (30, ()), (31, (f"{T0}:hang",))]
