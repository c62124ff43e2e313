"""Rules that span fields of a job spec. Each returns every problem it finds, none raises.

Pure functions of the spec: nothing here touches Ray, the network or the file system.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from dlu_api.errors import Problem, SpecError
from dlu_api.spec.autoscale_rules import autoscale_is_sound
from dlu_api.spec.entrypoint import EntrypointKind, parse_entrypoint
from dlu_api.spec.model_base import MAX_ACTORS
from dlu_api.spec.models import DeviceType, JobSpec, RoleKind, RoleSpec
from dlu_api.spec.torchrun import parse_torchrun
from dlu_api.spec.units import SUSPICIOUS_BYTES, format_bytes

Rule = Callable[[JobSpec], Iterator[Problem]]


def _at(role: RoleSpec, field: str) -> str:
    return f"roles[{role.name}].{field}"


def unique_role_names(spec: JobSpec) -> Iterator[Problem]:
    for name, count in Counter(r.name for r in spec.roles).items():
        if count > 1:
            yield Problem(
                f"roles[{name}]",
                f"{count} roles are named {name!r}.",
                "give every role a different name.",
            )


def actors_are_bounded(spec: JobSpec) -> Iterator[Problem]:
    """Each role's total is bounded by the model; all of them together are bounded here."""
    actors = sum(r.total for r in spec.roles)
    if actors > MAX_ACTORS:
        parts = ", ".join(f"{r.name} {r.total}" for r in spec.roles)
        yield Problem(
            "roles",
            f"the roles ask for {actors} actors in all ({parts}), more than the limit of {MAX_ACTORS}.",
            f"lower the roles' total so that they add up to {MAX_ACTORS} or fewer.",
        )


def positive_counts(spec: JobSpec) -> Iterator[Problem]:
    if spec.node_num < 1:
        yield Problem("node_num", f"must be >= 1, got {spec.node_num}.", "set node_num to 1 or more.")
    min_devices = 1 if spec.device_type is DeviceType.GPU else 0
    if spec.device_per_node < min_devices:
        yield Problem(
            "device_per_node",
            f"must be >= {min_devices} for a {spec.device_type} job, got {spec.device_per_node}.",
            "set device_per_node to the accelerators each node has.",
        )
    for role in spec.roles:
        for field, value, low in (
            ("total", role.total, 1),
            ("per_group", role.per_group, 1),
            ("max_restart", role.max_restart, 0),
            ("per_node_max_failure", role.per_node_max_failure, 1),
            ("escalate_after", role.escalate_after, 1),
        ):
            if value < low:
                yield Problem(
                    _at(role, field), f"must be >= {low}, got {value}.", f"set {field} to {low} or more."
                )
        if role.max_total is not None and role.max_total < role.total:
            yield Problem(
                _at(role, "max_total"),
                f"the largest size `dlu scale` may set ({role.max_total}) is below total={role.total}.",
                f"set max_total to {role.total} or more, or leave it unset (no bound).",
            )
        if role.total >= 1 and role.per_group >= 1 and role.total % role.per_group:
            yield Problem(
                _at(role, "total"),
                f"{role.total} actors do not fill groups of per_group={role.per_group}.",
                f"make total a multiple of per_group (e.g. {role.per_group * max(1, role.total // role.per_group)}).",
            )


def collocations_name_known_roles(spec: JobSpec) -> Iterator[Problem]:
    known = {r.name for r in spec.roles}
    seen: dict[str, int] = {}
    for index, group in enumerate(spec.collocations):
        for name in group.roles:
            if name not in known:
                yield Problem(
                    f"collocations[{index}].roles",
                    f"unknown role {name!r}.",
                    f"use one of the job's roles: {', '.join(sorted(known))}.",
                )
            elif name in seen and seen[name] != index:
                yield Problem(
                    f"collocations[{index}].roles",
                    f"role {name!r} is already in collocations[{seen[name]}].",
                    "put each role in at most one collocation.",
                )
            seen.setdefault(name, index)
        members = [r for r in spec.roles if r.name in group.roles]
        shapes = {(r.total, r.per_group) for r in members}
        if len(shapes) > 1:
            detail = ", ".join(f"{r.name}: total={r.total} per_group={r.per_group}" for r in members)
            yield Problem(
                f"collocations[{index}]",
                f"collocated roles must have the same total and per_group ({detail}).",
                "give every role of the collocation the same total and per_group.",
            )


