"""Runtime SDK used inside worker actors: identity, health, RPC between roles, data channels,
dynamic sharding."""

from dlu_prime.runtime.context import WorkerContext, current_worker, heartbeat, report_error
from dlu_prime.runtime.rpc import RoleGroup, RpcFuture, role_group, rpc

__all__ = [
    "RoleGroup",
    "RpcFuture",
    "WorkerContext",
    "current_worker",
    "heartbeat",
    "report_error",
    "role_group",
    "rpc",
]
