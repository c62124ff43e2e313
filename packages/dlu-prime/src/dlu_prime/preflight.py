"""The checks of a job that need no Ray: run before Ray or any zygote starts, so bad input is
refused in a fraction of a second and leaves no process behind. Imports no Ray.

- `check`: entrypoint scripts and modules, SubMaster modules, the state store, the extension;
- `check_local`: the same, plus the job's resource totals against this machine, for a run on
  an embedded Ray here (`dlu run`, `Job.submit()` without an address). `dlu run` checks before
  anything starts and its local client again at submission (with the rank log folder it
  defaults and the Ray options it sized): the code checks, which read the roles' sources
  (0.1 to 0.4 s of the CLI's CPU before Ray starts), run at the first of these only
  (`reuse`), and the launcher then skips them (`launcher.submit_job(code_checked=True)`);
- `resource_problems`: needs against what a cluster or machine has; the launcher calls it again
  with Ray's own numbers once Ray is up (`launcher.preflight`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlu_api.errors import Problem, SpecError
from dlu_api.spec.autoscale_settings import BrainUrlMissing, brain_url
from dlu_api.spec.channels import channel_problems
from dlu_api.spec.entrypoint import EntrypointKind, parse_entrypoint
from dlu_api.spec.models import JobSpec, RoleKind
from dlu_api.spec.rules import ensure_valid
from dlu_api.spec.torchrun import parse_torchrun
from dlu_api.spec.units import format_amount
from dlu_prime import machine
from dlu_prime.roles import sub_master_path
from dlu_prime.scheduler.placement import (
    actor_options,
    is_node_grouped,
    master_options,
    node_group_name,
    plan_placement,
)

MASTER = "the PrimeMaster"
CLUSTER_HINT = "run it on a cluster (`dlu run --address http://HEAD:8265`)"


def code_problems(spec: JobSpec, workdir: str | None) -> list[Problem]:
    """Entrypoints, SubMasters, state store and extension that cannot be found or built here, and
    data channels that a role reads and no role writes (as `dlu validate` finds them)."""
    return (
        entrypoint_problems(spec, workdir)
        + channel_problems(spec, workdir)
        + store_problems(spec)
        + extension_problems(spec, workdir)
        + brain_problems(spec)
    )


def brain_problems(spec: JobSpec) -> list[Problem]:
    """A cluster-mode job with no Brain URL in its spec nor in this process's environment."""
    try:
        brain_url(spec.autoscale)
    except BrainUrlMissing as exc:
        return [Problem("autoscale.brain_url", str(exc), "give the Brain's URL, or use mode: single-job.")]
    return []


def check(spec: JobSpec, workdir: str | None) -> None:
    """Refuse a job whose code, state store or extension cannot be found from `workdir`.

    Raises:
        SpecError: every problem found.
    """
    ensure_valid(spec)
    problems = code_problems(spec, workdir)
    if problems:
        raise SpecError(problems)


REUSE_WITHIN_S = 60.0
"""How long a passed code check stands for the submission that follows it (`dlu run` submits
within seconds; a caller that checks and submits much later is checked afresh)."""

_passed: dict[tuple[str, str | None], float] = {}
"""The last code check passed in this process and not yet used by a submission: key -> when."""


def check_local(
    spec: JobSpec, workdir: str | None, ray_options: Mapping[str, Any], reuse: bool = False
) -> None:
    """`check`, plus the job's CPU, GPU and memory against this machine, for a run on an
    embedded Ray started here with `ray_options` (skipped when a Ray already runs in this
    process: the launcher's check then uses that Ray's numbers).

    A pass is remembered for the submission that follows. `reuse` (that submission's own
    check): the code checks are skipped if an earlier `check_local` of this process passed them
    for the same job code (the spec but its rank log settings) and `workdir` in the last
    `REUSE_WITHIN_S`; that pass is then used up. The rest is checked again.

    Raises:
        SpecError: every problem found.
    """
    ensure_valid(spec)
    have = {} if _ray_running() else machine.local_resources(sized_for(spec, ray_options))
    problems = resource_problems(spec, have, node_max=None, where="this machine")
    key = (spec.model_dump_json(exclude={"logs"}), workdir)
    passed_at = _passed.pop(key, None) if reuse else None
    code_checked = passed_at is not None and time.monotonic() - passed_at <= REUSE_WITHIN_S
    code = [] if code_checked else code_problems(spec, workdir)
    problems += code + log_dir_problems(spec)
    if problems:
        raise SpecError(problems)
    if not reuse:
        _passed.clear()  # one pass remembered: the latest check's, for the submission after it
        _passed[key] = time.monotonic()


