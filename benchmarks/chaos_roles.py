"""Role entrypoints of the chaos campaign's jobs, run inside DLU actors (the job's working
directory is this folder, so they import as `chaos_roles:<name>`).

`sidecar` is the simple role beside the trainer. `pipe_source` and `pipe_sink` make the
pipeline job: one producer puts `records` numbered records on a channel, the consumers write
every id they receive to `<out_dir>/<actor>.ids`, so records are counted where they arrive.
The producer keeps a cursor file: a restarted producer goes on where it was, not from 0.
"""

from __future__ import annotations

import time
from pathlib import Path

from dlu_prime.runtime import current_worker, heartbeat

CHANNEL = "records"
CAPACITY = 16
WAIT_S = 1.0  # how long one put/get waits before the role beats again (liveness while waiting)


def sidecar() -> None:
    """A simple role that does nothing but live: any recovery of it is spurious."""
    step = 0
    while True:
        time.sleep(0.5)
        step += 1
        heartbeat(step)


def _config() -> tuple[int, float, Path]:
    config = current_worker().config
    return int(config["records"]), float(config.get("interval_s", 0.0)), Path(str(config["out_dir"]))


def pipe_source() -> None:
    from dlu_prime.runtime import channel
    from dlu_prime.runtime.data_channel import ChannelTimeoutError

    records, interval_s, out_dir = _config()
    cursor = out_dir / "source.cursor"
    start = int(cursor.read_text()) if cursor.exists() else 0
    out = channel(CHANNEL, CAPACITY)
    for record in range(start, records):
        while True:
            try:
                out.put({"id": record}, timeout=WAIT_S)
                break
            except ChannelTimeoutError:  # back-pressure: the consumers are behind (or restarting)
                heartbeat()
        tmp = cursor.with_suffix(".tmp")
        tmp.write_text(str(record + 1))
        tmp.replace(cursor)
        heartbeat(record + 1)
        if interval_s > 0:
            time.sleep(interval_s)
    out.close()


def pipe_sink() -> None:
    from dlu_prime.runtime import ChannelClosed, channel, consumer_id
    from dlu_prime.runtime.data_channel import ChannelTimeoutError

    _, _, out_dir = _config()
    me = consumer_id()
    source = channel(CHANNEL, CAPACITY)
    with open(out_dir / f"{me}.ids", "a", encoding="utf-8") as log:
        while True:
            try:
                item = source.get(me, timeout=WAIT_S)
            except ChannelTimeoutError:
                heartbeat()
                continue
            except ChannelClosed:
                return
            log.write(f"{int(item['id'])}\n")
            log.flush()
            heartbeat()


def received(out_dir: Path) -> tuple[int, ...]:
    """Every id the consumers logged, as often as each arrived (read by the campaign)."""
    ids: list[int] = []
    for path in sorted(out_dir.glob("*.ids")):
        ids.extend(int(line) for line in path.read_text().split())
    return tuple(ids)