def gpu_demand_fits(spec: JobSpec) -> Iterator[Problem]:
    if spec.device_type is DeviceType.CPU:
        for role in spec.roles:
            if (role.resources.gpu or 0) > 0:
                yield Problem(
                    _at(role, "resources.gpu"),
                    f"asks for {role.resources.gpu} GPU(s) but the job's device_type is CPU.",
                    "set device_type: GPU, or resources.gpu: 0.",
                )
        return
    capacity = spec.node_num * spec.device_per_node
    demand = sum(r.total * (r.resources.gpu or 0) for r in spec.roles)
    if demand > capacity + 1e-9:
        parts = ", ".join(f"{r.name} {r.total}x{r.resources.gpu or 0:g}" for r in spec.roles)
        yield Problem(
            "roles",
            f"GPU demand {demand:g} ({parts}) exceeds node_num x device_per_node = {capacity}.",
            "lower total or resources.gpu, or raise node_num / device_per_node.",
        )
    for bundle_roles, where in _bundles(spec):
        bundle_gpu = sum(r.per_group * (r.resources.gpu or 0) for r in bundle_roles)
        if bundle_gpu > spec.device_per_node + 1e-9:
            yield Problem(
                where,
                f"one placement group bundle needs {bundle_gpu:g} GPUs, more than one node's "
                f"device_per_node={spec.device_per_node}.",
                "lower per_group or resources.gpu so that a bundle fits on one node.",
            )


def _bundles(spec: JobSpec) -> Iterator[tuple[list[RoleSpec], str]]:
    grouped: set[str] = set()
    for index, group in enumerate(spec.collocations):
        members = [r for r in spec.roles if r.name in group.roles]
        grouped.update(r.name for r in members)
        yield members, f"collocations[{index}]"
    for role in spec.roles:
        if role.name not in grouped:
            yield [role], _at(role, "per_group")


def gpu_selection_is_sound(spec: JobSpec) -> Iterator[Problem]:
    for role in spec.roles:
        gpu = role.resources.gpu or 0
        if role.rank_based_gpu_selection and not (role.per_group > 1 and gpu <= 1):
            yield Problem(
                _at(role, "rank_based_gpu_selection"),
                f"is only valid when per_group > 1 and resources.gpu <= 1 "
                f"(got per_group={role.per_group}, gpu={gpu:g}).",
                "turn rank_based_gpu_selection off, or use per_group > 1 with gpu <= 1.",
            )
        if 0 < gpu <= 0.5 and role.per_group == 8 and not role.rank_based_gpu_selection:
            yield Problem(
                _at(role, "resources.gpu"),
                "gpu <= 0.5 with per_group = 8 and no rank-based GPU selection lets Ray give the "
                "same GPU to several actors of the role, which breaks NCCL.",
                "set rank_based_gpu_selection: true (each rank uses cuda:{LOCAL_RANK}).",
            )


def elastic_roles_are_consistent(spec: JobSpec) -> Iterator[Problem]:
    for role in spec.roles:
        if role.kind is not RoleKind.ELASTIC:
            if role.elastic is not None:
                yield Problem(
                    _at(role, "elastic"),
                    f"elastic settings on a role of kind {role.kind.value!r}.",
                    "set kind: elastic, or remove the elastic block.",
                )
            continue
        assert role.elastic is not None  # filled by the model
        nproc, max_nodes = role.elastic.nproc_per_node, role.elastic.max_nodes
        if role.total != max_nodes * nproc:
            yield Problem(
                _at(role, "total"),
                f"is {role.total} but nnodes x nproc_per_node is {max_nodes} x {nproc} = {max_nodes * nproc}.",
                f"set total to {max_nodes * nproc}, or leave it out of elastic roles.",
            )
        if role.per_group != nproc:
            yield Problem(
                _at(role, "per_group"),
                f"is {role.per_group} but an elastic role groups nproc_per_node={nproc} ranks per node.",
                f"set per_group to {nproc}, or leave it out of elastic roles.",
            )