def log_dir_problems(spec: JobSpec) -> list[Problem]:
    """A local job's rank log folder must be one this user can create and write (on a cluster
    each node makes its own)."""
    if not spec.logs.dir:
        return []
    folder = Path(os.path.expanduser(spec.logs.dir))
    existing = folder
    while not existing.exists() and existing != existing.parent:  # nothing is created here
        existing = existing.parent
    if not existing.is_dir():
        writable, detail = False, f"it cannot be created ({existing} is not a folder)"
    else:
        writable = os.access(existing, os.W_OK | os.X_OK)
        detail = f"{existing} is not writable by this user"
    if writable:
        return []
    return [
        Problem(
            "logs.dir",
            f"the rank log folder {folder} cannot be used: {detail}.",
            "give logs.dir (or --log-dir) a folder you can write, or leave it out for $DLU_HOME/logs.",
        )
    ]


def sized_for(spec: JobSpec, ray_options: Mapping[str, Any]) -> dict[str, Any]:
    """Ray options whose logical CPUs fit `spec`: max(this machine's cores, the job's CPU at
    its largest, every elastic role at its MAX nodes).

    A local run is one machine, where oversubscribing CPUs is what `dlu run` users expect (as
    of torchrun: 2 nodes x 2 processes on a 2-core laptop); memory and GPUs stay refused when
    short. Left alone when the caller or RAY_OVERRIDE_RESOURCES sets the CPUs, or the options
    join an existing Ray.
    """
    options = dict(ray_options)
    if "num_cpus" in options or options.get("address") not in (None, "local"):
        return options
    if "CPU" in machine.resource_override():
        return options
    cores = machine.local_resources(options).get("CPU", 1.0)
    # An elastic MIN:MAX role grows to MAX: size for it (logical CPUs are free to give), or the
    # nodes beyond MIN never fit and the role waits for them in vain.
    wanted = job_demand(spec, at_max=True).total.get("CPU", 0.0)
    return {**options, "num_cpus": max(int(cores), math.ceil(wanted - 1e-9))}


def _ray_running() -> bool:
    ray: Any = sys.modules.get("ray")  # never imported here: that alone costs a second
    return ray is not None and bool(ray.is_initialized())


# resources ---------------------------------------------------------------------------------------
_ROLE_FIELD = {"CPU": "resources.cpu", "GPU": "resources.gpu", "memory": "resources.memory"}
_MASTER_FIELD = {"CPU": "master.cpu", "memory": "master.memory"}


@dataclass
class Demand:
    """What a job's placement groups and PrimeMaster ask Ray for, by resource."""

    total: dict[str, float] = field(default_factory=dict[str, float])
    by_source: dict[str, dict[str, float]] = field(default_factory=dict[str, dict[str, float]])
    """resource -> {"roles[name]" or MASTER: amount}, for messages."""
    bundle: dict[str, tuple[float, str]] = field(default_factory=dict[str, tuple[float, str]])
    """resource -> (largest amount one bundle needs, its group's roles)."""


