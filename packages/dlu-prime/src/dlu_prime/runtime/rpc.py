"""`@rpc` methods and role groups: how one role calls another (trainer-driven pattern)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dlu_prime.naming import NAMESPACE, actor_name
from dlu_prime.runtime.context import current_worker

F = TypeVar("F", bound=Callable[..., Any])
RPC_MARK = "__dlu_rpc__"


def rpc(method: F) -> F:
    """Export a method of a role class so that other roles can call it."""
    setattr(method, RPC_MARK, True)
    return method


def rpc_methods(instance: object) -> list[str]:
    return sorted(
        name for name in dir(type(instance)) if getattr(getattr(type(instance), name, None), RPC_MARK, False)
    )


def find_rpc_method(instance: object, name: str) -> Callable[..., Any]:
    """The bound `@rpc` method `name`.

    Raises:
        AttributeError: no such method, or it is not marked `@rpc`.
    """
    method = getattr(instance, name, None)
    if method is None or not getattr(method, RPC_MARK, False):
        exported = ", ".join(rpc_methods(instance)) or "none"
        raise AttributeError(f"{type(instance).__name__} has no @rpc method {name!r} (exported: {exported})")
    return method


class RpcFuture:
    """The pending results of one call on several ranks."""

    def __init__(self, refs: list[Any]) -> None:
        self._refs = refs

    @property
    def refs(self) -> list[Any]:
        return list(self._refs)

    def result(self, timeout: float | None = None) -> list[Any]:
        import ray

        return list(ray.get(self._refs, timeout=timeout))

    def done(self) -> bool:
        import ray

        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
        return len(ready) == len(self._refs)


class RoleGroup:
    """Handles to every actor of a role, found by name (so restarted actors are found again)."""

    def __init__(self, job: str, role: str, size: int) -> None:
        if size < 1:
            raise ValueError(f"role {role!r} has no actors")
        self.job = job
        self.role = role
        self.size = size

    def _handle(self, rank: int) -> Any:
        import ray

        return ray.get_actor(actor_name(self.job, self.role, rank), namespace=NAMESPACE)

    def _submit(self, rank: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._handle(rank).call_rpc.remote(method, args, kwargs)

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> RpcFuture:
        """Call `method` on every rank with the same arguments."""
        return RpcFuture([self._submit(r, method, args, kwargs) for r in range(self.size)])

    def call(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Call on every rank and wait; results in rank order."""
        return self.call_async(method, *args, **kwargs).result(timeout)

    def rank0(self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """Call on rank 0 only and wait."""
        return RpcFuture([self._submit(0, method, args, kwargs)]).result(timeout)[0]

    def scatter_async(self, method: str, *args: Sequence[Any], **kwargs: Sequence[Any]) -> RpcFuture:
        """Rank i gets the i-th element of every positional and keyword argument.

        Raises:
            ValueError: an argument's length is not the group size.
        """
        for label, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]:
            if len(value) != self.size:
                raise ValueError(
                    f"scatter to role {self.role!r}: {label} has {len(value)} items, expected {self.size}"
                )
        return RpcFuture(
            [
                self._submit(
                    rank, method, tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()}
                )
                for rank in range(self.size)
            ]
        )

    def scatter(
        self, method: str, *args: Sequence[Any], timeout: float | None = None, **kwargs: Sequence[Any]
    ) -> list[Any]:
        return self.scatter_async(method, *args, **kwargs).result(timeout)


def role_group(role: str) -> RoleGroup:
    """The group of `role` in the current job.

    Raises:
        KeyError: the job has no such role.
    """
    worker = current_worker()
    if role not in worker.role_sizes:
        raise KeyError(f"job {worker.job!r} has no role {role!r}; roles: {', '.join(worker.role_sizes)}")
    return RoleGroup(worker.job, role, worker.role_sizes[role])
