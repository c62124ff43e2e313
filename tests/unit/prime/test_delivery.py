"""Exactly-once bookkeeping of data channels and shard queues, as pure state machines.

No Ray: `ChannelBook` and `ShardBook` are what the channel and queue actors hold. Besides the
rules one by one, a stage of the example pipeline (consume, number the output, commit the state
with the ack) is replayed with a crash after every possible step: each record comes out once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dlu_prime.runtime.delivery import CLOSED, OK, ChannelBook, check_seq, session_id
from dlu_prime.runtime.sharding import Shard, ShardBook, _Plan  # pyright: ignore[reportPrivateUsage]

pytestmark = pytest.mark.timeout(30)


def put(book: ChannelBook, item: Any, producer: str | None = None, seq: int | None = None) -> bool:
    """What the actor does for one item once there is room: True when it was new."""
    if book.duplicate(producer, seq):
        book.drop()
        return False
    assert book.has_room() or book.closed
    book.append(item, producer, seq)
    return True


def get(book: ChannelBook, consumer: str, session: str, state: Any = None, commit: bool = False) -> Any:
    """What the actor's get does when an item is ready: begin (ack + state), then take."""
    if not book.enter(consumer, session):
        book.settle(consumer, session, state, commit=commit)
    assert book.ready(consumer)
    status, item = book.take(consumer)
    return item if status == OK else CLOSED


# producers -----------------------------------------------------------------------------------
def test_numbered_puts_are_idempotent_and_tell_where_to_resume() -> None:
    book = ChannelBook(capacity=10)
    assert book.next_seq("p") == 0
    assert [put(book, i, "p", i) for i in range(3)] == [True, True, True]
    assert book.next_seq("p") == 3
    assert not put(book, "again", "p", 1), "a re-sent seq is dropped"
    assert put(book, "other producer", "q", 0), "each producer numbers its own items"
    assert put(book, "unnumbered"), "a put without producer is never a duplicate"
    assert put(book, "gap", "p", 7) and book.next_seq("p") == 8, "seqs may skip; they must increase"
    assert list(book.queue) == [0, 1, 2, "other producer", "unnumbered", "gap"]
    assert (book.counts["put"], book.counts["duplicates"]) == (6, 1)


def test_a_replay_into_a_closed_channel_is_dropped_not_refused() -> None:
    book = ChannelBook(capacity=2)
    put(book, 0, "p", 0)
    put(book, 1, "p", 1)
    book.closed = True
    # The actor checks `duplicate` before `closed` and `has_room`: a replay neither blocks on a
    # full channel nor raises ChannelClosed.
    assert book.duplicate("p", 1) and book.duplicate("p", 0)
    assert not book.duplicate("p", 2), "a new item into a closed channel is still an error"


