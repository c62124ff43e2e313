"""When the chaos campaign calls a job back to training after a fault: every rank on a process
started after the fault (when the fault restarts training), each with two new steps. Steps from
the old processes, which may train on for a moment, never count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = str(Path(__file__).resolve().parents[3] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)

from chaos_watch import Before, Recovery  # noqa: E402

pytestmark = pytest.mark.timeout(30)

A, B = "lm.trainer.0", "lm.trainer.1"
BEFORE = Before(steps={A: 42, B: 42}, pids={A: 100, B: 200})


def test_old_processes_training_on_do_not_count() -> None:
    recovery = Recovery([A, B], BEFORE, restarted=True, checkpoint_every=5)
    for step in (43, 44, 45, 46):  # the old processes, not yet told to stop
        recovery.look({A: 100, B: 200}, {A: step, B: step})
    assert not recovery.training
    recovery.look({A: 101, B: 201}, {A: 46, B: 46})  # new processes, not beaten yet: stale steps
    assert not recovery.training
    recovery.look({A: 101, B: 201}, {A: 41, B: 41})
    assert not recovery.training  # one new step each
    recovery.look({A: 101, B: 201}, {A: 42, B: 43})
    assert recovery.training
    assert recovery.lost_steps == 42 - 40  # resumed from the checkpoint at step 40


def test_every_rank_must_have_a_new_process() -> None:
    recovery = Recovery([A, B], BEFORE, restarted=True, checkpoint_every=5)
    for step in (43, 44, 45):
        recovery.look({A: 101, B: 200}, {A: step, B: step})  # B still on its old process
    assert not recovery.training


def test_without_a_restart_two_moves_of_the_same_processes_suffice() -> None:
    recovery = Recovery([A, B], BEFORE, restarted=False, checkpoint_every=5)
    recovery.look({A: 100, B: 200}, {A: 42, B: 42})
    recovery.look({A: 100, B: 200}, {A: 43, B: 43})
    assert not recovery.training
    recovery.look({A: 100, B: 200}, {A: 44, B: 45})
    assert recovery.training and recovery.lost_steps == 0


def test_the_start_waits_for_a_process_and_two_steps_on_every_rank() -> None:
    recovery = Recovery([A, B], Before({}, {}), restarted=False, checkpoint_every=1)
    recovery.look({A: None, B: None}, {})
    recovery.look({A: 100, B: 200}, {})  # processes started, no step yet
    recovery.look({A: 100, B: 200}, {A: 1, B: 1})
    assert not recovery.training
    recovery.look({A: 100, B: 200}, {A: 2, B: 2})
    assert recovery.training


def test_a_replaced_actor_showing_step_0_before_its_first_beat_is_no_move() -> None:
    """The role and node tiers replace actors: a new actor shows step 0 until it beats. Read as
    a step, it made every step before the fault "lost" (10,426 and 31,541 in two campaigns)."""
    before = Before(steps={A: 4_213, B: 4_213}, pids={A: 100, B: 200})
    recovery = Recovery([A, B], before, restarted=True, checkpoint_every=5)
    recovery.look({A: 101, B: 201}, {A: 4_213, B: 4_213})  # the old actors' last steps, still shown
    recovery.look({A: 101, B: 201}, {A: 0, B: 0})  # replaced actors, not beaten yet
    recovery.look({A: 101, B: 201}, {A: 4_211, B: 4_211})
    assert not recovery.training  # one step each: 0 is not one
    recovery.look({A: 101, B: 201}, {A: 4_212, B: 4_212})
    assert recovery.training
    assert recovery.lost_steps == 4_213 - 4_210  # resumed from the checkpoint at step 4,210
