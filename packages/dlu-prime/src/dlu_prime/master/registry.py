"""What a job's actors find through the PrimeMaster: endpoints SubMasters publish (a restarted
worker finds a restarted SubMaster) and the data channels and shard queues of the job. Both are
saved with the state, through the manager's one apply."""

from __future__ import annotations

from dlu_prime.master.changes import ChannelRegistered, EndpointPublished
from dlu_prime.master.ports import StatePort


class Registry:
    def __init__(self, port: StatePort) -> None:
        self._port = port

    def register_channel(self, name: str, kind: str, actor_name: str) -> None:
        if name not in self._port.state().channels:
            self._port.apply(ChannelRegistered(name, kind, actor_name))

    def publish(self, key: str, value: dict[str, str]) -> None:
        if self._port.state().endpoints.get(key) != value:
            self._port.apply(EndpointPublished(key, dict(value)))

    def lookup(self, key: str) -> dict[str, str] | None:
        with self._port.lock:
            found = self._port.state().endpoints.get(key)
            return dict(found) if found is not None else None
