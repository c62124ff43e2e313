"""Elastic roles with nnodes MIN:MAX on a real multi-node `ray.cluster_utils.Cluster` (all on
loopback; each worker node offers one `slot`, each node of the role takes one, so a role node is
a Ray node):

- no node can be placed (the only one is taken): the job waits start_timeout_s, then stops with a reason naming the
  nodes it got, the nodes it needs and what one node needs;
- 1 of 2 nodes available: the job starts at world 1; a node added: it grows to world 2 (the new
  rank passes the node check), every step's allreduce agreeing with its world;
- `dlu scale` of the elastic role: outside MIN..MAX refused naming the range; 2 -> 1 -> 2;
- the added node removed from the cluster for good: training goes on in place at world 1 (the
  surviving rank's actor is the same process, no restart of any kind is counted), one resize;
- a calm job (both nodes there) over many multiples of resize_interval_s: no resize at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys, time
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, out = Path(sys.argv[1]), Path(sys.argv[2])
with pin_loopback():  # every node and this driver stay on 127.0.0.1
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "node_ip_address": "127.0.0.1",
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    ray.init(address=cluster.address, namespace=NAMESPACE)
node_args = {"num_cpus": 2, "resources": {"slot": 1}, "node_ip_address": "127.0.0.1"}
workdir = str(root / "tests" / "integration")
results = {}

def spec(name, **elastic):
    (out / name).mkdir()
    return spec_from_dict({
        "name": name, "device_type": "CPU", "device_per_node": 0, "node_num": 2,
        "master": {"cpu": 0.1}, "health": {"monitor_interval_s": 0.2},
        "roles": [{"name": "trainer", "kind": "elastic", "entrypoint": "elastic_resize_workload:train",
                   "resources": {"cpu": 0.25, "custom": {"slot": 1}}, "env": {"OUT_DIR": str(out / name)},
                   "elastic": {"nnodes": "1:2", "nproc_per_node": 1, **elastic}}],
    })

def steps(name):
    log = out / name / "steps.log"
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [(int(r[0]), int(r[1]), int(r[3])) for r in rows if len(r) >= 5]

def wait(what, check, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")

def steps_at(name, world, after=0, count=3):
    def check():
        current = launcher.job_status(name)
        if current is not None and current.stage.value == "STOPPED":
            raise SystemExit(f"job {name} stopped: {current.reason}")
        return len([s for s in steps(name) if s[1] == world and s[0] > after]) >= count
    return check

def last_step(name):
    found = steps(name)
    return found[-1][0] if found else 0

def pid(actor):
    return ray.get(ray.get_actor(actor, namespace=NAMESPACE).status.remote(), timeout=30)["pid"]

# the only node the role could use is taken: waits start_timeout_s, then stops naming what
# is missing (the cluster has the resource, so the submit-time check lets the job through)
first = cluster.add_node(**node_args)
from ray.util.placement_group import placement_group, remove_placement_group
blocker = placement_group([{"slot": 1}])
ray.get(blocker.ready(), timeout=60)
below = launcher.run_job(spec("below", start_timeout_s=2), workdir)
results["below"] = {"exit_code": below.exit_code, "reason": below.reason}
remove_placement_group(blocker)
wait("the slot given back", lambda: ray.available_resources().get("slot", 0) >= 1)

# 1 of 2 nodes: starts at world 1, grows to 2 when the second node is added
job = spec("grow", start_timeout_s=8, resize_interval_s=1, replace_timeout_s=3,
           node_check={"matmul_size": 64, "allreduce_mb": 0.1, "timeout_s": 30})
launcher.submit_job(job, workdir)
wait("training at world 1", steps_at("grow", 1))
status = launcher.job_status("grow")
results["started"] = {"size": status.roles[0].size, "nodes": status.roles[0].nodes,
                      "pending": status.roles[0].pending_nodes}
survivor_pid = pid("grow.trainer.0")
second = cluster.add_node(**node_args)
wait("growth to world 2", steps_at("grow", 2))

# dlu scale of the elastic role: refused outside MIN..MAX; 2 -> 1 -> 2
try:
    launcher.scale_job("grow", "trainer", 3)
    results["scale_3"] = "accepted"
except ValueError as exc:
    results["scale_3"] = str(exc)
down = launcher.scale_job("grow", "trainer", 1)
at = last_step("grow")
wait("world 1 after dlu scale 1", steps_at("grow", 1, after=at))
up = launcher.scale_job("grow", "trainer", 2)
at = last_step("grow")
wait("world 2 after dlu scale 2", steps_at("grow", 2, after=at))
results["scale"] = [down, up]

# the second node removed for good: shrink in place to world 1
cluster.remove_node(second)
removed_at = last_step("grow")
wait("world 1 after the node was removed", steps_at("grow", 1, after=removed_at))
results["survivor_same_process"] = pid("grow.trainer.0") == survivor_pid
(out / "grow" / "finish").write_text("")
final = launcher.wait_job(job)
role = final.roles[0]
results["grow"] = {
    "exit_code": final.exit_code, "reason": final.reason, "restarts": role.restart_count,
    "inplace": role.inplace_restart_count, "resizes": role.resize_count,
    "job_restarts": final.job_restart_count,
    "actor_restarts": {a.name: a.restart_count for a in role.actors if a.rank >= 0},
    "events": [[e.kind, e.message] for e in final.events],
    "worlds": sorted({s[1] for s in steps("grow")}),
    "steps": [s[0] for s in steps("grow")],
}

# calm: both nodes there, nothing injected, many resize intervals: no resize at all
cluster.add_node(**node_args)
calm = spec("calm", start_timeout_s=5, resize_interval_s=0.3, replace_timeout_s=1)
launcher.submit_job(calm, workdir)
wait("calm training at world 2", steps_at("calm", 2))
time.sleep(6)  # 20 resize intervals
(out / "calm" / "finish").write_text("")
done = launcher.wait_job(calm)
results["calm"] = {"exit_code": done.exit_code, "reason": done.reason,
                   "resizes": done.roles[0].resize_count,
                   "kinds": sorted({e.kind for e in done.events}),
                   "worlds": sorted({s[1] for s in steps("calm")})}
print(json.dumps(results))
ray.shutdown()
cluster.shutdown()
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("elastic-resize")
    env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-er-")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def test_below_min_waits_then_stops_naming_nodes_got_needed_and_missing(results: dict[str, object]) -> None:
    below = results["below"]
    assert isinstance(below, dict)
    assert below["exit_code"] == 1
    reason = str(below["reason"])
    assert "got 0 node(s)" in reason and "needs at least 1" in reason, reason
    assert "each node of the role needs" in reason and "slot" in reason, reason


def test_starts_at_min_and_grows_when_a_node_is_added(results: dict[str, object]) -> None:
    assert results["started"] == {"size": 1, "nodes": 1, "pending": 1}
    grow = results["grow"]
    assert isinstance(grow, dict)
    assert grow["exit_code"] == 0, grow["reason"]
    assert grow["worlds"] == [1, 2]
    steps = grow["steps"]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # resumed from its checkpoint
    kinds = [kind for kind, _ in grow["events"]]
    assert "elastic_start" in kinds
    done = [message for kind, message in grow["events"] if kind == "resize_done"]
    assert any("1 -> 2 node(s), world 1 -> 2 (capacity" in m for m in done), done


def test_dlu_scale_of_an_elastic_role(results: dict[str, object]) -> None:
    assert "outside its nnodes 1:2" in str(results["scale_3"])
    down, up = results["scale"]  # type: ignore[misc]
    assert down["done"] and not down["failed"], down
    assert up["done"] and not up["failed"], up
    assert "2 -> 1 node(s)" in down["message"] and "1 -> 2 node(s)" in up["message"]


def test_a_node_lost_for_good_shrinks_in_place_as_one_resize(results: dict[str, object]) -> None:
    grow = results["grow"]
    assert isinstance(grow, dict)
    assert results["survivor_same_process"] is True
    lost = [m for kind, m in grow["events"] if kind == "resize_done" and "node lost" in m]
    assert len(lost) == 1 and "2 -> 1 node(s), world 2 -> 1" in lost[0], grow["events"]
    assert (grow["restarts"], grow["inplace"], grow["job_restarts"]) == (0, 0, 0), grow["events"]
    assert grow["resizes"] == 4  # grown, scaled down, scaled up, node lost
    assert grow["actor_restarts"] == {"grow.trainer.0": 0}


def test_nothing_injected_means_no_resize(results: dict[str, object]) -> None:
    calm = results["calm"]
    assert isinstance(calm, dict)
    assert calm["exit_code"] == 0, calm["reason"]
    assert calm["resizes"] == 0 and calm["worlds"] == [2]
    assert not [k for k in calm["kinds"] if k.startswith("resize")], calm["kinds"]


LM_SCRIPT = r"""
import json, sys, time
from pathlib import Path
from dlu_prime.ray_env import pin_loopback
import ray
from ray.cluster_utils import Cluster
from dlu_api.spec import spec_from_dict
from dlu_prime import launcher
from dlu_prime.naming import NAMESPACE

