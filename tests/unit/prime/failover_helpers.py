"""Spec and driving helpers shared by the failover unit tests (fake scheduler, no Ray)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dlu_api.vocabulary import ActorStage
from dlu_prime.master.manager import PrimeManager

if TYPE_CHECKING:
    from conftest import FakeScheduler


def elastic_role(**extra: Any) -> dict[str, Any]:
    """An elastic role (so it has a SubMaster): 2 nodes x 1 process, node check off."""
    return {
        "name": "train",
        "kind": "elastic",
        "entrypoint": "pkg.train:main",
        "elastic": {"nnodes": 2, "nproc_per_node": 1, "node_check": {"enabled": False}},
        **extra,
    }


def running(manager: PrimeManager, sched: FakeScheduler) -> None:
    """Drive the job to RUNNING with every actor running."""
    manager.prepare()
    manager.start()
    for name in sched.actors:
        sched.actors[name].stage = ActorStage.RUNNING
