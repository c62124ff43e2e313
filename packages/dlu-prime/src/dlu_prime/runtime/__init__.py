"""Runtime SDK used inside worker actors: identity, health, RPC between roles, data channels,
dynamic sharding.

The names that need Ray (data channels, shard queues) load on first use: a training process (or
the zygote that preloads what training processes run) that imports only `heartbeat` or
`current_worker` should not pay `import ray` (0.5 s of CPU here). `rpc` is imported at once: a
lazy name cannot share its name with a submodule (importing the submodule would bind the
package attribute to the module).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dlu_prime.runtime.batch import BatchShare, BatchShareError, batch_share
from dlu_prime.runtime.context import WorkerContext, current_worker, heartbeat, report_error
from dlu_prime.runtime.rpc import RoleGroup, RpcFuture, role_group, rpc

if TYPE_CHECKING:
    from dlu_prime.runtime.data import channel, consumer_id, shard_queue
    from dlu_prime.runtime.data_channel import ChannelClosed, DataChannel
    from dlu_prime.runtime.sharding import Shard, ShardQueue

_LAZY = {
    "ChannelClosed": "data_channel",
    "DataChannel": "data_channel",
    "channel": "data",
    "consumer_id": "data",
    "shard_queue": "data",
    "Shard": "sharding",
    "ShardQueue": "sharding",
}

__all__ = [
    "BatchShare",
    "BatchShareError",
    "ChannelClosed",
    "DataChannel",
    "RoleGroup",
    "RpcFuture",
    "Shard",
    "ShardQueue",
    "WorkerContext",
    "batch_share",
    "channel",
    "consumer_id",
    "current_worker",
    "heartbeat",
    "report_error",
    "role_group",
    "rpc",
    "shard_queue",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
