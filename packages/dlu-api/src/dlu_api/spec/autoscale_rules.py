"""The `autoscale:` switch against the roles it sizes (a cross-field rule of `rules.py`). Pure."""

from __future__ import annotations

from collections.abc import Iterator

from dlu_api.errors import Problem
from dlu_api.spec.models import JobSpec, RoleKind


def autoscale_is_sound(spec: JobSpec) -> Iterator[Problem]:
    """Each backlog role is a resizable simple role with a max_total, not collocated; an
    auto-scaled job has something to size (a role's nodes or actors, or its actors' memory)."""
    settings = spec.autoscale
    roles = {r.name: r for r in spec.roles}
    for name, channel in sorted(settings.backlog_roles.items()):
        where = f"autoscale.backlog_roles.{name}"
        role = roles.get(name)
        if role is None:
            yield Problem(where, f"the job has no role {name!r}.", f"name one of {', '.join(sorted(roles))}.")
            continue
        if role.kind is not RoleKind.SIMPLE:
            yield Problem(
                where,
                f"role {name!r} is {role.kind.value}: only a simple role (N actors) is sized to a backlog.",
                "remove it from backlog_roles (an elastic role is sized by its measured throughput).",
            )
            continue
        if not channel.strip():
            yield Problem(where, "names no channel.", "give the data channel or shard queue the role drains.")
        if not role.resizable:
            yield Problem(where, f"role {name!r} is not resizable.", f"set roles[{name}].resizable: true.")
        if role.max_total is None:
            yield Problem(
                where,
                f"role {name!r} has no max_total, so its backlog could size it without bound.",
                f"set roles[{name}].max_total to the most actors it may have.",
            )
        if spec.collocation_of(name) is not None:
            yield Problem(
                where,
                f"role {name!r} is collocated: collocated roles keep the size of their spec.",
                "take it out of collocations, or out of backlog_roles.",
            )
    limited = any(role.resources.memory > 0 for role in spec.roles)  # its actors' memory is sized
    if settings.on and not settings.backlog_roles and not limited and not any(_scalable_elastic(spec)):
        yield Problem(
            "autoscale.mode",
            f"is {settings.mode.value} but the job has nothing to size.",
            "give an elastic role nnodes MIN:MAX and resizable: true, or name backlog_roles, or give a "
            "role resources.memory (an actor near it is relaunched with more), or set mode: off.",
        )


def _scalable_elastic(spec: JobSpec) -> Iterator[bool]:
    for role in spec.roles:
        elastic = role.elastic
        if role.kind is RoleKind.ELASTIC and elastic is not None and role.resizable:
            yield elastic.min_nodes < elastic.max_nodes
