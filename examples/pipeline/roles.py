"""Worker self-loop pipeline: source -> tokenizer -> sampler -> trainer through data channels.

Each role pulls from one channel, processes, and pushes to the next until its input closes.
Channels are bounded, so a fast producer waits for slow consumers (back-pressure). The trainer
checks that every record arrived exactly once.
"""

from __future__ import annotations

import hashlib

from dlu_prime.runtime import ChannelClosed, channel, consumer_id, current_worker, heartbeat

CAPACITY = 16


def _config() -> tuple[int, int]:
    config = current_worker().config
    return int(config.get("records", 64)), int(config.get("batch_size", 8))


def source() -> None:
    records, _ = _config()
    raw = channel("raw", CAPACITY)
    for i in range(records):
        raw.put({"id": i, "text": f"record {i}: the quick brown fox jumps over the lazy dog"})
    raw.close()


def tokenizer() -> None:
    raw, tokens = channel("raw", CAPACITY), channel("tokens", CAPACITY)
    for n, record in enumerate(raw.iterate(consumer_id())):
        words = record["text"].split()
        ids = [int(hashlib.sha1(w.encode()).hexdigest()[:6], 16) % 1000 for w in words]
        tokens.put({"id": record["id"], "tokens": ids})
        heartbeat(n)


def sampler() -> None:
    records, batch_size = _config()
    tokens, batches = channel("tokens", CAPACITY), channel("batches", CAPACITY)
    batch: list[dict[str, object]] = []
    me = consumer_id()
    for _ in range(records):  # tokenizers do not close "tokens": the sampler counts instead
        batch.append(tokens.get(me))
        if len(batch) == batch_size:
            batches.put(batch)
            batch = []
    tokens.ack(me)
    if batch:
        batches.put(batch)
    batches.close()


def trainer() -> None:
    records, _ = _config()
    batches = channel("batches", CAPACITY)
    seen: list[int] = []
    loss = 10.0
    me = consumer_id()
    step = 0
    try:
        while True:
            batch = batches.get(me)
            seen.extend(int(item["id"]) for item in batch)
            loss *= 0.9
            step += 1
            heartbeat(step)
    except ChannelClosed:
        pass
    if sorted(seen) != list(range(records)):
        missing = sorted(set(range(records)) - set(seen))
        raise RuntimeError(f"trainer saw {len(seen)} records for {records}; missing {missing[:10]}")
    print(f"trainer: {step} batches, {len(seen)} records, final loss {loss:.3f}", flush=True)