def job_demand(spec: JobSpec, at_max: bool = False) -> Demand:
    """What the job needs to start: an elastic role with a MIN:MAX range starts with MIN nodes.
    `at_max`: what it needs once every such role has grown to MAX."""
    demand = Demand()
    beyond_min = {
        node_group_name(r.name, k)
        for r in spec.roles
        if r.elastic is not None and is_node_grouped(spec, r) and not at_max
        for k in range(r.elastic.min_nodes, r.elastic.max_nodes)
    }
    for group in plan_placement(spec).groups:
        if group.name in beyond_min:
            continue
        for bundle in group.bundles:
            for name, amount in bundle.resources.items():
                demand.total[name] = demand.total.get(name, 0.0) + amount
                if amount > demand.bundle.get(name, (0.0, ""))[0]:
                    demand.bundle[name] = (amount, ", ".join(f"roles[{r}]" for r in group.roles))
    for role in spec.roles:
        options = actor_options(role, spec)
        per_actor = {"CPU": options["num_cpus"], "GPU": options["num_gpus"], **options["resources"]}
        per_actor["memory"] = float(options.get("memory", 0))
        for name, amount in per_actor.items():
            if amount > 0:
                count = role.total
                if role.elastic is not None and is_node_grouped(spec, role) and not at_max:
                    count = role.elastic.min_nodes * role.per_group
                demand.by_source.setdefault(name, {})[f"roles[{role.name}]"] = count * amount
    master = master_options(spec)
    master_needs: dict[str, float] = {"CPU": float(master.get("num_cpus", 0.0)), **master["resources"]}
    if master.get("memory"):
        master_needs["memory"] = float(master["memory"])
    for name, amount in master_needs.items():
        if amount > 0:
            demand.total[name] = demand.total.get(name, 0.0) + amount
            demand.by_source.setdefault(name, {})[MASTER] = amount
    return demand


def resource_problems(
    spec: JobSpec, have: Mapping[str, float], node_max: Mapping[str, float] | None, where: str
) -> list[Problem]:
    """The job's resource totals against `have` (only the resources named there), and each
    bundle against the largest node (`node_max`; None: one machine, where totals say it all)."""
    demand = job_demand(spec)
    problems: list[Problem] = []
    for name, amount in sorted(demand.total.items()):
        if name not in have or amount <= have[name] + 1e-9:
            continue
        sources = demand.by_source.get(name, {})
        roles = [s for s in sorted(sources, key=lambda s: -sources[s]) if s != MASTER]
        breakdown = ", ".join(
            f"{s} {format_amount(name, sources[s])}" for s in [*roles, MASTER] if s in sources
        )
        problems.append(
            Problem(
                f"{roles[0]}.{_role_field(name)}" if len(roles) == 1 else "roles",
                f"the job needs {format_amount(name, amount)} {name} in all ({breakdown}) but {where} "
                f"has {format_amount(name, have[name])}.",
                _lower_fix(spec, name, roles, MASTER in sources, have[name], where),
            )
        )
    if node_max is None:
        return problems
    for name, (amount, group) in sorted(demand.bundle.items()):
        fits_in_all = name in have and demand.total[name] <= have[name] + 1e-9
        if fits_in_all and amount > node_max.get(name, 0.0) + 1e-9:
            largest = format_amount(name, node_max.get(name, 0.0))
            problems.append(
                Problem(
                    "roles",
                    f"one placement bundle of {group} needs {format_amount(name, amount)} {name} but "
                    f"the largest node has {largest}.",
                    f"lower per_group or {_role_field(name)} of {group} so that one bundle (per_group "
                    f"actors) fits in {largest}, or add a node with more {name}.",
                )
            )
    return problems


def _role_field(name: str) -> str:
    return _ROLE_FIELD.get(name, f"resources.custom.{name}")


def _lower_fix(spec: JobSpec, name: str, roles: list[str], master: bool, have: float, where: str) -> str:
    fields = [f"{r}.{_role_field(name)} (or {r}.total)" for r in roles[:3]]
    if master:
        fields.append(
            _MASTER_FIELD.get(name)
            or (
                "master.isolation_resource"
                if name == spec.master.isolation_resource
                else f"the PrimeMaster's {name}"
            )
        )
    listed = fields[0] if len(fields) == 1 else f"{', '.join(fields[:-1])} or {fields[-1]}"
    lower = f"lower {listed} so that the job needs at most {format_amount(name, have)} {name}"
    if where != "this machine":
        return f"{lower}, or add nodes with {name}."
    if name == "GPU" and have == 0:
        return (
            f"this machine has no GPU: {CLUSTER_HINT} with GPUs, or make it a CPU job "
            "(device_type: CPU, device_per_node: 0 and resources.gpu: 0 in every role)."
        )
    return f"{lower}, or {CLUSTER_HINT}."


