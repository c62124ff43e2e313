"""Scheduler: pure placement and GPU rules here; the Ray layer turns them into Ray calls."""

from dlu_prime.scheduler.gpu import (
    NOSET_ENV_VAR,
    DeviceEnv,
    SetBy,
    device_env,
    needs_rank_based_selection,
    ray_noset_visible_devices,
    visible_devices_policy,
)
from dlu_prime.scheduler.placement import (
    ISOLATION_AMOUNT,
    MIN_BUNDLE_CPU,
    ActorPlan,
    BundlePlan,
    GroupPlan,
    PlacementPlan,
    actor_options,
    bundle_resources,
    master_options,
    plan_placement,
)

__all__ = [
    "ISOLATION_AMOUNT",
    "MIN_BUNDLE_CPU",
    "NOSET_ENV_VAR",
    "ActorPlan",
    "BundlePlan",
    "DeviceEnv",
    "GroupPlan",
    "PlacementPlan",
    "SetBy",
    "actor_options",
    "bundle_resources",
    "device_env",
    "master_options",
    "needs_rank_based_selection",
    "plan_placement",
    "ray_noset_visible_devices",
    "visible_devices_policy",
]
