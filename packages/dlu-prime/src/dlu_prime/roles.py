"""What each kind of role needs from the control plane. Pure: importing this loads no Ray."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable

from dlu_api.spec.models import RecoveryPolicy, RoleKind, RoleSpec
from dlu_prime.actor_paths import ELASTIC_SUB_MASTER, ELASTIC_WORKER

logger = logging.getLogger(__name__)


def sub_master_path(role: RoleSpec) -> str | None:
    """The SubMaster class of a role: the user's for custom roles, the ElasticMaster for elastic."""
    if role.kind is RoleKind.CUSTOM:
        return role.sub_master
    if role.kind is RoleKind.ELASTIC:
        return ELASTIC_SUB_MASTER
    return None


def worker_actor_path(role: RoleSpec) -> str | None:
    """The actor class of a role's workers when it is not the generic WorkerActor."""
    return ELASTIC_WORKER if role.kind is RoleKind.ELASTIC else None


def recovery_policy(role: RoleSpec) -> RecoveryPolicy:
    """What a failure of this role restarts: the role alone, or the whole job.

    Unset means the failover seed's rule: role-level failover where a SubMaster can drive it,
    a job-level restart for roles without one.
    """
    if role.recovery is not None:
        return role.recovery
    return RecoveryPolicy.IN_PLACE if sub_master_path(role) is not None else RecoveryPolicy.GLOBAL


# Starts the node's zygote (torch preloaded) without waiting for it; see dlu_prime.zygote.
ELASTIC_NODE_WARMUP = "dlu_elastic.worker.warmup:prestart"


def node_warmup_path(role: RoleSpec) -> str | None:
    """What a node that will host this role's workers can start ahead of them."""
    return ELASTIC_NODE_WARMUP if role.kind is RoleKind.ELASTIC else None


def warm_up_this_node(roles: Iterable[RoleSpec]) -> list[str]:
    """Start the warm-ups of `roles` on this machine (an embedded Ray runs here); what started.

    Only a head start: a warm-up that cannot start is logged, and the workers start it later.
    """
    started: list[str] = []
    for path in dict.fromkeys(p for p in map(node_warmup_path, roles) if p is not None):
        module, _, name = path.partition(":")
        try:
            getattr(importlib.import_module(module), name)()
            started.append(path)
        except Exception as exc:
            logger.warning("could not start %s ahead of the job: %s", path, exc)
    return started