@pytest.mark.parametrize(
    ("producer", "seq", "field"),
    [("p", None, "producer and seq"), (None, 0, "producer and seq"), ("", 0, "producer"), ("p", -1, "seq")],
)
def test_bad_numbering_is_refused_with_the_field(producer: Any, seq: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        check_seq(producer, seq)
    check_seq(None, None)
    check_seq("p", 0)


# consumers -----------------------------------------------------------------------------------
def test_ack_on_next_get_with_state() -> None:
    book = ChannelBook(capacity=10)
    for i in range(4):
        put(book, i)
    assert book.restore("c", "s1") is None
    assert get(book, "c", "s1", state={"n": 0}, commit=True) == 0
    assert get(book, "c", "s1", state={"n": 1}, commit=True) == 1
    assert book.stats()["leased"] == 1 and book.counts["acked"] == 1
    assert book.settle("c", "s1", {"n": 2}, commit=True) == 1
    assert book.readers["c"].state == {"n": 2}
    assert book.settle("c", "s1") == 0, "nothing leased"
    assert book.readers["c"].state == {"n": 2}, "an ack without state keeps the committed one"


def test_a_restarted_consumer_gets_its_leases_back_and_only_it() -> None:
    book = ChannelBook(capacity=10)
    for i in range(5):
        put(book, i)
    get(book, "a", "a1", {"n": 0}, commit=True)
    assert get(book, "a", "a1", {"n": 1}, commit=True) == 1  # item 0 acked with n=1; 1 leased
    assert get(book, "b", "b1") == 2
    # a's process dies; its new incarnation restores, then reads.
    assert book.restore("a", "a2") == {"n": 1}
    assert book.stats()["pending"] == 1 and book.counts["redelivered"] == 1
    assert get(book, "b", "b1") == 3, "b never gets a's item"
    assert get(book, "a", "a2", {"n": 1}, commit=True) == 1, "a gets item 1 again, first"
    assert get(book, "a", "a2", {"n": 2}, commit=True) == 4


def test_a_call_from_a_new_session_acks_nothing_and_a_stale_one_changes_nothing() -> None:
    book = ChannelBook(capacity=10)
    put(book, "x")
    get(book, "c", "old", {"n": 0}, commit=True)
    # The new incarnation's first get does not acknowledge what the dead one held, and its
    # state (it did not restore) is not taken as committed.
    assert get(book, "c", "new", {"bogus": True}, commit=True) == "x"
    assert book.readers["c"].state == {"n": 0}
    assert book.counts["acked"] == 0
    assert not book.current("c", "old"), "a get the dead session left waiting ends STALE"
    assert book.settle("c", "old", {"late": 1}, commit=True) == 0
    assert book.readers["c"].state == {"n": 0}


def test_closed_ends_a_consumer_only_after_its_pending_items() -> None:
    book = ChannelBook(capacity=10)
    put(book, 0)
    get(book, "c", "s1")
    book.closed = True
    book.enter("c", "s2")
    assert get(book, "c", "s2") == 0, "pending before the end of the stream"
    assert get(book, "c", "s2") == CLOSED
    assert get(book, "other", "o1") == CLOSED
    assert book.counts["acked"] == 1


def test_session_id_is_per_process() -> None:
    assert session_id() == session_id()


# a stage under crashes -----------------------------------------------------------------------
class Crash(Exception):
    pass


def run_stage(
    inp: ChannelBook, out: ChannelBook, session: str, crash_at: int | None, me: str = "stage"
) -> None:
    """The example's tokenizer: restore; per item, put numbered output; ack with the state.
    `crash_at`: die (raise) just before that step; every call to the channels is a step."""
    steps = 0

    def step() -> None:
        nonlocal steps
        if crash_at is not None and steps == crash_at:
            raise Crash
        steps += 1

    step()
    state = inp.restore(me, session) or {"sent": 0}
    while True:
        step()
        item = get(inp, me, session, dict(state), commit=True)
        if item == CLOSED:
            return
        step()
        put(out, item * 10, me, state["sent"])
        state["sent"] += 1


@pytest.mark.parametrize("crash_at", range(18))  # restore, 8 x (get, put), the closing get
def test_a_stage_killed_at_any_step_moves_every_item_exactly_once(crash_at: int) -> None:
    inp, out = ChannelBook(capacity=100), ChannelBook(capacity=100)
    for i in range(8):
        put(inp, i, "source", i)
    inp.closed = True
    sessions = iter(f"s{n}" for n in range(10))
    with pytest.raises(Crash):
        run_stage(inp, out, next(sessions), crash_at)
    # The source restarts too and replays everything: dropped.
    assert not any(put(inp, i, "source", i) for i in range(8))
    run_stage(inp, out, next(sessions), None)
    assert sorted(out.queue) == [i * 10 for i in range(8)]


def test_two_consumers_and_repeated_crashes_keep_exactly_once() -> None:
    inp, out = ChannelBook(capacity=100), ChannelBook(capacity=100)
    for i in range(30):
        put(inp, i, "source", i)
    inp.closed = True
    n = 0

    def session() -> str:
        nonlocal n
        n += 1
        return f"s{n}"

    for crash_at in (3, 5, 2, 8):
        for me in ("t0", "t1"):
            with pytest.raises(Crash):
                run_stage(inp, out, session(), crash_at, me)
    run_stage(inp, out, session(), None, "t0")
    run_stage(inp, out, session(), None, "t1")
    assert sorted(out.queue) == [i * 10 for i in range(30)]
    assert out.counts["duplicates"] > 0, "the crashes did cause re-sends"


# shard queues ----------------------------------------------------------------------------------
def make_queue(size: int = 10, shard: int = 2) -> ShardBook:
    return ShardBook(_Plan(size, shard, num_epochs=1, shuffle=False, seed=0))


def test_a_restarted_worker_takes_its_own_shards_back_first() -> None:
    queue = make_queue()
    assert queue.next_shard("w", "w1") == Shard(0, 0, 2)
    assert queue.next_shard("w", "w1") == Shard(1, 2, 4)
    assert queue.next_shard("v", "v1") == Shard(2, 4, 6)
    # w's process dies holding 0 and 1; its first call as a new session gives them back.
    assert queue.restore("w", "w2") is None
    assert queue.doing() == {2: "v"}
    assert queue.next_shard("w", "w2") == Shard(0, 0, 2)
    assert queue.next_shard("v", "v1") == Shard(1, 2, 4), "the rest are anyone's, at the front"


def test_shard_completion_keeps_state_and_refuses_stale_sessions() -> None:
    queue = make_queue(size=4)
    first = queue.next_shard("w", "w1")
    assert first is not None
    assert queue.complete("w", first.id, "w1", state={"sum": 1}, commit=True)
    second = queue.next_shard("w", "w1")
    assert second is not None
    assert queue.restore("w", "w2") == {"sum": 1}, "the state kept with the last completion"
    assert not queue.complete("w", second.id, "w1", state={"sum": 99}, commit=True), "the dead session"
    again = queue.next_shard("w", "w2")
    assert again == second
    assert queue.complete("w", second.id, "w2", state={"sum": 2}, commit=True)
    assert not queue.complete("w", second.id, "w2"), "done already"
    assert queue.finished() and queue.restore("w", "w2") == {"sum": 2}


def test_stateful_shard_worker_counts_every_record_once_across_crashes() -> None:
    queue = make_queue(size=50, shard=3)
    crashes = iter([2, 1, 4, 3])

    def worker(session: str, crash_after: int | None, done: Callable[[], bool]) -> None:
        # Deep copies stand for the pickling a real call does.
        state: dict[str, list[int]] = copy.deepcopy(queue.restore("w", session)) or {"records": []}
        completed = 0
        while (shard := queue.next_shard("w", session)) is not None:
            state["records"].extend(range(shard.start, shard.end))
            if crash_after is not None and completed == crash_after:
                raise Crash  # processed, not completed
            assert queue.complete("w", shard.id, session, state=copy.deepcopy(state), commit=True)
            completed += 1
        assert done()

    for n, crash_after in enumerate(crashes):
        with pytest.raises(Crash):
            worker(f"s{n}", crash_after, queue.finished)
    worker("last", None, queue.finished)
    records = queue.restore("w", "last")["records"]
    assert sorted(records) == list(range(50))
