"""`dlu run` runs the job's code checks once: `connect` checks before anything starts, and the
local client's check at submission and the launcher's after Ray is up do not read the roles'
code again (dlu_prime.preflight: `check_local(reuse=True)`, `submit_job(code_checked=True)`).
Before, the CLI's process ran them three times, the first two before Ray started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_runs import Box

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SPEC = """
name: checked-once
device_type: CPU
device_per_node: 0
config: {{ext_log: {log}}}
extension: counting_ext:CountingExtension
roles:
  - name: worker
    entrypoint: workloads:quick
    resources: {{cpu: 0.1}}
"""


def test_a_dlu_run_checks_the_jobs_code_once(box: Box, tmp_path: Path) -> None:
    log = tmp_path / "ext.log"
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(log=log))
    run = box.start(spec)
    assert run.proc.wait(180) == 0, run.output()[-3000:]
    builders = log.read_text(encoding="utf-8").split()
    # The CLI once (its pre-flight); the PrimeMaster's own process builds it for the job.
    assert builders.count(str(run.pid)) == 1, builders
    assert os.getpid() not in {int(pid) for pid in builders}
