"""Role entrypoints of the chaos campaign's jobs, run inside DLU actors (the job's working
directory is this folder, so they import as `chaos_roles:<name>`).

`sidecar` is the simple role beside the trainer. `pipe_source` and `pipe_sink` make the
pipeline job, written to the channels' exactly-once pattern: the producer numbers its puts
(`seq`) and resumes at `next_seq`; each consumer keeps the ids it received in the state it
commits with every acknowledgement (`get(..., state=)`, `restore`), and writes them to
`<out_dir>/<actor>.ids` once the channel is drained. Records are counted there, where they
arrived: a record delivered twice, or never, shows in those files.
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
    from dlu_prime.runtime import channel, consumer_id
    from dlu_prime.runtime.data_channel import ChannelTimeoutError

    records, interval_s, _ = _config()
    out, me = channel(CHANNEL, CAPACITY), consumer_id()
    for record in range(out.next_seq(me), records):  # a restarted producer resumes where it was
        while True:
            try:
                out.put({"id": record}, timeout=WAIT_S, producer=me, seq=record)
                break
            except ChannelTimeoutError:  # back-pressure: the consumers are behind (or restarting)
                heartbeat()
        heartbeat(record + 1)
        if interval_s > 0:
            time.sleep(interval_s)
    out.close()


def pipe_sink() -> None:
    from dlu_prime.runtime import ChannelClosed, channel, consumer_id
    from dlu_prime.runtime.data_channel import ChannelTimeoutError

    _, _, out_dir = _config()
    source, me = channel(CHANNEL, CAPACITY), consumer_id()
    state: dict[str, list[int]] = source.restore(me) or {"seen": []}
    while True:
        try:
            item = source.get(me, timeout=WAIT_S, state=state)  # commits what was seen before it
        except ChannelTimeoutError:
            heartbeat()
            continue
        except ChannelClosed:
            break
        state["seen"].append(int(item["id"]))
        heartbeat()
    log = out_dir / f"{me}.ids"
    tmp = log.with_suffix(".tmp")
    tmp.write_text("".join(f"{record}\n" for record in state["seen"]))
    tmp.replace(log)


def received(out_dir: Path) -> tuple[int, ...]:
    """Every id the consumers logged, as often as each arrived (read by the campaign)."""
    ids: list[int] = []
    for path in sorted(out_dir.glob("*.ids")):
        ids.extend(int(line) for line in path.read_text().split())
    return tuple(ids)