def entrypoints_parse(spec: JobSpec) -> Iterator[Problem]:
    for role in spec.roles:
        try:
            entry = parse_entrypoint(role.entrypoint)
        except ValueError as exc:
            yield Problem(
                _at(role, "entrypoint"),
                f"{exc}.",
                f"write {_at(role, 'entrypoint')} in one of the forms listed, e.g. 'train.py --lr 0.1' "
                "or 'mypkg.train:main'.",
            )
            continue
        if entry.kind is EntrypointKind.TORCHRUN:
            if role.kind is not RoleKind.ELASTIC:
                yield Problem(
                    _at(role, "entrypoint"),
                    "a torchrun command only runs in an elastic role.",
                    "set kind: elastic, or give the script or function directly.",
                )
                continue
            try:
                cmd = parse_torchrun(role.entrypoint)
            except ValueError as exc:
                yield Problem(
                    _at(role, "entrypoint"),
                    f"{exc}.",
                    f"fix the torchrun command in {_at(role, 'entrypoint')} as the message says, e.g. "
                    "'torchrun --nnodes=2 --nproc-per-node=4 train.py'.",
                )
                continue
            elastic = role.elastic
            if elastic is not None and (cmd.min_nodes, cmd.max_nodes) != (
                elastic.min_nodes,
                elastic.max_nodes,
            ):
                yield Problem(
                    _at(role, "elastic.nnodes"),
                    f"is {elastic.nnodes!r} but the torchrun command says --nnodes={cmd.nnodes}.",
                    "make them agree, or leave elastic.nnodes out.",
                )
            if (
                elastic is not None
                and isinstance(cmd.nproc_per_node, int)
                and cmd.nproc_per_node != elastic.nproc_per_node
            ):
                yield Problem(
                    _at(role, "elastic.nproc_per_node"),
                    f"is {elastic.nproc_per_node} but the torchrun command says "
                    f"--nproc-per-node={cmd.nproc_per_node}.",
                    "make them agree, or leave elastic.nproc_per_node out.",
                )
            if elastic is not None and isinstance(cmd.nproc_per_node, str):
                # torchrun resolves gpu/auto on the node; DLU needs the count before placing ranks.
                if spec.device_type is DeviceType.GPU and cmd.nproc_per_node in ("gpu", "auto"):
                    if elastic.nproc_per_node != spec.device_per_node:
                        yield Problem(
                            _at(role, "elastic.nproc_per_node"),
                            f"is {elastic.nproc_per_node} but --nproc-per-node="
                            f"{cmd.nproc_per_node} means one rank per GPU, "
                            f"device_per_node={spec.device_per_node}.",
                            f"set elastic.nproc_per_node: {spec.device_per_node}, or give "
                            "--nproc-per-node a number.",
                        )
                else:
                    yield Problem(
                        _at(role, "entrypoint"),
                        f"--nproc-per-node={cmd.nproc_per_node} cannot be resolved in a "
                        f"{spec.device_type} job.",
                        "give --nproc-per-node a number, e.g. --nproc-per-node=4.",
                    )
        if role.kind is RoleKind.CUSTOM:
            if role.sub_master is None:
                yield Problem(
                    _at(role, "sub_master"),
                    "a custom role needs its SubMaster class.",
                    "set sub_master: 'package.module:MySubMaster'.",
                )
        elif role.sub_master is not None:
            yield Problem(
                _at(role, "sub_master"),
                f"only custom roles take a sub_master; this role is {role.kind.value!r}.",
                "set kind: custom, or remove sub_master.",
            )
        if role.sub_master is not None:
            try:
                kind = parse_entrypoint(role.sub_master).kind
            except ValueError:
                kind = None
            if kind is not EntrypointKind.OBJECT:
                yield Problem(
                    _at(role, "sub_master"),
                    f"{role.sub_master!r} is not a class path.",
                    "write it as 'package.module:ClassName'.",
                )


def memory_in_bytes(spec: JobSpec) -> Iterator[Problem]:
    places = [(_at(r, "resources.memory"), r.resources.memory) for r in spec.roles]
    places.append(("master.memory", spec.master.memory))
    for field, value in places:
        if 0 < value < SUSPICIOUS_BYTES:
            yield Problem(
                field,
                f"{value} bytes is less than 1 MiB; memory is in bytes, so this looks like "
                "megabytes or gigabytes.",
                f"write the unit, e.g. '{value}MiB' ({format_bytes(value * 1024**2)}) or '{value}GiB'.",
            )


def job_has_a_driver(spec: JobSpec) -> Iterator[Problem]:
    if spec.roles and not any(r.is_driver for r in spec.roles):
        yield Problem(
            "roles",
            "no role is a driver, so the job would never end.",
            "leave is_driver: true on the role whose end ends the job (e.g. the trainer).",
        )


def env_names_are_valid(spec: JobSpec) -> Iterator[Problem]:
    places = [("env", spec.env)] + [(_at(r, "env"), r.env) for r in spec.roles]
    for field, env in places:
        for key in env:
            if not key or "=" in key or "\0" in key:
                yield Problem(
                    field,
                    f"{key!r} is not an environment variable name.",
                    f"rename it in {field} to a name without '=' or NUL characters, e.g. MY_SETTING.",
                )


def health_is_sound(spec: JobSpec) -> Iterator[Problem]:
    health = spec.health
    if health.heartbeat_timeout_s <= health.heartbeat_interval_s:
        yield Problem(
            "health.heartbeat_timeout_s",
            f"{health.heartbeat_timeout_s:g}s is not longer than the heartbeat interval "
            f"{health.heartbeat_interval_s:g}s, so every worker would look stale.",
            f"set health.heartbeat_timeout_s to several heartbeat intervals, e.g. "
            f"{health.heartbeat_interval_s * 6:g}.",
        )


RULES: tuple[Rule, ...] = (
    unique_role_names,
    actors_are_bounded,
    positive_counts,
    collocations_name_known_roles,
    gpu_demand_fits,
    gpu_selection_is_sound,
    elastic_roles_are_consistent,
    entrypoints_parse,
    memory_in_bytes,
    job_has_a_driver,
    env_names_are_valid,
    health_is_sound,
    autoscale_is_sound,
)


def check_spec(spec: JobSpec) -> list[Problem]:
    """Every problem the cross-field rules find in `spec`, in rule order."""
    return [problem for rule in RULES for problem in rule(spec)]


def ensure_valid(spec: JobSpec) -> JobSpec:
    """Return `spec` unchanged if it passes every rule.

    Raises:
        SpecError: listing every problem found.
    """
    problems = check_spec(spec)
    if problems:
        raise SpecError(problems)
    return spec
