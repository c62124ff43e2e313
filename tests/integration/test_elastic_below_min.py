"""Elastic roles losing nodes on a real multi-node `ray.cluster_utils.Cluster` (all on loopback;
each worker node offers one `slot`, each node of the role takes one, so a role node is a Ray
node; the PrimeMaster and the SubMaster sit on the head, which offers no slot):

- below MIN while running (nnodes 2:3 on 2 nodes, one removed for good): the role waits
  elastic.replace_timeout_s for capacity, then the job stops with a reason naming the nodes it
  has, the nodes it needs and what one node needs; the loss is counted once, on the lost node's
  rank; the surviving rank is neither restarted nor charged;
- a node that stays alive but whose rank cannot be placed again (its actor killed for good and
  its placement group's slot taken by someone else): after elastic.replace_timeout_s it counts
  as lost and the role shrinks in place to world 1, one resize with its cause, no restart of any
  kind on the surviving node, and training goes on to the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from short_tmp import short_tmp_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(200)]

ROOT = Path(__file__).resolve().parents[2]

COMMON = r"""
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
        "num_cpus": 2, "resources": {"dlu_head": 1}, "include_dashboard": False,
        "node_ip_address": "127.0.0.1",
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4}})
    ray.init(address=cluster.address, namespace=NAMESPACE)
node_args = {"num_cpus": 2, "resources": {"slot": 1}, "node_ip_address": "127.0.0.1"}
workers = [cluster.add_node(**node_args) for _ in range(2)]
workdir = str(root / "tests" / "integration")

def spec(name, nnodes, **elastic):
    (out / name).mkdir()
    return spec_from_dict({
        "name": name, "device_type": "CPU", "device_per_node": 0, "node_num": 2,
        "master": {"cpu": 0.1, "isolation_resource": "dlu_head"}, "health": {"monitor_interval_s": 0.2},
        "roles": [{"name": "trainer", "kind": "elastic", "entrypoint": "elastic_resize_workload:train",
                   "resources": {"cpu": 0.25, "custom": {"slot": 1}}, "env": {"OUT_DIR": str(out / name)},
                   "elastic": {"nnodes": nnodes, "nproc_per_node": 1, "resize_interval_s": 600,
                               "node_check": {"enabled": False}, **elastic}}],
    })

def steps(name):
    log = out / name / "steps.log"
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return [(int(r[0]), int(r[1])) for r in rows if len(r) >= 5]

def wait(what, check, timeout=90.0):
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

def actor_status(actor):
    return ray.get(ray.get_actor(actor, namespace=NAMESPACE).status.remote(), timeout=30)

def node_of(actor):
    found = actor_status(actor)["node_id"]
    return next(n for n in workers if n.node_id == found)

def summary(final):
    role = final.roles[0]
    return {
        "exit_code": final.exit_code, "reason": final.reason, "restarts": role.restart_count,
        "inplace": role.inplace_restart_count, "resizes": role.resize_count,
        "job_restarts": final.job_restart_count,
        "actors": {a.name: [a.restart_count, a.stage] for a in role.actors if a.rank >= 0},
        "events": [[e.kind, e.actor, e.message] for e in final.events],
        "first_failure": final.first_failure.actor if final.first_failure else None,
        "worlds": [s[1] for s in steps(final.name)],
    }
"""

BELOW_MIN = r"""
# nnodes 2:3 with 2 slot nodes: starts at 2 (MIN) once start_timeout_s is over
job = spec("below", "2:3", start_timeout_s=3, replace_timeout_s=5)
launcher.submit_job(job, workdir)
wait("training at world 2", steps_at("below", 2))
survivor = actor_status("below.trainer.0")["pid"]
cluster.remove_node(node_of("below.trainer.1"))  # for good: no node comes back
def waiting():
    current = launcher.job_status("below", events=500)
    return current is not None and any(e.kind == "elastic_below_min" for e in current.events)
wait("the role waiting below MIN", waiting)
same = actor_status("below.trainer.0")["pid"] == survivor  # still running, not restarted
final = launcher.wait_job(job)
print(json.dumps({**summary(final), "survivor_same_process": same}))
ray.shutdown()
cluster.shutdown()
"""

UNPLACEABLE = r"""
from ray.util.placement_group import get_placement_group, placement_group, remove_placement_group
# nnodes 1:2 on 2 slot nodes: starts at 2 at once
job = spec("unplaceable", "1:2", start_timeout_s=30, replace_timeout_s=4)
launcher.submit_job(job, workdir)
wait("training at world 2", steps_at("unplaceable", 2))
survivor = actor_status("unplaceable.trainer.0")["pid"]
# rank 1's actor gone for good and its node's slot taken by someone else: the node stays alive,
# but the rank cannot be placed again
ray.kill(ray.get_actor("unplaceable.trainer.1", namespace=NAMESPACE), no_restart=True)
remove_placement_group(get_placement_group("unplaceable.pg.trainer.node1"))
blocker = placement_group([{"slot": 1}])
ray.get(blocker.ready(), timeout=60)
at = max([s[0] for s in steps("unplaceable")], default=0)
wait("world 1 after the rank could not be placed again", steps_at("unplaceable", 1, after=at))
same = actor_status("unplaceable.trainer.0")["pid"] == survivor
alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
(out / "unplaceable" / "finish").write_text("")
final = launcher.wait_job(job)
print(json.dumps({**summary(final), "survivor_same_process": same,
                  "nodes_alive": all(w.node_id in alive for w in workers)}))
