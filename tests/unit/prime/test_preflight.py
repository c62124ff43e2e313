"""The checks that need no Ray (`dlu_prime.preflight`): what a job needs against what a machine
or cluster has, and code that cannot be found; each problem names the field and what to change."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from dlu_api.errors import SpecError
from dlu_api.spec import spec_from_dict
from dlu_api.spec.models import JobSpec
from dlu_prime import preflight
from dlu_prime.preflight import check_local, job_demand, resource_problems

pytestmark = pytest.mark.timeout(60)

HERE = str(Path(__file__).parent)


def job(*roles: dict[str, Any], **top: Any) -> JobSpec:
    return spec_from_dict(
        {"name": "pf", "device_type": "CPU", "device_per_node": 0, **top, "roles": list(roles)}
    )


def role(name: str = "w", entrypoint: str = "json:loads", **extra: Any) -> dict[str, Any]:
    return {"name": name, "entrypoint": entrypoint, **extra}


# --- resources ------------------------------------------------------------------------------


def test_demand_counts_every_actor_and_the_prime_master() -> None:
    spec = job(role(total=4, per_group=2, resources={"cpu": 2, "memory": "1GiB"}), master={"cpu": 0.5})
    demand = job_demand(spec)
    assert demand.total["CPU"] == 8.5 and demand.total["memory"] == 4 * 2**30
    assert demand.by_source["CPU"] == {"roles[w]": 8.0, preflight.MASTER: 0.5}
    assert demand.bundle["CPU"] == (4.0, "roles[w]")


def test_one_role_over_the_machine_names_its_field_the_sum_and_the_fix() -> None:
    spec = job(role(total=2, resources={"cpu": 2048}))
    [problem] = resource_problems(spec, {"CPU": 2.0}, None, "this machine")
    assert problem.field == "roles[w].resources.cpu"
    assert problem.message == (
        "the job needs 4097 CPU in all (roles[w] 4096, the PrimeMaster 1) but this machine has 2."
    )
    assert problem.fix.startswith(
        "lower roles[w].resources.cpu (or roles[w].total) or master.cpu so that the job needs at most 2 CPU"
    )
    assert "--address" in problem.fix


def test_several_roles_over_the_machine_are_listed_biggest_first() -> None:
    spec = job(role("a", resources={"cpu": 1}), role("b", total=3, resources={"cpu": 2}))
    [problem] = resource_problems(spec, {"CPU": 2.0}, None, "this machine")
    assert problem.field == "roles"
    assert "(roles[b] 6, roles[a] 1, the PrimeMaster 1)" in problem.message
    assert problem.fix.startswith("lower roles[b].resources.cpu (or roles[b].total), roles[a]")


def test_memory_is_printed_in_units() -> None:
    spec = job(role(total=4, resources={"memory": "4GiB"}), master={"memory": "300MiB"})
    [problem] = resource_problems(spec, {"memory": 1.63174e10}, None, "this machine")
    assert "needs 16.3 GiB memory in all (roles[w] 16 GiB, the PrimeMaster 300 MiB)" in problem.message
    assert "has 15.2 GiB" in problem.message
    assert "e+" not in problem.message + problem.fix
    assert "master.memory" in problem.fix


def test_a_gpu_job_on_a_machine_without_gpus_says_how_to_run_it() -> None:
    spec = spec_from_dict(
        {"name": "pf", "device_per_node": 1, "roles": [role(resources={"gpu": 1, "cpu": 0.1})]}
    )
    [problem] = resource_problems(spec, {"CPU": 2.0, "GPU": 0.0}, None, "this machine")
    assert problem.field == "roles[w].resources.gpu"
    assert "needs 1 GPU in all" in problem.message and "this machine has 0" in problem.message
    assert "this machine has no GPU" in problem.fix
    assert "device_type: CPU" in problem.fix and "--address" in problem.fix


def test_a_resource_the_machine_cannot_bound_is_not_judged() -> None:
    spec = job(role(resources={"custom": {"tpu_slice": 4}}))
    assert resource_problems(spec, {"CPU": 2.0}, None, "this machine") == []


def test_on_a_cluster_a_bundle_larger_than_any_node_is_refused() -> None:
    spec = job(role(total=4, per_group=4, resources={"cpu": 2}))
    [problem] = resource_problems(spec, {"CPU": 16.0}, {"CPU": 4.0}, "the cluster")
    assert "one placement bundle of roles[w] needs 8 CPU but the largest node has 4" in problem.message
    assert "lower per_group or resources.cpu of roles[w]" in problem.fix
    [short] = resource_problems(spec, {"CPU": 4.0}, {"CPU": 4.0}, "the cluster")
    assert "the cluster has 4" in short.message and "add nodes with CPU" in short.fix


# --- check_local ----------------------------------------------------------------------------


def test_check_local_reports_code_and_resources_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    spec = job(
        role("a", "no_such_script.py --x", resources={"memory": "4096TiB"}),
        role("b", "no_such_pkg_xyz.mod:main", resources={"cpu": 0}),
    )
    with pytest.raises(SpecError) as info:
        check_local(spec, HERE, {})
    fields = [p.field for p in info.value.problems]
    assert fields == ["roles[a].resources.memory", "roles[a].entrypoint", "roles[b].entrypoint"]
    script = info.value.problems[1]
    assert "does not exist" in script.message
    assert "fix the script path in roles[a].entrypoint" in script.fix and HERE in script.fix
    module = info.value.problems[2]
    assert "'no_such_pkg_xyz.mod' cannot be imported" in module.message
    assert "'no_such_pkg_xyz'" in module.fix


def test_check_local_takes_the_local_clients_ray_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    spec = job(role(total=2, resources={"cpu": 16}))
    with pytest.raises(SpecError):
        check_local(spec, HERE, {"num_cpus": 8})
    check_local(spec, HERE, {"num_cpus": 64})  # LocalJobClient(num_cpus=64): a logical 64 CPUs


def test_check_local_leaves_resources_to_a_ray_already_running_here(monkeypatch: pytest.MonkeyPatch) -> None:
    running = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "ray", running)
    check_local(job(role(resources={"cpu": 1e6})), HERE, {"num_cpus": 1})


def test_the_submissions_own_check_reuses_the_code_check_just_passed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = job(role(entrypoint="train.py"))
    check_local(spec, str(tmp_path), {})  # `connect`, before anything starts
    script.unlink()  # the code is not read again by the check of the submission that follows
    with_logs = spec.model_copy(update={"logs": spec.logs.model_copy(update={"dir": str(tmp_path)})})
    check_local(with_logs, str(tmp_path), {"num_cpus": 4}, reuse=True)
    with pytest.raises(SpecError, match="does not exist"):  # that pass is used up
        check_local(spec, str(tmp_path), {}, reuse=True)


def test_a_reused_check_still_checks_what_changed_and_other_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Ray an earlier test of this process left running would leave the resources unjudged.
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = job(role(entrypoint="train.py"))
    check_local(spec, str(tmp_path), {})
    script.unlink()
    other = job(role(entrypoint="train.py"), name="another")
    with pytest.raises(SpecError, match="does not exist"):  # another job's code is read
        check_local(other, str(tmp_path), {}, reuse=True)
    check_local(job(role()), HERE, {})
    bigger = job(role(resources={"memory": "4096TiB"}))
    with pytest.raises(SpecError, match="memory"):  # the resources are judged again
        check_local(bigger, HERE, {}, reuse=True)


def test_a_code_check_is_not_reused_once_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = job(role(entrypoint="train.py"))
    check_local(spec, str(tmp_path), {})
    script.unlink()
    monkeypatch.setattr(preflight, "REUSE_WITHIN_S", -1.0)  # any age is too old
    with pytest.raises(SpecError, match="does not exist"):
        check_local(spec, str(tmp_path), {}, reuse=True)


def test_a_custom_role_with_a_missing_sub_master_names_the_field() -> None:
    spec = job(role(kind="custom", sub_master="no_such_pkg_xyz:Sub"))
    [problem] = preflight.entrypoint_problems(spec, HERE)
    assert problem.field == "roles[w].sub_master"
    assert "'package.module:Class'" in problem.fix


def test_an_unknown_state_store_lists_the_installed_ones() -> None:
    [problem] = preflight.store_problems(job(role(), state_store={"name": "nope"}))
    assert problem.field == "state_store"
    assert "set state_store.name to an installed store (" in problem.fix and "embedded" in problem.fix


def test_preflight_imports_no_ray() -> None:
    code = """
        import json, sys
        from dlu_api.spec import spec_from_dict
        from dlu_prime import preflight
        spec = spec_from_dict({"name": "pf", "device_type": "CPU", "device_per_node": 0,
                               "roles": [{"name": "w", "entrypoint": "json:loads"}]})
        preflight.check_local(spec, ".", {})
        print(json.dumps([m for m in ("ray", "torch", "grpc") if m in sys.modules]))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_a_resume_with_nothing_stored_says_which_store_was_read() -> None:
    from dlu_prime.launcher import _check_resumable  # pyright: ignore[reportPrivateUsage]

    with pytest.raises(SpecError) as info:
        _check_resumable(job(role(), state_store={"name": "memory"}))
    [problem] = info.value.problems
    assert problem.field == "name"
    assert problem.fix == (
        "set name to a job stored in state_store 'memory', or point state_store at the store that "
        "holds job 'pf'."
    )


def test_a_log_dir_that_cannot_be_created_is_refused_naming_the_field(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    spec = spec_from_dict(
        {"name": "logs", "device_type": "CPU", "logs": {"dir": str(blocker / "logs")},
         "roles": [{"name": "w", "entrypoint": "json:dumps", "resources": {"cpu": 0.1}}]}
    )  # fmt: skip
    (problem,) = preflight.log_dir_problems(spec)
    assert problem.field == "logs.dir" and "cannot be created" in problem.message
    with pytest.raises(SpecError, match=r"logs\.dir"):
        check_local(spec, str(tmp_path), {})
    fine = spec.model_copy(
        update={"logs": spec.logs.model_copy(update={"dir": str(tmp_path / "new" / "logs")})}
    )
    assert preflight.log_dir_problems(fine) == []
    assert not (tmp_path / "new").exists()  # checked, not created
