"""A local embedded Ray's logical CPUs are sized for the job; memory and GPUs are still checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlu_api.builder import from_torchrun_cmd
from dlu_api.errors import SpecError
from dlu_prime import machine, preflight
from dlu_prime.preflight import sized_for

pytestmark = pytest.mark.timeout(30)

TORCHRUN = ["torchrun", "--nnodes=2", "--nproc-per-node=2", "examples/elastic/allreduce.py"]


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(machine.RAY_OVERRIDE_ENV, raising=False)
    monkeypatch.setattr(machine, "_cpu_bound", lambda root: 2.0)
    # An earlier test in this process may have left a Ray running: check_local then defers to it.
    monkeypatch.setattr(preflight, "_ray_running", lambda: False)


@pytest.mark.usefixtures("two_cores")
def test_the_readme_torchrun_job_fits_a_two_core_machine() -> None:
    spec = from_torchrun_cmd(TORCHRUN, name="t", device_type="CPU")
    wanted = preflight.job_demand(spec).total["CPU"]
    assert wanted > 2
    options = sized_for(spec, {})
    assert options == {"num_cpus": int(wanted)}
    preflight.check_local(spec, str(Path.cwd()), {})  # no CPU refusal
    with pytest.raises(SpecError, match="CPU"):
        preflight.check_local(spec, str(Path.cwd()), {"num_cpus": 2})  # what the caller set is kept


@pytest.mark.usefixtures("two_cores")
def test_a_small_job_keeps_the_machines_cores() -> None:
    spec = from_torchrun_cmd(["torchrun", "--nproc-per-node=1", "train.py"], name="t", device_type="CPU")
    assert sized_for(spec, {}) == {"num_cpus": 2}


@pytest.mark.usefixtures("two_cores")
def test_what_the_caller_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = from_torchrun_cmd(TORCHRUN, name="t", device_type="CPU")
    assert sized_for(spec, {"num_cpus": 1}) == {"num_cpus": 1}
    assert sized_for(spec, {"address": "auto"}) == {"address": "auto"}
    monkeypatch.setenv(machine.RAY_OVERRIDE_ENV, '{"CPU": 1}')
    assert sized_for(spec, {}) == {}


@pytest.mark.usefixtures("two_cores")
def test_missing_gpus_are_still_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = from_torchrun_cmd(TORCHRUN, name="t", device_type="GPU")
    monkeypatch.setattr(machine, "_gpu_bound", lambda env, root: 0.0)
    with pytest.raises(SpecError, match="GPU"):
        preflight.check_local(spec, str(Path.cwd()), sized_for(spec, {}))


@pytest.mark.usefixtures("two_cores")
def test_a_min_max_role_is_sized_for_its_max_nodes() -> None:
    """--nnodes=1:2 on this machine: Ray gets the CPUs of both nodes, so the second is placed
    at once instead of after elastic.start_timeout_s (issue 28, item 16)."""
    command = ["torchrun", "--nnodes=1:2", "--nproc-per-node=2", "examples/elastic/allreduce.py"]
    spec = from_torchrun_cmd(command, name="t", device_type="CPU")
    at_min = preflight.job_demand(spec).total["CPU"]
    at_max = preflight.job_demand(spec, at_max=True).total["CPU"]
    assert at_max > at_min and at_max > 2
    assert sized_for(spec, {}) == {"num_cpus": int(at_max)}
