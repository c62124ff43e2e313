"""Worker self-loop pipeline: source -> tokenizer -> sampler -> trainer through data channels.

Each role pulls from one channel, processes, and pushes to the next until its input closes.
Channels are bounded, so a fast producer waits for slow consumers (back-pressure). The trainer
checks that every record arrived exactly once, whatever was restarted on the way.

The exactly-once pattern every stage follows (see docs/failover.md, "Data"):
- `state = inp.restore(me)` first: what this stage had committed before a restart (or None);
- every put is numbered, `out.put(x, producer=me, seq=...)`, with the number kept in the state,
  so a re-sent item is dropped by the channel;
- every get commits the state as it is after the previous item, `inp.get(me, state=state)`, so
  the acknowledged items and the state move together.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from dlu_prime.runtime import ChannelClosed, channel, consumer_id, current_worker, heartbeat


def _config() -> dict[str, Any]:
    return current_worker().config


def _capacity() -> int:
    """Items each channel holds before its producers wait (the same for every role)."""
    return int(_config().get("capacity", 16))


def source() -> None:
    records = int(_config().get("records", 64))
    raw, me = channel("raw", _capacity()), consumer_id()
    for i in range(raw.next_seq(me), records):  # a restarted source resumes where it was
        raw.put(
            {"id": i, "text": f"record {i}: the quick brown fox jumps over the lazy dog"}, producer=me, seq=i
        )
    raw.close()


def tokenizer() -> None:
    delay = float(_config().get("tokenize_delay_s", 0.0))  # slows the stage down (tests, demos)
    raw, tokens, me = channel("raw", _capacity()), channel("tokens", _capacity()), consumer_id()
    state: dict[str, int] = raw.restore(me) or {"sent": 0}
    for record in raw.iterate(me, state=state):
        words = record["text"].split()
        ids = [int(hashlib.sha1(w.encode()).hexdigest()[:6], 16) % 1000 for w in words]
        time.sleep(delay)
        tokens.put({"id": record["id"], "tokens": ids}, producer=me, seq=state["sent"])
        state["sent"] += 1
        heartbeat(state["sent"])


def sampler() -> None:
    config = _config()
    records, batch_size = int(config.get("records", 64)), int(config.get("batch_size", 8))
    tokens, batches, me = channel("tokens", _capacity()), channel("batches", _capacity()), consumer_id()
    state: dict[str, Any] = tokens.restore(me) or {"taken": 0, "batch": [], "sent": 0}
    while state["taken"] < records:  # tokenizers do not close "tokens": the sampler counts instead
        state["batch"].append(tokens.get(me, state=state))
        state["taken"] += 1
        if len(state["batch"]) == batch_size:
            batches.put(state["batch"], producer=me, seq=state["sent"])
            state["batch"], state["sent"] = [], state["sent"] + 1
    tokens.ack(me, state=state)
    if state["batch"]:
        batches.put(state["batch"], producer=me, seq=state["sent"])
    batches.close()


def trainer() -> None:
    config = _config()
    records = int(config.get("records", 64))
    batches, me = channel("batches", _capacity()), consumer_id()
    # A real trainer would commit its step and checkpoint path; this one keeps the ids it saw.
    state: dict[str, Any] = batches.restore(me) or {"seen": [], "loss": 10.0, "step": 0}
    try:
        while True:
            batch = batches.get(me, state=state)
            state["seen"].extend(int(item["id"]) for item in batch)
            state["loss"] *= 0.9
            state["step"] += 1
            heartbeat(state["step"], state["loss"])
            print(f"trainer: batch {state['step']}, {len(state['seen'])}/{records} records", flush=True)
    except ChannelClosed:
        pass
    seen: list[int] = state["seen"]
    if config.get("report"):  # where a test reads what the trainer saw
        with open(config["report"], "w") as out:
            json.dump(seen, out)
    if sorted(seen) != list(range(records)):
        missing = sorted(set(range(records)) - set(seen))
        twice = len(seen) - len(set(seen))
        raise RuntimeError(
            f"trainer saw {len(seen)} records for {records}: {twice} duplicated, missing {missing[:10]}"
        )
    print(
        f"trainer: {state['step']} batches, {len(seen)} records, final loss {state['loss']:.3f}", flush=True
    )
