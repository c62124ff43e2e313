"""The monitor loop's statistics read the job's state outside the manager's lock while Ray's
threads change it. The channels it polls for their backlog are a copy taken under that lock: a
channel registered while the poll's Ray calls run must not break the loop (CI: "dictionary
changed size during iteration" was a PrimeMaster error, and the job stopped)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from dlu_api.spec import spec_from_dict
from dlu_prime.autoscale.driver import Autoscaler
from dlu_prime.autoscale.feed import QueueView
from dlu_prime.master.ports import StatePort
from dlu_prime.master.state import ChannelRecord, JobState

SPEC = {
    "name": "pipe",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "nowhere:work"}],
}


def test_a_channel_registered_during_the_queue_poll_neither_breaks_it_nor_is_lost() -> None:
    state = JobState(spec=spec_from_dict(SPEC))
    for name in ("raw", "tokens"):
        state.channels[name] = ChannelRecord(name=name, kind="channel", actor_name=f"pipe.channel.{name}")
    lock = threading.RLock()
    port = StatePort(lambda: state, lock, lambda *_: None, lambda: None, lambda: None)
    polled: list[list[str]] = []

    def register_late() -> None:  # another thread, under the lock, as changes are applied
        with lock:
            late = ChannelRecord(name="late", kind="channel", actor_name="pipe.channel.late")
            state.channels.setdefault("late", late)

    def poll(records: Mapping[str, ChannelRecord]) -> Mapping[str, QueueView]:
        seen: list[str] = []
        for record in records.values():  # as poll_queues does, with a Ray call per channel
            seen.append(record.name)
            registrar = threading.Thread(target=register_late)
            registrar.start()
            registrar.join()
        polled.append(seen)
        return {}

    scaler = Autoscaler(port, handle=lambda _: None, clock=lambda: 0.0, poll=poll)
    scaler.after_pass({}, now=100.0)
    assert polled == [["raw", "tokens"]]
    assert "late" in state.channels
    scaler.after_pass({}, now=200.0)  # the next poll has it
    assert polled[-1] == ["raw", "tokens", "late"]
