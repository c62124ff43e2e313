"""A round's failure is blamed on the rank whose own error it is, not on a peer that noticed."""

from __future__ import annotations

import pytest

from dlu_elastic.blame import BlameWindow, Report, is_peer_failure

pytestmark = pytest.mark.timeout(10)

GLOO_PEER = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [127.0.0.1]:41231"
)
OWN = "RuntimeError: injected crash at step 10 on rank 1"


def report(agent: str, error: str, at: float, round_: int = 1) -> Report:
    return Report(round_, agent, 1, error, at)


@pytest.mark.parametrize(
    "error",
    [
        GLOO_PEER,
        "torch.distributed.DistNetworkError: Connection reset by peer",
        "NCCL error: remote process exited or there was a network error, NCCL version 2.28.9",
        "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        "gloo/transport/tcp/pair.cc:598] Write error [127.0.0.1]:1234: Broken pipe",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:144] connect [127.0.0.1]:39477: "
        "Connection refused",
    ],
)
def test_errors_a_lost_peer_causes_read_as_peer_failures(error: str) -> None:
    assert is_peer_failure(error)


@pytest.mark.parametrize("error", [OWN, "CUDA error: out of memory", "killed by signal 9", ""])
def test_a_ranks_own_errors_do_not(error: str) -> None:
    assert not is_peer_failure(error)


def test_the_crashed_rank_is_blamed_when_its_peer_reports_first() -> None:
    window = BlameWindow(grace_s=2.0)
    first = window.offer(report("t.0", GLOO_PEER, at=10.0), now=10.0)
    assert first.act is None and first.recheck_at == 12.0
    own = report("t.1", OWN, at=10.3)
    assert window.offer(own, now=10.3).act == own
    assert window.expire(now=13.0) is None  # the held peer report was dropped, not blamed later


def test_a_peer_report_alone_is_blamed_after_the_grace() -> None:
    window = BlameWindow(grace_s=2.0)
    peer = report("t.0", GLOO_PEER, at=10.0)
    window.offer(peer, now=10.0)
    window.offer(report("t.2", GLOO_PEER, at=10.5), now=10.5)  # a second peer: the first is kept
    assert window.expire(now=11.9) is None
    assert window.expire(now=12.0) == peer
    assert window.expire(now=20.0) is None  # once


def test_an_own_error_acts_at_once() -> None:
    window = BlameWindow(grace_s=2.0)
    own = report("t.1", OWN, at=5.0)
    assert window.offer(own, now=5.0).act == own


def test_a_held_report_of_an_older_round_gives_way_to_the_new_round() -> None:
    window = BlameWindow(grace_s=2.0)
    window.offer(report("t.0", GLOO_PEER, at=1.0, round_=1), now=1.0)
    newer = report("t.0", GLOO_PEER, at=1.5, round_=2)
    assert window.offer(newer, now=1.5).recheck_at == 3.5
    assert window.expire(now=3.5) == newer
