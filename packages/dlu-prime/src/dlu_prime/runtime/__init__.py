"""Runtime SDK used inside worker actors: identity, health, RPC between roles, data channels,
dynamic sharding."""

from dlu_prime.runtime.channel import ChannelClosed, DataChannel
from dlu_prime.runtime.context import WorkerContext, current_worker, heartbeat, report_error
from dlu_prime.runtime.data import channel, consumer_id, shard_queue
from dlu_prime.runtime.rpc import RoleGroup, RpcFuture, role_group, rpc
from dlu_prime.runtime.sharding import Shard, ShardQueue

__all__ = [
    "ChannelClosed",
    "DataChannel",
    "RoleGroup",
    "RpcFuture",
    "Shard",
    "ShardQueue",
    "WorkerContext",
    "channel",
    "consumer_id",
    "current_worker",
    "heartbeat",
    "report_error",
    "role_group",
    "rpc",
    "shard_queue",
]
