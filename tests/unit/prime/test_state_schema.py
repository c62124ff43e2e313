"""Stored job states of every earlier schema version load, field by field, and resume.

The fixtures in `state_fixtures/` are snapshots of what released code wrote (see their README);
they are never regenerated, only added to when the schema version moves on.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dlu_api.status import JobStage
from dlu_api.vocabulary import ActorStage, Tier
from dlu_prime.master.manager import PrimeManager, new_state
from dlu_prime.master.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    SchemaVersionError,
    migrate_1_to_2,
    migrate_2_to_3,
    migrate_3_to_4,
    migrate_4_to_5,
    migrate_5_to_6,
    migrate_6_to_7,
    migrate_7_to_8,
    migrate_8_to_9,
    upgrade,
)
from dlu_prime.master.state import MAX_EVENTS, JobState, RelaunchRecord
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim_scheduler import SimScheduler

pytestmark = pytest.mark.timeout(30)

FIXTURES = Path(__file__).parent / "state_fixtures"
FIRST_WAVE = "job_state_v1.json"
LATE_V1 = "job_state_v1_failover.json"
V2 = "job_state_v2.json"
V3 = "job_state_v3.json"
V4 = "job_state_v4.json"
V5 = "job_state_v5.json"
V6 = "job_state_v6.json"
V7 = "job_state_v7.json"
V8 = "job_state_v8.json"
TRAINERS = [f"lm.trainer.{rank}" for rank in range(4)]


def _document(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return found


def _load(name: str) -> JobState:
    return JobState.loads((FIXTURES / name).read_bytes())


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_every_earlier_version_has_a_fixture_and_a_migration() -> None:
    assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION))
    versions = {json.loads(p.read_text())["schema_version"] for p in FIXTURES.glob("job_state_v*.json")}
    assert versions == set(range(1, SCHEMA_VERSION))


def test_first_wave_document_loads_field_by_field() -> None:
    state = _load(FIRST_WAVE)
    assert state.schema_version == SCHEMA_VERSION
    assert state.run_id == "5f0c3e1d9a7b4c2e8f6a1b3c5d7e9f01"
    assert (state.stage, state.exit_code, state.reason) == (JobStage.RUNNING, None, "job started")
    trainer = state.spec.role("trainer")
    assert (state.spec.name, trainer.total, trainer.per_group) == ("lm", 4, 2)
    assert trainer.elastic is not None and trainer.elastic.nnodes == "2"
    assert state.spec.limits.job_max_restart == 5
    assert state.spec.state_store.name == "embedded"
    assert sorted(state.roles) == ["evaluator", "trainer"]
    for role in state.roles.values():
        assert role.restart_count == role.inplace_restart_count == 0
        assert role.sub_master_restart_count == role.escalation_count == 0
    assert list(state.actors) == [*TRAINERS, "lm.evaluator.0"]
    for name, actor in state.actors.items():
        assert actor.stage is ActorStage.RUNNING
        assert actor.node_id == ("node-00001" if name in TRAINERS[2:] else "node-00000")
        assert (actor.restart_count, actor.total_failures, actor.errors_seen, actor.error) == (0, 0, 0, None)
    assert state.actors["lm.trainer.3"].rank == 3
    assert state.job_restart_count == state.global_restart_count == 0
    assert state.master_restart_count == state.node_restart_count == 0
    assert (state.removed_nodes, state.node_failures) == ([], {})
    assert state.failover is None
    assert state.endpoints == {}
    assert state.channels["eval-batches"].actor_name == "lm-channel-eval-batches"
    kinds = [e.kind for e in state.events]
    assert kinds == ["job_created", "actors_created", "stage", "stage", "channel_created"]
    assert all(e.tier is None and e.duration_s is None for e in state.events)
    assert state.events[0].message == "job lm created (run 5f0c3e1d)"
    assert (state.created_at, state.updated_at) == (1764000000.0, 1764000019.5)


def test_late_v1_document_with_a_failover_in_flight_loads_field_by_field() -> None:
    state = _load(LATE_V1)
    assert state.stage is JobStage.RUNNING
    assert state.failover is not None
    assert (state.failover.tier, state.failover.role) == (Tier.ROLE, "trainer")
    assert state.failover.actors == ["lm.trainer.3"] and state.failover.culprit == "lm.trainer.3"
    assert state.failover.started_at == 1766000014.0
    assert "lost its raylet" in state.failover.reason
    trainer = state.roles["trainer"]
    assert (trainer.restart_count, trainer.escalation_count, trainer.inplace_restart_count) == (1, 1, 0)
    victim = state.actors["lm.trainer.3"]
    assert (victim.stage, victim.restart_count, victim.total_failures) == (ActorStage.INIT, 1, 1)
    assert state.actors["lm.trainer.submaster"].rank == -1
    assert state.node_failures == {"node-00001": 1}
    assert state.endpoints == {"trainer": {"address": "10.0.0.5:50051"}}
    started = state.events[-1]
    assert (started.kind, started.tier, started.actor, started.node_id) == (
        "failover_started",
        "role",
        "lm.trainer.3",
        "node-00001",
    )


@pytest.mark.parametrize("name", [FIRST_WAVE, LATE_V1, V2, V3, V4, V5, V6, V7, V8])
def test_migration_writes_every_field_of_the_current_shape(name: str) -> None:
    """Explicit defaults, so the next migration can rely on every field being there."""
    original = _document(name)
    upgraded = upgrade(original)
    assert original == _document(name), "a migration changed its input"
    assert upgraded["schema_version"] == SCHEMA_VERSION
    state = JobState.model_validate(upgraded)
    assert json.loads(state.dumps()) == upgraded | {"spec": json.loads(state.spec.model_dump_json())}
    assert JobState.loads(state.dumps()) == state


def test_a_failover_flag_left_set_by_the_first_wave_is_dropped_with_a_note() -> None:
    document = _document(FIRST_WAVE)
    document["failover_in_progress"] = True
    document["roles"]["trainer"]["failover_in_progress"] = True
    migrated = migrate_1_to_2(document)
    assert "failover_in_progress" not in migrated
    assert "failover_in_progress" not in migrated["roles"]["trainer"]
    note = migrated["events"][-1]
    assert note["kind"] == "schema_migrated" and note["time"] == document["updated_at"]
    assert JobState.model_validate(migrated).failover is None


def test_a_document_from_a_newer_dlu_prime_is_refused_naming_both_versions() -> None:
    future = json.loads(new_state(_load(FIRST_WAVE).spec).dumps())
    future["schema_version"] = SCHEMA_VERSION + 1
    future["a_field_of_the_future"] = {"x": 1}
    with pytest.raises(SchemaVersionError) as info:
        JobState.loads(json.dumps(future).encode())
    message = str(info.value)
    assert f"schema version {SCHEMA_VERSION + 1}, newer than this dlu-prime's {SCHEMA_VERSION}" in message
    assert "Upgrade dlu-prime" in message
    assert isinstance(info.value, ValueError)  # callers that catch ValueError keep working


@pytest.mark.parametrize("name", [FIRST_WAVE, LATE_V1, V2, V3, V4, V5, V6, V7, V8])
def test_dlu_resume_of_an_old_document_runs_the_job_again(name: str) -> None:
    store = MemoryStateStore()
    store.put("lm", (FIXTURES / name).read_bytes(), None)
    old = _load(name)
    clock = Clock(1_800_000_000.0)
    sim = SimScheduler(old.spec, clock, new_state(old.spec).actors)
    manager = PrimeManager.resume(old.spec, sim, store, clock=clock)
    manager.prepare()
    manager.start()
    sim.beat()
    manager.monitor_once()
    assert manager.state.stage is JobStage.RUNNING
    assert manager.state.job_restart_count == 1
    assert manager.state.roles["trainer"].restart_count == old.roles["trainer"].restart_count
    assert manager.state.events[: len(old.events)] == old.events
    stored = store.get("lm")
    assert stored is not None and json.loads(stored.data)["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize("name", [FIRST_WAVE, LATE_V1, V2, V3, V4, V5, V6, V7, V8])
def test_a_restarted_prime_master_recovers_an_old_document(name: str) -> None:
    """Tier 6 after an upgrade: the RUNNING job carries on, an in-flight failover is finished."""
    store = MemoryStateStore()
    token = store.put("lm", (FIXTURES / name).read_bytes(), None)
    old = _load(name)
    clock = Clock(1_800_000_000.0)
    sim = SimScheduler(old.spec, clock, old.actors)
    sim.setup(list(old.actors))
    sim.start(list(old.actors))
    manager = PrimeManager.self_recover(old.spec, sim, store, clock=clock)
    assert manager is not None and manager.token == token + 1
    assert manager.state.master_restart_count == 1
    manager.resume_in_flight()
    assert manager.state.failover is None
    sim.beat()
    manager.monitor_once()
    assert manager.state.stage is JobStage.RUNNING, manager.state.reason
    kinds = [e.kind for e in manager.state.events[len(old.events) :]]
    assert kinds == (["master_restarted", "failover_done"] if old.failover else ["master_restarted"])
    assert manager.state.run_id == old.run_id


def test_a_v2_document_gets_no_resize_in_flight_and_zero_resize_counts() -> None:
    document = _document(V2)
    assert "resize" not in document and "resize_count" not in document["roles"]["trainer"]
    state = _load(V2)
    assert state.resize is None
    assert {r.resize_count for r in state.roles.values()} == {0}
    assert state.failover is not None and state.failover.culprit == _load(LATE_V1).failover.culprit  # pyright: ignore[reportOptionalMemberAccess]
    assert state.events == _load(LATE_V1).events
    assert migrate_2_to_3(document)["resize"] is None and document == _document(V2)


def test_a_migration_never_shares_state_with_its_input() -> None:
    document = _document(LATE_V1)
    migrated = migrate_1_to_2(document)
    migrated["roles"]["trainer"]["restart_count"] = 99
    migrated["events"].clear()
    assert document == _document(LATE_V1)
    assert copy.deepcopy(migrated) == migrated


@pytest.mark.parametrize("name", [V2, V3, V4, V5, V6, V7, V8])
def test_a_document_before_v4_gets_event_positions_and_its_first_failure(name: str) -> None:
    document = _document(name)
    state = _load(name)
    assert state.schema_version == SCHEMA_VERSION
    assert [e.seq for e in state.events] == list(range(1, len(document["events"]) + 1))
    assert state.event_seq == len(document["events"])
    assert state.first_failure is not None and state.first_failure.kind == "died"
    assert state.failover is not None and state.failover.culprit == "lm.trainer.3"
    # A new event carries on the numbering.
    assert state.record("note", "after the upgrade").seq == state.event_seq == len(document["events"]) + 1


def test_first_failure_outlives_the_bounded_timeline() -> None:
    state = _load("job_state_v2.json")
    first = state.first_failure
    for i in range(MAX_EVENTS + 10):
        state.record("died" if i % 2 else "stage", f"event {i}")
    assert len(state.events) == MAX_EVENTS
    assert state.first_failure == first
    assert state.to_status(events_after=state.event_seq - 3).events == state.events[-3:]
    assert state.to_status(events=0).first_failure == first


def test_a_v3_document_keeps_its_resize_fields_and_gains_event_positions() -> None:
    document = _document(V3)
    assert document["resize"] is None and "seq" not in document["events"][0]
    upgraded = migrate_3_to_4(document)
    assert upgraded["schema_version"] == 4 and document == _document(V3)
    assert upgraded["resize"] is None and {r["resize_count"] for r in upgraded["roles"].values()} == {0}
    assert _load(V3).to_status() == _load(V2).to_status()


def test_a_v4_document_gains_the_request_and_resize_fields_of_schema_5() -> None:
    document = _document(V4)
    for name in ("requests",):
        document.pop(name, None)  # a version-4 document written before the field was added
    for role in document["roles"].values():
        role.pop("target_nodes", None)
        role.pop("last_resize_at", None)
    upgraded = migrate_4_to_5(document)
    assert upgraded["schema_version"] == 5 and "requests" not in document
    assert upgraded["requests"] == {}
    assert {(r["target_nodes"], r["last_resize_at"]) for r in upgraded["roles"].values()} == {(None, None)}
    assert _load(V4).to_status() == _load(V3).to_status()


def test_a_v5_document_gains_the_memory_relaunch_fields_of_schema_6() -> None:
    document = _document(V5)
    upgraded = migrate_5_to_6(document)
    assert upgraded["schema_version"] == 6 and document == _document(V5)
    assert (upgraded["relaunch"], upgraded["relaunch_count"]) == (None, 0)
    assert {(a["memory"], a["memory_raised_at"]) for a in upgraded["actors"].values()} == {(None, None)}
    assert _load(V5).to_status() == _load(V4).to_status()


def test_a_v6_document_gains_the_seats_of_schema_7() -> None:
    document = _document(V6)
    upgraded = migrate_6_to_7(document)
    assert upgraded["schema_version"] == 7 and document == _document(V6)
    assert {a["seat"] for a in upgraded["actors"].values()} == {None}
    in_flight = {**document, "relaunch": {"actor": "lm.trainer.1", "role": "trainer", "old_memory": 1,
                                          "new_memory": 2, "reason": "r", "started_at": 0.0, "error": None}}  # fmt: skip
    relaunch = migrate_6_to_7(in_flight)["relaunch"]
    assert (relaunch["seat"], relaunch["old_seat"]) == (None, None)
    assert _load(V6).to_status() == _load(V5).to_status()


def test_a_v7_document_gains_the_failover_records_alive_actors_of_schema_8() -> None:
    """A failover saved by schema 7 names none alive: its actors' deaths stay its own work."""
    document = _document(V7)
    upgraded = migrate_7_to_8(document)
    assert upgraded["schema_version"] == 8 and document == _document(V7)
    assert "alive" not in document["failover"] and upgraded["failover"]["alive"] == []
    state = _load(V7)
    assert state.failover is not None and state.failover.alive == []
    assert state.to_status() == _load(V6).to_status()


