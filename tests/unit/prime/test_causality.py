"""The causality rules (docs/failover.md): an effect joins a fault in flight only when that
fault caused it; an independent fault is a fault of its own, whatever is in flight."""

from __future__ import annotations

import pytest

from dlu_prime.master.causality import FaultInFlight, Report, caused_by_loss, effect_of, is_peer_failure

pytestmark = pytest.mark.timeout(30)

NODES: dict[str, str | None] = {"r0": "n0", "r1": "n1", "r2": "n2"}
PEER = "RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:4242"
HANG = "training step stuck at 20 for 8.0s (hang timeout 8s)"


def test_a_peers_failed_collective_joins_the_fault_in_flight() -> None:
    assert effect_of(Report("r0", PEER), FaultInFlight(frozenset({"r1"})), [], NODES)


def test_a_peers_failed_collective_joins_a_dead_peer() -> None:
    assert effect_of(Report("r0", PEER), None, ["r1"], NODES)


def test_a_hang_or_own_crash_is_never_another_ranks_effect() -> None:
    fault = FaultInFlight(frozenset({"r1"}))
    assert not effect_of(Report("r0", HANG), fault, ["r1"], NODES)
    assert not effect_of(Report("r0", "exited -9"), fault, ["r1"], NODES)


def test_a_rank_replaced_or_on_the_lost_node_joins() -> None:
    assert effect_of(Report("r1", "exited -9"), FaultInFlight(frozenset({"r1"})), [], NODES)
    assert effect_of(Report("r2", HANG), FaultInFlight(frozenset({"r1"}), frozenset({"n2"})), [], NODES)


def test_a_peer_error_with_nothing_in_flight_and_no_dead_peer_is_its_own() -> None:
    assert not effect_of(Report("r0", PEER), None, [], NODES)
    assert not effect_of(Report("r0", PEER), None, ["r0"], NODES)  # itself is no peer


def test_a_node_loss_forgives_only_what_it_caused() -> None:
    restarts = [
        ("r0", "n0", "exited -9"),  # an independent crash: counted
        ("r2", "n2", "ValueError"),  # a rank on the lost node
        ("r0", "n0", PEER),  # the lost peer's effect
        (None, None, HANG),
    ]
    assert caused_by_loss(restarts, ["r2"], ["n2"]) == 2


def test_peer_errors() -> None:
    assert is_peer_failure("ncclRemoteError: remote process exited")
    assert not is_peer_failure(HANG)


def test_a_survivor_refused_by_the_lost_peer_is_forgiven_with_the_loss() -> None:
    """A round formed just before a node loss: a survivor's process connects to the peer on the
    lost node and is refused; the loss caused that restart, so it forgives it (rule 3)."""
    refused = "RuntimeError: [gloo/transport/tcp/pair.cc:144] connect [127.0.0.1]:39477: Connection refused"
    restarts = [("r1", "n1", refused), ("r0", "n0", "RuntimeError: injected crash at step 10")]
    assert caused_by_loss(restarts, ["r2"], ["n2"]) == 1  # the own crash stays counted