root, out, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
with pin_loopback():
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "node_ip_address": "127.0.0.1",
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    ray.init(address=cluster.address, namespace=NAMESPACE)
node_args = {"num_cpus": 2, "resources": {"slot": 1}, "node_ip_address": "127.0.0.1"}
cluster.add_node(**node_args)
spec = spec_from_dict({
    "name": "lm-resize", "device_type": "CPU", "device_per_node": 0, "node_num": 2,
    "master": {"cpu": 0.1}, "health": {"monitor_interval_s": 0.2},
    "roles": [{"name": "trainer", "kind": "elastic",
               "entrypoint": f"examples/elastic/train_lm.py --steps {steps} --global-batch 8 "
                             f"--checkpoint-every 5 --step-seconds 0.25 --checkpoint-dir {out / 'ckpt'}",
               "resources": {"cpu": 0.25, "custom": {"slot": 1}},
               "elastic": {"nnodes": "1:2", "nproc_per_node": 1, "start_timeout_s": 5,
                           "resize_interval_s": 0, "node_check": {"enabled": False}}}],
})
launcher.submit_job(spec, str(root))

def step():
    status = launcher.job_status(spec.name)
    if status is None or status.stage.value == "STOPPED":
        raise SystemExit(f"job stopped early: {status.reason if status else 'gone'}")
    found = [a.step for a in status.roles[0].actors if a.rank >= 0 and a.step is not None]
    return max(found, default=0)