# code, store, extension -------------------------------------------------------------------------
def _module_found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def entrypoint_problems(spec: JobSpec, workdir: str | None) -> list[Problem]:
    """Entrypoints and SubMasters that cannot be found from here (modules by spec, scripts by path)."""
    problems: list[Problem] = []
    added = workdir is not None and workdir not in sys.path
    if added and workdir is not None:
        sys.path.insert(0, workdir)
    where = workdir or "the cluster"
    try:
        for role in spec.roles:
            entry = parse_entrypoint(role.entrypoint)
            if entry.kind is EntrypointKind.TORCHRUN:
                entry = parse_entrypoint(parse_torchrun(role.entrypoint).entrypoint)
            field_name = f"roles[{role.name}].entrypoint"
            if entry.kind in (EntrypointKind.OBJECT, EntrypointKind.MODULE):
                module = entry.module if entry.kind is EntrypointKind.OBJECT else entry.target
                if not _module_found(module):
                    problems.append(
                        Problem(
                            field_name,
                            f"module {module!r} cannot be imported (searched from {where}).",
                            f"fix the module name in {field_name}, install the package that provides "
                            f"{module.split('.')[0]!r}, or run from the directory that holds it.",
                        )
                    )
            sub_master = sub_master_path(role)
            if sub_master is not None and not _module_found(sub_master.partition(":")[0]):
                problems.append(_sub_master_problem(role.name, role.kind, sub_master))
            if entry.kind is EntrypointKind.SCRIPT:
                path = Path(entry.target)
                if not path.is_absolute() and workdir:
                    path = Path(workdir) / path
                if not path.is_file():
                    problems.append(
                        Problem(
                            field_name,
                            f"script {str(path)!r} does not exist.",
                            f"fix the script path in {field_name} (a relative path is read from "
                            f"{where}), or run from the directory that holds {entry.target!r}.",
                        )
                    )
    finally:
        if added and workdir in sys.path:
            sys.path.remove(workdir)
    return problems


def _sub_master_problem(role: str, kind: RoleKind, sub_master: str) -> Problem:
    if kind is RoleKind.ELASTIC:
        return Problem(
            f"roles[{role}].kind",
            f"an elastic role needs the SubMaster {sub_master!r}, which cannot be imported.",
            "install dlu-elastic where the job runs (`pip install dlu-elastic`).",
        )
    return Problem(
        f"roles[{role}].sub_master",
        f"the SubMaster {sub_master!r} cannot be imported.",
        f"fix the module path in roles[{role}].sub_master ('package.module:Class'), or install "
        "the package that provides it.",
    )


def store_problems(spec: JobSpec) -> list[Problem]:
    from dlu_prime.state.base import StateStoreError, available_state_stores, create_state_store

    try:
        create_state_store(spec.state_store.name, spec.state_store.options).close()
    except StateStoreError as exc:
        installed = ", ".join(available_state_stores()) or "none"
        return [
            Problem(
                "state_store",
                str(exc),
                f"set state_store.name to an installed store ({installed}), or fix "
                "state_store.options as the message says.",
            )
        ]
    return []


def extension_problems(spec: JobSpec, workdir: str | None) -> list[Problem]:
    from dlu_prime.extension import ExtensionError, load_extension

    try:
        load_extension(spec, workdir)
    except ExtensionError as exc:
        return [
            Problem(
                "extension",
                str(exc),
                "install the package that registers it in 'dlu.extensions', fix the 'module:Class' "
                "path in extension, or remove the field (nodes are then not relaunched).",
            )
        ]
    return []
