"""What each kind of role needs from the control plane. Pure: importing this loads no Ray."""

from __future__ import annotations

from dlu_api.spec.models import RecoveryPolicy, RoleKind, RoleSpec

ELASTIC_SUB_MASTER = "dlu_elastic.master:ElasticMaster"


def sub_master_path(role: RoleSpec) -> str | None:
    """The SubMaster class of a role: the user's for custom roles, the ElasticMaster for elastic."""
    if role.kind is RoleKind.CUSTOM:
        return role.sub_master
    if role.kind is RoleKind.ELASTIC:
        return ELASTIC_SUB_MASTER
    return None


ELASTIC_WORKER = "dlu_elastic.worker.actor:ElasticWorkerActor"


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
