"""Removing what a job left on Ray, found by its name prefix, whatever state the job is in."""

from __future__ import annotations

import logging
from typing import Any

from dlu_prime import ray_private
from dlu_prime.naming import NAMESPACE, job_prefix, master_name

logger = logging.getLogger(__name__)


def job_actor_names(job: str) -> list[str]:
    """Named actors of the job that are alive (or restarting) in the dlu namespace."""
    import ray

    prefix = job_prefix(job)
    found: list[dict[str, str]] = ray.util.list_named_actors(all_namespaces=True)  # pyright: ignore[reportAssignmentType]
    return sorted(a["name"] for a in found if a["namespace"] == NAMESPACE and a["name"].startswith(prefix))


def job_placement_groups(job: str) -> list[tuple[str, str]]:
    """(placement group id hex, name) of the job's placement groups that are not removed."""
    from ray.util import placement_group_table

    prefix = job_prefix(job)
    table: dict[str, dict[str, Any]] = placement_group_table()  # pyright: ignore[reportAssignmentType]
    return sorted(
        (pg_id, str(info.get("name", "")))
        for pg_id, info in table.items()
        if str(info.get("name", "")).startswith(prefix) and info.get("state") != "REMOVED"
    )


def _placement_group(pg_id: str, name: str) -> Any | None:
    """The live placement group `pg_id`: by its name (Ray's public lookup, in this driver's
    namespace), else, for a group named in another namespace, by its id (guarded Ray internals)."""
    from ray.util import get_placement_group

    try:
        found = get_placement_group(name) if name else None
    except ValueError:  # no such name in this driver's namespace
        found = None
    if found is not None and found.id.hex() == pg_id:
        return found
    return ray_private.placement_group(pg_id)


def remove_group(pg_name: str) -> bool:
    """Remove one placement group by its name (a resize's surplus actor's); False: none found."""
    from ray.util import get_placement_group, remove_placement_group

    try:
        remove_placement_group(get_placement_group(pg_name))
    except ValueError:
        return False
    logger.info("removed placement group %s", pg_name)
    return True


def remove_job_resources(job: str, *, include_master: bool) -> int:
    """Kill the job's actors and remove its placement groups; returns how many were removed."""
    import ray
    from ray.util import remove_placement_group

    removed = 0
    master = master_name(job)
    for name in job_actor_names(job):
        if name == master and not include_master:
            continue
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            removed += 1
        except ValueError:
            pass  # already gone
    for pg_id, name in job_placement_groups(job):
        try:
            group = _placement_group(pg_id, name)
            if group is None:
                logger.warning("placement group %s of job %s is left to Ray: no way to reach it", name, job)
                continue
            remove_placement_group(group)
            removed += 1
        except Exception:
            logger.warning("could not remove placement group %s of job %s", name, job, exc_info=True)
    if removed:
        logger.info("removed %d actor(s) and placement group(s) of job %s", removed, job)
    return removed
