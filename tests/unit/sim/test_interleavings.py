"""Hypothesis' stateful testing over the simulation: it picks the interleaving of faults, user
commands and PrimeMaster deaths step by step, checks every invariant after each step, and
shrinks a failing interleaving to a minimal one (printed as the steps to replay)."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dlu_api.status import JobStage
from dlu_prime.testing.sim.faults import Kind
from dlu_prime.testing.sim.runner import Run


class Interleavings(RuleBasedStateMachine):
    run: Run | None = None

    @initialize(seed=st.integers(min_value=0, max_value=2**32 - 1))
    def world(self, seed: int) -> None:
        self.run = Run(seed, fault_steps=0, quiet_steps=60)

    def _step(self, kind: Kind) -> None:
        assert self.run is not None
        result = self.run.guarded(lambda: self.run.step(kind) if self.run else None)
        assert result.violation is None, "\n".join([result.violation or "", *result.trace[-40:]])

    @precondition(lambda self: self.run is not None and self.run.manager.state.stage is not JobStage.STOPPED)
    @rule(kind=st.sampled_from([k for k in Kind if k is not Kind.STOP]))
    def fault(self, kind: Kind) -> None:
        self._step(kind)

    @rule()
    def nothing(self) -> None:
        """Time passes (also once the job stopped, so a run can always go on)."""
        if self.run is not None:
            self._step(Kind.NOTHING)

    @invariant()
    def steps_are_checked(self) -> None:
        if self.run is not None:
            assert self.run.result.violation is None

    def teardown(self) -> None:
        if self.run is not None and self.run.result.violation is None:
            result = self.run.finish()
            assert result.violation is None, "\n".join([result.violation or "", *result.trace[-40:]])


Interleavings.TestCase.settings = settings(
    max_examples=8,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestInterleavings = Interleavings.TestCase
