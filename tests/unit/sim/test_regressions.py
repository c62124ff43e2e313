"""Seeds of benchmarks/simulate.py that once broke an invariant, each replayed at the
benchmark's default settings. Each fails with its fix undone (docs/failover.md, the revert
table); the comment says what the core or executor got wrong."""

from __future__ import annotations

import pytest

from dlu_prime.testing.sim.runner import run_seed

REGRESSIONS = {
    # A node-loss shrink forgave the in-place restart of a survivor it removed with its group
    # (its own node alive): only the removed ranks that were lost are the loss.
    5655: "counted once",
    # A SubMaster killed on its own during a node-loss shrink, on the node a job restart had put
    # it with the removed ranks, was joined to the loss uncounted: joined only if its node died.
    1091: "counted once",
}


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_a_seed_that_broke_an_invariant_holds_them_all(seed: int) -> None:
    result = run_seed(seed)
    assert result.violation is None, "\n".join(
        [f"seed {seed} ({REGRESSIONS[seed]}): {result.violation}", *result.trace]
    )
