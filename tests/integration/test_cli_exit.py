"""A `dlu run` whose job ends well returns the prompt without leaving anything of its own behind.

`dlu run` exits once the job's record says STOPPED and the embedded Ray's processes are told to
end, without waiting for them (dlu_prime.local: `LocalJobClient.close(wait=False)`): this checks
that every process of the run's Ray session and every training process is gone within a few
seconds of the CLI's exit, that the record it leaves is the job's end and that its name is free.
Run quiet (the default) and with --verbose (which keeps Ray's log monitor for the worker output).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runs import Box, wait_until
from proc_checks import Proc, processes, snapshot, still_alive

from dlu_prime import job_lock

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

# What "a few seconds" is: the processes Ray ties to the CLI die with it at once, the rest when
# the reaper's watcher sees the CLI gone (dlu_prime.reaper); a minute is what Ray's agents
# would take on their own.
GONE_WITHIN_S = 10.0

SPEC = """
name: {name}
device_type: CPU
device_per_node: 0
node_num: 1
health: {{monitor_interval_s: 0.2}}
roles:
  - name: trainer
    kind: elastic
    entrypoint: elastic_workloads:finish_when_told
    resources: {{cpu: 0.25}}
    env: {{OUT_DIR: {out}}}
    elastic: {{nnodes: 1, nproc_per_node: 2}}
"""


def session_of(ray_tmpdir: str) -> list[Proc]:
    """Every process of the run's Ray session: what carries its Ray temp dir in its environment
    (the CLI passes RAY_TMPDIR to everything it starts), the zygotes and what they keep forked
    ahead left out (shared by the node's runs, they exit when idle)."""
    needle = f"RAY_TMPDIR={ray_tmpdir}".encode()
    found: list[Proc] = []
    for proc in processes().values():
        if "dlu_prime.zygote" in proc.cmdline:
            continue
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(proc)
    return found


@pytest.mark.parametrize("options", [(), ("--verbose",)], ids=["quiet", "verbose"])
def test_a_finished_run_exits_and_leaves_nothing(box: Box, tmp_path: Path, options: tuple[str, ...]) -> None:
    name = "ends-well"
    out = tmp_path / "out"
    out.mkdir()
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(name=name, out=out))
    run = box.start(spec, *options)
    wait_until(lambda: len(list(out.glob("ready-*.json"))) == 2, "both ranks training", run)
    training = [snapshot(json.loads(f.read_text())["pid"]) for f in sorted(out.glob("ready-*.json"))]
    session = session_of(run.ray_tmpdir)
    commands = " | ".join(p.cmdline for p in session)
    assert "raylet" in commands and "gcs_server" in commands and "ray::" in commands, commands
    assert run.pid in {p.pid for p in session}, commands
    alive = [p for p in training if p is not None]
    assert len(alive) == 2, training
    ours = [*session, *alive]

    (out / "go").touch()
    assert run.proc.wait(120) == 0, run.output()[-3000:]

    # The record is the job's end, written before the prompt came back; the name is free.
    record = box.record(name)
    assert record is not None
    assert (record["status"]["stage"], record["status"]["exit_code"]) == ("STOPPED", 0), record["status"]
    assert job_lock.holder(box.home / "jobs" / f"{name}.lock") is None
    assert "STOPPED" in run.output()

    wait_until(lambda: not still_alive(ours), "end of every process of the run",
               timeout_s=GONE_WITHIN_S)  # fmt: skip