def test_a_v8_document_gains_the_failover_records_rebuilt_actors_of_schema_9() -> None:
    """A failover saved by schema 8 names none rebuilt: its actors' losses stay its own work."""
    document = _document(V8)
    upgraded = migrate_8_to_9(document)
    assert upgraded["schema_version"] == 9 and document == _document(V8)
    assert "rebuilt" not in document["failover"] and upgraded["failover"]["rebuilt"] == []
    assert migrate_8_to_9({**document, "failover": None})["failover"] is None
    state = _load(V8)
    assert state.failover is not None and state.failover.rebuilt == []
    assert state.to_status() == _load(V7).to_status()


GiB = 2**30


def _with_override(relaunch: bool) -> JobState:
    state = _load(V5)
    state.failover = None  # the snapshot's role failover is over: nothing else in flight
    rank = state.actors["lm.trainer.1"]
    rank.memory, rank.memory_raised_at = 3 * GiB, 1_766_000_010.0
    if relaunch:
        state.relaunch = RelaunchRecord(
            actor=rank.name,
            role="trainer",
            old_memory=2 * GiB,
            new_memory=3 * GiB,
            reason="trainer.1 at 1.9 GiB of 2 GiB (95%): relaunched with 3 GiB",
            started_at=1_766_000_010.0,
        )
        state.relaunch_count = 1
    return state


