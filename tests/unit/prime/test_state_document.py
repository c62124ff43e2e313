"""The state writer's document (`DocumentEncoder`: each actor's JSON kept between writes) is
byte for byte `JobState.dumps()` after any change: a field assigned, a record replaced, copied,
added or removed, the rest of the state moved, names JSON must escape. A stale actor kept would
store a document that is not the state, so every write is compared."""

from __future__ import annotations

import random

import pytest

from dlu_api.vocabulary import ActorStage, EventKind
from dlu_prime.master.document import DocumentEncoder
from dlu_prime.master.manager import PrimeManager
from dlu_prime.master.state import ActorRecord, JobState
from dlu_prime.state.memory import MemoryStateStore
from dlu_prime.testing.sim.scale import scale_spec
from dlu_prime.testing.sim_scheduler import SimScheduler

pytestmark = pytest.mark.timeout(60)

NAMES = [
    "plain",
    "sp ace/slash",
    "del\x7f",
    'quo"te',
    "back\\slash",
    "new\nline",
    "caf\u00e9",
    "\u6f22\u5b57",
    "tab\t",
    "\x01ctl",
]


def _state(nodes: int = 4, ranks: int = 2) -> JobState:
    spec = scale_spec(nodes, ranks)
    return PrimeManager.create(spec, SimScheduler(spec), MemoryStateStore()).state


def _change(rng: random.Random, state: JobState, step: int) -> None:
    actors = state.actors
    name = rng.choice(list(actors)) if actors else None
    what = rng.randrange(9)
    if name is not None and what == 0:
        actors[name].stage = rng.choice(list(ActorStage))
    elif name is not None and what == 1:
        actors[name].restart_count += 1
        actors[name].error = rng.choice([None, "boom", 'said "no"', "\u00fcber"])
    elif name is not None and what == 2:  # replaced by an equal copy, then the copy changed
        copy = actors[name].model_copy(update={"node_id": f"node-{step}"})
        actors[name] = copy
    elif name is not None and what == 3:
        del actors[name]
    elif what == 4:
        new = f"{rng.choice(NAMES)}-{step}"
        actors[new] = ActorRecord(name=new, role="train", rank=step)
    elif name is not None and what == 5:  # the same record moved to the end of the order
        actors[name] = actors.pop(name)
    elif what == 6:
        state.record(EventKind.WAITING_FOR_NODES, f"note {step} \u2713")
    elif what == 7:
        state.node_failures[f"node-{step % 3}"] = step
    elif name is not None:
        actors[name].memory = rng.choice([None, 2**40 + step])
        actors[name].memory_raised_at = rng.choice([None, step / 3.0, 1e-7 * step, 1e21 + step])


def test_every_write_is_the_state_byte_for_byte() -> None:
    rng = random.Random(11)
    for _ in range(20):
        state = _state()
        encoder = DocumentEncoder()
        assert encoder.encode(state) == state.dumps()
        for step in range(60):
            for _ in range(rng.randint(1, 3)):
                _change(rng, state, step)
            assert encoder.encode(state) == state.dumps()


def test_one_encoder_writes_states_it_did_not_see_before() -> None:
    """A writer's state may be replaced by another of the same job (a rebuilt one)."""
    encoder = DocumentEncoder()
    first, second = _state(), _state()
    assert encoder.encode(first) == first.dumps()
    assert encoder.encode(second) == second.dumps()
    second.actors[next(iter(second.actors))].stage = ActorStage.FAILED
    assert encoder.encode(first) == first.dumps()
    assert encoder.encode(second) == second.dumps()


def test_a_document_of_one_actor_and_of_none() -> None:
    state = _state()
    encoder = DocumentEncoder()
    for name in list(state.actors):
        assert encoder.encode(state) == state.dumps()
        del state.actors[name]
    assert encoder.encode(state) == state.dumps()


def test_a_record_under_another_name_is_written_under_that_name() -> None:
    state = _state()
    encoder = DocumentEncoder()
    encoder.encode(state)
    name, record = next(iter(state.actors.items()))
    state.actors["moved"] = state.actors.pop(name)
    assert record.name == name
    assert encoder.encode(state) == state.dumps()


def test_the_kept_json_is_no_field() -> None:
    """A record with its JSON kept equals, dumps, iterates and loads as one never written."""
    state = _state()
    DocumentEncoder().encode(state)
    record = next(iter(state.actors.values()))
    same = ActorRecord.model_validate_json(record.model_dump_json())
    assert record.__dict__ != same.__dict__  # the JSON is kept in the one written
    assert record == same
    assert record.model_dump() == same.model_dump()
    assert dict(record) == dict(same)
    assert record.model_copy(update={"rank": 99}) != same