ray.shutdown()
cluster.shutdown()
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Both scripts at once, each on its own Cluster (its own Ray temp dir, nodes and jobs):
    their time is mostly the timeouts they wait out, which the other fills. Output goes to
    files, not to pipes nobody reads meanwhile."""
    scripts = {"below": BELOW_MIN, "unplaceable": UNPLACEABLE}
    outs = {name: tmp_path_factory.mktemp(name) for name in scripts}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, script in scripts.items():
            env = {**os.environ, "RAY_TMPDIR": short_tmp_dir("dlu-ebm-")}
            with (outs[name] / "stdout").open("w") as stdout, (outs[name] / "stderr").open("w") as stderr:
                processes[name] = subprocess.Popen(
                    [sys.executable, "-c", COMMON + script, str(ROOT), str(outs[name])],
                    cwd=ROOT, env=env, stdout=stdout, stderr=stderr,
                )  # fmt: skip
        codes = {name: process.wait(timeout=180) for name, process in processes.items()}
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()
    found: dict[str, dict[str, object]] = {}
    for name, code in codes.items():
        stdout, stderr = (outs[name] / "stdout").read_text(), (outs[name] / "stderr").read_text()
        assert code == 0, stdout[-3000:] + stderr[-6000:]
        result = json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])
        assert isinstance(result, dict)
        found[name] = result
    return found


def _events(result: dict[str, object]) -> list[tuple[str, str, str]]:
    """(kind, actor, message) of every event of the job."""
    events = result["events"]
    assert isinstance(events, list)
    return [(str(e[0]), str(e[1]), str(e[2])) for e in events]


def _kinds(result: dict[str, object]) -> list[str]:
    return [kind for kind, _, _ in _events(result)]


def _timeline(result: dict[str, object]) -> str:
    return "\n".join(" ".join(e) for e in _events(result))


def test_below_min_waits_for_capacity_then_stops_counting_the_lost_node_once(
    results: dict[str, dict[str, object]],
) -> None:
    result = results["below"]
    events = _timeline(result)
    assert result["exit_code"] == 1, events
    reason = str(result["reason"])
    assert "role trainer has 1 node(s) after losing node 1 (Ray marked it dead)" in reason, reason
    assert "needs at least 2 (nnodes 2:3)" in reason, reason
    assert "no node could be placed in 5s (elastic.replace_timeout_s)" in reason, reason
    assert "each node of the role needs" in reason and "slot" in reason, reason
    # counted once, on the lost node's rank; the survivor untouched
    died = [actor for kind, actor, _ in _events(result) if kind in ("died", "unavailable", "restarted")]
    assert died == ["below.trainer.1"], events
    assert result["first_failure"] == "below.trainer.1", events
    assert (result["restarts"], result["inplace"], result["job_restarts"], result["resizes"]) == (0, 0, 0, 0)
    assert result["survivor_same_process"] is True
    assert result["actors"] == {"below.trainer.0": [0, "STOPPED"], "below.trainer.1": [0, "FAILED"]}
    kinds = _kinds(result)
    assert kinds.count("elastic_below_min") == 1, events
    assert not [k for k in kinds if k.startswith(("failover", "resize"))], events


def test_a_rank_that_cannot_be_placed_again_shrinks_the_role_in_place(
    results: dict[str, dict[str, object]],
) -> None:
    result = results["unplaceable"]
    events = _timeline(result)
    assert result["exit_code"] == 0, str(result["reason"]) + "\n" + events
    assert result["nodes_alive"] is True  # the node itself was never lost
    done = [message for kind, _, message in _events(result) if kind == "resize_done"]
    assert len(done) == 1, events
    assert "resize 2 -> 1 node(s), world 2 -> 1 (node lost: node 1, unplaceable for 4s" in done[0], done
    assert (result["restarts"], result["inplace"], result["job_restarts"], result["resizes"]) == (0, 0, 0, 1)
    assert result["survivor_same_process"] is True
    assert result["actors"] == {"unplaceable.trainer.0": [0, "FINISH"]}
    worlds = result["worlds"]
    assert isinstance(worlds, list) and worlds[0] == 2 and worlds[-1] == 1, worlds
    assert not [k for k in _kinds(result) if k.startswith("failover")], events