def test_a_memory_override_and_a_relaunch_in_flight_survive_save_and_load() -> None:
    state = _with_override(relaunch=True)
    loaded = JobState.loads(state.dumps())
    assert loaded == state
    assert loaded.actors["lm.trainer.1"].memory == 3 * GiB and loaded.relaunch == state.relaunch
    shown = next(a for r in loaded.to_status().roles for a in r.actors if a.name == "lm.trainer.1")
    assert shown.memory_limit_bytes == 3 * GiB


@pytest.mark.parametrize("relaunch", [False, True])
def test_a_restarted_prime_master_keeps_the_memory_a_relaunch_gave(relaunch: bool) -> None:
    """Tier 6: the scheduler is told every override before anything is replaced, and a relaunch
    in flight is carried out once more (nothing counted)."""
    state = _with_override(relaunch)
    store = MemoryStateStore()
    store.put("lm", state.dumps(), None)
    clock = Clock(1_800_000_000.0)
    sim = SimScheduler(state.spec, clock, state.actors)
    sim.setup(list(state.actors))
    sim.start(list(state.actors))
    manager = PrimeManager.self_recover(state.spec, sim, store, clock=clock)
    assert manager is not None
    assert sim.memory == {"lm.trainer.1": 3 * GiB}
    assert manager.state.actors["lm.trainer.1"].memory == 3 * GiB
    assert sim.replaced == ([("lm.trainer.1", 3 * GiB)] if relaunch else [])
    assert manager.state.relaunch is None
    kinds = [e.kind for e in manager.state.events[len(state.events) :]]
    done = ["memory_relaunch_done", "bundle_free"]  # trainer.1's share of its node's bundle
    assert kinds == (["master_restarted", *done] if relaunch else ["master_restarted"])
    assert manager.state.roles["trainer"].restart_count == state.roles["trainer"].restart_count
    sim.kill("lm.trainer.1")  # a later failover of that actor asks for its memory too
    manager.monitor_once()
    manager.resume_in_flight()
    assert sim.replaced[-1] == ("lm.trainer.1", 3 * GiB)
