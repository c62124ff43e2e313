"""Which GPUs an actor sees and uses: the GPU table of the architecture seed, as pure functions.

Three inputs decide it: `resources.gpu` (GPUs per actor), `per_group` (actors per bundle, so
LOCAL_RANK) and `rank_based_gpu_selection`. The rule, generalising the seed's rows:

- no GPU (CPU job or gpu == 0): torch device "cpu", nothing set ("none");
- rank-based selection with whole GPUs whose bundle does not span the node
  (per_group * gpu < device_per_node, seed case A): CUDA_VISIBLE_DEVICES is set by hand
  ("manual") to the sorted union of the GPU ids Ray gave this role's actors in the bundle,
  and rank r uses cuda:{LOCAL_RANK}; two such groups on one 8-GPU node see 0-3 and 4-7;
- rank-based selection with fractional GPUs, or with a bundle spanning the whole node:
  CUDA_VISIBLE_DEVICES is left unset ("not_set"): every GPU of the node is visible and
  rank r uses cuda:{LOCAL_RANK};
- everything else: Ray's allocation ("ray"), the actor sees only its own GPUs and uses
  cuda:0 .. cuda:{ceil(gpu)-1}.

Rank-based selection only takes effect where the seed says it is valid (per_group > 1 and
0 < gpu <= 1); `dlu_api.spec.rules` rejects it elsewhere, and here it falls back to Ray's.
For "manual" and "not_set" Ray must not set CUDA_VISIBLE_DEVICES itself: the Ray layer puts
RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 in the actor's runtime env at creation, which is
why `ray_noset_visible_devices` needs only the role.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from dlu_api.spec.models import DeviceType, JobSpec, RoleSpec
from dlu_prime.scheduler.placement import ActorPlan

SetBy = Literal["ray", "manual", "not_set", "none"]

NOSET_ENV_VAR = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""Put "1" in an actor's runtime env when `ray_noset_visible_devices(role)` is true."""


@dataclass(frozen=True)
class DeviceEnv:
    """What one actor's process must see: env vars and the torch devices it should use."""

    cuda_visible_devices: str | None  # None: leave it as Ray (or the node) sets it
    set_by: SetBy
    local_rank: int
    devices: tuple[str, ...]

    @property
    def ray_noset_visible_devices(self) -> bool:
        """True when Ray must not set CUDA_VISIBLE_DEVICES for this actor."""
        return self.set_by in ("manual", "not_set")

    def env(self) -> dict[str, str]:
        """Env vars to set in the actor: LOCAL_RANK and the torch devices (DLU_DEVICE, DLU_DEVICES)
        always, CUDA_VISIBLE_DEVICES when manual."""
        out = {
            "LOCAL_RANK": str(self.local_rank),
            "DLU_DEVICE": self.devices[0] if self.devices else "cpu",
            "DLU_DEVICES": ",".join(self.devices),
        }
        if self.set_by == "manual" and self.cuda_visible_devices is not None:
            out["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        return out


def _gpu(role: RoleSpec) -> float:
    return role.resources.gpu or 0.0


def needs_rank_based_selection(role: RoleSpec) -> bool:
    """True when the role's ranks pick cuda:{LOCAL_RANK} (the flag, where it is valid)."""
    return role.rank_based_gpu_selection and role.per_group > 1 and 0 < _gpu(role) <= 1


def ray_noset_visible_devices(role: RoleSpec) -> bool:
    """True when the actors must be created with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1."""
    return needs_rank_based_selection(role)


def visible_devices_policy(role: RoleSpec, device_type: str, device_per_node: int) -> SetBy:
    """Who sets CUDA_VISIBLE_DEVICES for the role's actors; known before any actor exists.

    "manual" means the Ray layer must collect `ray.get_gpu_ids()` of the bundle's actors and
    pass them to `device_env`.
    """
    gpu = _gpu(role)
    if DeviceType(device_type) is DeviceType.CPU or gpu <= 0:
        return "none"
    if not needs_rank_based_selection(role):
        return "ray"
    whole = float(gpu).is_integer()
    if whole and role.per_group * gpu < device_per_node:
        return "manual"
    return "not_set"


def _sorted_ids(ids: set[str]) -> list[str]:
    """Numeric ids in numeric order ("2" before "10"); UUID-style ids as text."""
    if all(i.isdigit() for i in ids):
        return sorted(ids, key=int)
    return sorted(ids)


def device_env(
    role: RoleSpec,
    local_rank: int,
    device_type: str,
    device_per_node: int,
    group_gpu_ids: Sequence[Sequence[str]] | None,
) -> DeviceEnv:
    """The device view of the actor of `role` with `local_rank` in its bundle.

    `group_gpu_ids` are the Ray-assigned GPU ids (`ray.get_gpu_ids()`, as strings) of each
    actor of this role in the same bundle, in local-rank order; only the "manual" policy
    needs them.

    Raises:
        ValueError: local_rank outside the bundle, or "manual" without enough GPU ids.
    """
    if not 0 <= local_rank < role.per_group:
        raise ValueError(f"local_rank {local_rank} is outside 0..{role.per_group - 1} of role {role.name!r}")
    policy = visible_devices_policy(role, device_type, device_per_node)
    if policy == "none":
        return DeviceEnv(None, "none", local_rank, ("cpu",))
    if policy == "ray":
        count = max(1, math.ceil(_gpu(role)))
        return DeviceEnv(None, "ray", local_rank, tuple(f"cuda:{i}" for i in range(count)))
    device = (f"cuda:{local_rank}",)
    if policy == "not_set":
        return DeviceEnv(None, "not_set", local_rank, device)
    if group_gpu_ids is None:
        raise ValueError(
            f"role {role.name!r} sets CUDA_VISIBLE_DEVICES to its bundle's GPUs: "
            "pass the Ray GPU ids of the bundle's actors (group_gpu_ids)"
        )
    ids = _sorted_ids({str(i) for actor_ids in group_gpu_ids for i in actor_ids})
    if local_rank >= len(ids):
        raise ValueError(
            f"role {role.name!r}: local_rank {local_rank} has no GPU among the bundle's ids {ids}"
        )
    return DeviceEnv(",".join(ids), "manual", local_rank, device)


def bundle_device_env(
    spec: JobSpec, plan: ActorPlan, plans: Iterable[ActorPlan], gpu_ids: Mapping[str, Sequence[str]]
) -> dict[str, str]:
    """The device env of actor `plan` (not a SubMaster) among its bundle mates (`plans`: every
    actor's plan; `gpu_ids`: the GPUs Ray gave each actor seen so far)."""
    role = spec.role(plan.role)
    mates = [
        a for a in plans if a.role == plan.role and a.group == plan.group and a.node_rank == plan.node_rank
    ]
    group_ids = [list(gpu_ids.get(a.name, [])) for a in sorted(mates, key=lambda a: a.local_rank)]
    env = device_env(
        role,
        plan.local_rank,
        spec.device_type.value,
        spec.device_per_node,
        group_ids if all(a.name in gpu_ids for a in mates) else None,
    )
    return env.env()