def wait_step(at):
    deadline = time.monotonic() + 180
    while step() < at:
        if time.monotonic() > deadline:
            raise SystemExit(f"no step {at}")
        time.sleep(0.1)

def wait_resized(text):
    deadline = time.monotonic() + 180
    while True:
        status = launcher.job_status(spec.name, events=500)
        if status is not None and any(e.kind == "resize_done" and text in e.message for e in status.events):
            return step()
        if time.monotonic() > deadline:
            raise SystemExit(f"no resize_done with {text!r}")
        time.sleep(0.1)

wait_step(7)
second = cluster.add_node(**node_args)  # grows to world 2 mid-run
grown_at = wait_resized("world 1 -> 2")
wait_step(grown_at + 6)  # a checkpoint taken at world 2
cluster.remove_node(second)  # and shrinks back to world 1
final = launcher.wait_job(spec)
loss = out / "ckpt" / "final_loss.txt"
print(json.dumps({"exit_code": final.exit_code, "reason": final.reason,
                  "events": [[e.kind, e.message] for e in final.events],
                  "loss": loss.read_text().strip() if loss.exists() else None,
                  "resizes": [e.message for e in final.events if e.kind == "resize_done"]}))
ray.shutdown()
cluster.shutdown()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


STEPS = 60  # of the reference LM, plain and resized


@pytest.fixture(scope="module", autouse=True)
def lm_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The plain and the resized LM runs start with the module and run beside the Cluster script
    of `results` (each its own processes, Ray, checkpoint folder and rendezvous port; their time
    is mostly paced steps and waits); the LM test waits for their ends. Output goes to files, not
    to pipes nobody reads meanwhile."""
    out = tmp_path_factory.mktemp("lm-resize")
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    (out / "resized").mkdir()
    commands = {
        "plain": ([sys.executable, "examples/elastic/train_lm.py", "--steps", str(STEPS), "--global-batch",
                   "8", "--checkpoint-dir", str(out / "reference")], env),
        "resized": ([sys.executable, "-c", LM_SCRIPT, str(ROOT), str(out / "resized"), str(STEPS)],
                    {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-erl-")}),
    }  # fmt: skip
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, (args, run_env) in commands.items():
            with (out / f"{name}.out").open("w") as stdout, (out / f"{name}.err").open("w") as stderr:
                processes[name] = subprocess.Popen(args, cwd=ROOT, env=run_env, stdout=stdout, stderr=stderr)
        yield {"out": out, "processes": processes}
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()


def test_a_resize_mid_run_keeps_the_global_batch_per_step(lm_runs: dict[str, Any]) -> None:
    """The reference LM on a fixed global batch of 8: grown to world 2 and shrunk back to 1 in
    the middle of the run, it ends on the loss of a plain run at world 1 (every step computed
    the same global batch; float sums differ only in their last bits across world sizes)."""
    out: Path = lm_runs["out"]
    processes: dict[str, subprocess.Popen[bytes]] = lm_runs["processes"]
    codes = {name: process.wait(timeout=330) for name, process in processes.items()}
    assert codes["plain"] == 0, (out / "plain.err").read_text()[-3000:]
    expected = float((out / "reference" / "final_loss.txt").read_text())
    stdout = (out / "resized.out").read_text()
    assert codes["resized"] == 0, stdout[-3000:] + (out / "resized.err").read_text()[-6000:]
    result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
    assert result["exit_code"] == 0, result["reason"]
    events = "\n".join(f"{kind}: {message}" for kind, message in result["events"])
    assert any("world 1 -> 2" in m for m in result["resizes"]), events
    assert any("world 2 -> 1" in m for m in result["resizes"]), events
    assert result["loss"] is not None
    assert float(result["loss"]) == pytest.approx(expected, rel=1e-4), (result["loss"], expected)
