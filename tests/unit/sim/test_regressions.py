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
    # A PrimeMaster that saved its judgement of an in-place report and died before answering
    # counted it again when the SubMaster asked the rebuilt one: a report carries an id now,
    # and a judged id is answered from its saved decision.
    36: "counted once",
    # A pass's error report (a mark-unhealthy) was saved in one write and the recovery it began
    # in the next: a PrimeMaster killed between them lost the mark (the CLI's retry refused as
    # a duplicate). A decision and the ones that follow from it are one write now.
    2: "counted once",
    # A mark saved with its request id but not yet judged by a pass was lost with the
    # PrimeMaster that held it in memory: it is saved pending and a rebuilt one judges it.
    242: "counted once",
    # A role failover a rebuilt PrimeMaster resumed through a SubMaster that had died with its
    # node called the dead SubMaster, failed and escalated to a job restart of the survivors:
    # it waits for the set-up incarnation, and the SubMaster's recovery takes its ranks along.
    194: "no healthy actor restarted",
    # (found once marks were saved pending) a pending mark re-judged after a resize removed its
    # actor: the pass took a failure of an actor no longer in the state (KeyError), and a later
    # actor of the same name was recovered for it. Injected failures of removed actors are
    # dropped, and an actor's removal settles the marks pending on it.
    1772: "manager raised",
    2861: "counted once",
    # A role failover saved with its replacement placed, then the replacement's node lost before
    # the rebuilt PrimeMaster resumed it: the resume replaced it again from its first step and
    # the new death was absorbed uncounted. The rebuilt one looks at the placed replacements
    # first; one that died is judged as a pass judges it (counted, and the saved failover goes
    # on inside its recovery).
    8553: "counted once",
    11945: "counted once",
    # (found by the first version of that fix) a saved SubMaster failover of the MIN:MAX elastic
    # role whose placed replacement died with its node: the ranks lost with it were a second
    # counted failover of the role. Ranks lost with the node their own SubMaster died with join
    # the SubMaster's recovery, counted once on it.
    16919: "counted once",
    # (the gate that spared a saved failover's actors removed) an actor marked unhealthy, its
    # failover saved, then its process killed before the rebuilt PrimeMaster resumed: the kill
    # was absorbed uncounted. The saved failover records which of its actors were alive as it
    # began; Ray's rebuild of one of those (or its loss with a dead node) is a fault of its own.
    17404: "counted once",
    # (same) a job-level restart saved in RUNNING (only its start left), then a replacement's
    # node lost: the rebuilt PrimeMaster replaced every actor again and absorbed the loss. It
    # starts the live ones and ends the restart; the next pass judges the dead.
    17842: "counted once",
    # (the 100,000-seed run) a counted own fault, then a resize of its role (a `dlu scale`), then
    # the loss of the node it had happened on, which now held a rank of the new world: the loss
    # forgave it. Only restarts since the role's last resize can be the loss's effect.
    45861: "counted once",
    78917: "counted once",
    # (seeds 20000-29999) a data actor lost with its node, its role failover saved, the
    # PrimeMaster killed inside the write of the replacement it had placed; that replacement
    # then lost with its own node before the resume: the resume replaced it once and the second
    # loss counted 0 times. A gone actor carries the node it last ran on (Ray's record of it):
    # gone from another node than the one saved, a dead one, it is a new loss, counted on it.
    22974: "counted once",
    # A data actor killed and rebuilt by Ray on its live node, its role failover saved, the
    # PrimeMaster killed before it replaced it; then that node lost before the rebuilt PrimeMaster
    # resumed: gone where it was saved, it read as the death the failover began for, and the loss
    # counted 0 times. A failover now records the actors Ray rebuilt as it began (`rebuilt`,
    # schema 9): one of them gone for good with the node it ran on dead is a loss of its own.
    57311: "counted once",
    # (found by a first version of that fix) the rebuilt actor's node held the elastic role's
    # SubMaster, a rank and a data actor too: the resume counted the loss on the rebuilt rank
    # and the next pass again on the others. A loss of a node where other actors sat is left
    # to the pass, as any loss.
    7395: "counted once",
}


@pytest.mark.parametrize("seed", sorted(REGRESSIONS))
def test_a_seed_that_broke_an_invariant_holds_them_all(seed: int) -> None:
    result = run_seed(seed)
    assert result.violation is None, "\n".join(
        [f"seed {seed} ({REGRESSIONS[seed]}): {result.violation}", *result.trace]
    )
