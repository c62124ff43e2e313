"""Training processes forked from a forkserver with torch preloaded (dlu_elastic.worker.process).

Real processes, real gloo on loopback; the entrypoints are in elastic_workloads.py and
elastic_script.py next to this file.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proc_checks import gone

from dlu_elastic.worker.process import (
    ProcessEvent,
    ProcessEventKind,
    ProcessSpec,
    TrainingLauncher,
    TrainingProcess,
)

HERE = Path(__file__).resolve().parent
WORKDIR = str(HERE)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_env(
    rank: int, world: int, port: int, out_dir: Path, *, local_world: int | None = None, **extra: str
) -> dict[str, str]:
    """torchrun's environment for `rank` of `world` on nodes of `local_world` processes."""
    local = local_world or world
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank % local),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local),
        "GROUP_RANK": str(rank // local),
        "NODE_RANK": str(rank // local),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "test-run",
        "OUT_DIR": str(out_dir),
    }
    env.update(extra)
    return env


def wait_all(procs: list[TrainingProcess], timeout: float = 60.0) -> list[int | None]:
    deadline = time.monotonic() + timeout
    return [p.wait(max(0.0, deadline - time.monotonic())) for p in procs]


def kinds(events: list[ProcessEvent]) -> list[ProcessEventKind]:
    return [e.kind for e in events]


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def wait_until(what: str, condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `condition` until it holds; fail naming `what` after a generous deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def launcher() -> Iterator[TrainingLauncher]:
    launcher = TrainingLauncher()
    launcher.warm_up()
    yield launcher
    launcher.shutdown(grace_s=1.0)


@pytest.mark.timeout(180)
def test_warm_up_preloads_torch(launcher: TrainingLauncher) -> None:
    assert launcher.preloaded is True
    assert launcher.warm_up_s is not None
    assert launcher.warm_up() == launcher.warm_up_s  # idempotent
    assert {"torch", "torch.distributed", "dlu_elastic.worker.process"} <= set(launcher.preload)


@pytest.mark.timeout(120)
def test_function_entrypoint_gloo_allreduce_4_processes(launcher: TrainingLauncher, tmp_path: Path) -> None:
    port = free_port()
    config = {"lr": 0.1, "name": "tiny"}
    procs = [
        launcher.start(
            ProcessSpec(
                "elastic_workloads:allreduce_sum",
                env=torchrun_env(
                    rank,
                    4,
                    port,
                    tmp_path,
                    local_world=2,
                    DLU_JOB="job-a",
                    DLU_ROLE="trainer",
                    DLU_ACTOR=f"job-a-trainer-{rank}",
                    DLU_CONFIG_JSON=json.dumps(config),
                ),
                workdir=WORKDIR,
            )
        )
        for rank in range(4)
    ]
    assert wait_all(procs) == [0, 0, 0, 0], [p.last_failure for p in procs]
    for rank, proc in enumerate(procs):
        result = read_json(tmp_path / f"allreduce-{rank}.json")
        assert result["sum"] == 1 + 2 + 3 + 4
        assert result["world_size"] == 4
        assert result["backend"] == "gloo"
        assert result["cwd"] == WORKDIR
        assert result["env"]["LOCAL_RANK"] == str(rank % 2)
        assert result["env"]["TORCHELASTIC_RUN_ID"] == "test-run"
        assert result["env"]["DLU_DEVICE"] == "cpu"
        assert result["worker"] == {
            "job": "job-a",
            "role": "trainer",
            "rank": rank,
            "world_size": 4,
            "local_rank": rank % 2,
            "local_world_size": 2,
            "node_rank": rank // 2,
            "actor_name": f"job-a-trainer-{rank}",
            "config": config,
            "device": "cpu",
        }
        events = proc.events()
        assert kinds(events) == [ProcessEventKind.STARTED, ProcessEventKind.HEARTBEAT]
        assert "torch preloaded: True" in (events[0].message or "")
        assert events[1].step == 1 and events[1].metric == 10.0
        assert proc.events() == []  # drained


@pytest.mark.timeout(120)
def test_two_launchers_form_one_group(launcher: TrainingLauncher, tmp_path: Path) -> None:
    """Two "nodes" (launchers) with two processes each, as two ElasticWorker actors would."""
    second = TrainingLauncher()
    second.warm_up()
    port = free_port()
    procs: list[TrainingProcess] = []
    for node, owner in enumerate((launcher, second)):
        for local in range(2):
            rank = node * 2 + local
            env = torchrun_env(rank, 4, port, tmp_path, local_world=2)
            procs.append(
                owner.start(ProcessSpec("elastic_workloads.allreduce_sum", env=env, workdir=WORKDIR))
            )
    assert wait_all(procs) == [0, 0, 0, 0], [p.last_failure for p in procs]
    assert [read_json(tmp_path / f"allreduce-{r}.json")["sum"] for r in range(4)] == [10.0] * 4
    assert [read_json(tmp_path / f"allreduce-{r}.json")["worker"]["node_rank"] for r in range(4)] == [
        0,
        0,
        1,
        1,
    ]
    second.shutdown()


@pytest.mark.timeout(60)
def test_exception_exits_1_with_traceback_in_events(launcher: TrainingLauncher, tmp_path: Path) -> None:
    proc = launcher.start(
        ProcessSpec(
            "elastic_workloads:raise_error",
            env={"OUT_DIR": str(tmp_path)},
            workdir=WORKDIR,
            setup_process_group=False,
        )
    )
    assert proc.wait(30) == 1
    failures = [e for e in proc.events() if e.kind is ProcessEventKind.FAILURE]
    assert len(failures) == 1
    text = failures[0].message or ""
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: boom from elastic_workloads" in text
    assert "in raise_error" in text
    assert proc.last_failure == text


@pytest.mark.timeout(60)
def test_a_failure_is_known_before_the_exit_hooks_end(launcher: TrainingLauncher, tmp_path: Path) -> None:
    """The FAILURE event announces the exit code while the process still runs its exit hooks
    (here a 60 s one): a restart need not wait for a slow teardown; the exit itself comes later."""
    proc = launcher.start(
        ProcessSpec(
            "elastic_workloads:raise_then_linger_at_exit",
            env={"OUT_DIR": str(tmp_path)},
            workdir=WORKDIR,
            setup_process_group=False,
        )
    )
    assert proc.activity.wait(30)  # the failure woke its watcher
    wait_until("the failure to be announced", lambda: proc.ending_code() is not None)
    assert proc.ending_code() == 1
    assert proc.poll() is None  # still in its exit hook
    assert "boom before a slow teardown" in (proc.last_failure or "")
    assert proc.terminate(1.0) is not None
    assert proc.poll() is not None


@pytest.mark.timeout(60)
def test_exit_codes_and_import_errors(launcher: TrainingLauncher, tmp_path: Path) -> None:
    env = {"OUT_DIR": str(tmp_path), "EXIT_CODE": "7"}
    exiting = launcher.start(
        ProcessSpec("elastic_workloads:exit_with_code", env=env, workdir=WORKDIR, setup_process_group=False)
    )
    missing = launcher.start(
        ProcessSpec("no_such_module_xyz:main", env=env, workdir=WORKDIR, setup_process_group=False)
    )
    assert exiting.wait(30) == 7
    assert "exited with code 7" in (exiting.last_failure or "")
    assert missing.wait(30) == 1
    assert "no_such_module_xyz" in (missing.last_failure or "")

    # Mistakes found before forking.
    with pytest.raises(ValueError, match="RANK"):
        launcher.start(ProcessSpec("elastic_workloads:allreduce_sum", env={}, workdir=WORKDIR))
    with pytest.raises(FileNotFoundError):
        launcher.start(ProcessSpec("missing_script.py --x 1", workdir=WORKDIR))
    with pytest.raises(ValueError):
        launcher.start(ProcessSpec("not an entrypoint", workdir=WORKDIR))
    with pytest.raises(ValueError, match="backend"):
        ProcessSpec("elastic_workloads:allreduce_sum", backend="mpi")


@pytest.mark.timeout(60)
def test_script_entrypoint_gets_argv(launcher: TrainingLauncher, tmp_path: Path) -> None:
    proc = launcher.start(
        ProcessSpec(
            "elastic_script.py --x 1 --name 'a b'",
            env={"OUT_DIR": str(tmp_path), "RANK": "0"},
            workdir=WORKDIR,
        )
    )
    assert proc.wait(30) == 0, proc.last_failure
    record = read_json(tmp_path / "script-0.json")
    assert record["argv"] == [str(HERE / "elastic_script.py"), "--x", "1", "--name", "a b"]
    assert record["name"] == "__main__"
    assert record["cwd"] == WORKDIR


@pytest.mark.timeout(60)
def test_module_entrypoint_gets_argv(launcher: TrainingLauncher, tmp_path: Path) -> None:
    proc = launcher.start(
        ProcessSpec(
            "-m elastic_workloads --y 2", env={"OUT_DIR": str(tmp_path), "RANK": "0"}, workdir=WORKDIR
        )
    )
    assert proc.wait(30) == 0, proc.last_failure
    record = read_json(tmp_path / "module-argv.json")
    assert record["argv"] == [str(HERE / "elastic_workloads.py"), "--y", "2"]
    assert record["name"] == "__main__"


@pytest.mark.timeout(120)
def test_torchrun_command_runs_its_script_on_each_rank(launcher: TrainingLauncher, tmp_path: Path) -> None:
    """An unmodified torchrun script sets up its own process group from torchrun's environment."""
    port = free_port()
    command = "torchrun --nnodes=1 --nproc-per-node=2 elastic_script.py --x 1"
    procs = [
        launcher.start(ProcessSpec(command, env=torchrun_env(rank, 2, port, tmp_path), workdir=WORKDIR))
        for rank in range(2)
    ]
    assert wait_all(procs) == [0, 0], [p.last_failure for p in procs]
    for rank in range(2):
        record = read_json(tmp_path / f"script-{rank}.json")
        assert record["argv"] == [str(HERE / "elastic_script.py"), "--x", "1"]
        assert record["sum"] == 3.0
        assert record["world_size"] == 2


@pytest.mark.timeout(60)
def test_heartbeats_arrive_in_order(launcher: TrainingLauncher, tmp_path: Path) -> None:
    proc = launcher.start(
        ProcessSpec(
            "elastic_workloads:heartbeats",
            env={"OUT_DIR": str(tmp_path), "STEPS": "200"},
            workdir=WORKDIR,
            setup_process_group=False,
        )
    )
    assert proc.wait(30) == 0, proc.last_failure
    events = proc.events()
    beats = [e for e in events if e.kind is ProcessEventKind.HEARTBEAT]
    assert [e.step for e in beats] == list(range(1, 201))
    assert [e.metric for e in beats] == [s * 0.5 for s in range(1, 201)]
    times = [e.time for e in beats]
    assert times == sorted(times)
    assert events[0].kind is ProcessEventKind.STARTED
    assert events[-1].kind is ProcessEventKind.ERROR_REPORT
    assert "loss is NaN" in (events[-1].message or "")


def _wait_for_heartbeat(proc: TrainingProcess, timeout: float = 30.0) -> list[ProcessEvent]:
    deadline = time.monotonic() + timeout
    seen: list[ProcessEvent] = []
    while time.monotonic() < deadline:
        seen += proc.events()
        if any(e.kind is ProcessEventKind.HEARTBEAT for e in seen):
            return seen
        assert proc.poll() is None, proc.last_failure
        time.sleep(0.02)
    raise AssertionError(f"no heartbeat within {timeout} s: {seen}")


def _hanging(launcher: TrainingLauncher, out_dir: Path) -> tuple[TrainingProcess, int]:
    """A process that runs forever with a subprocess of its own, once it beat; (it, the subprocess's pid)."""
    proc = launcher.start(
        ProcessSpec(
            "elastic_workloads:hang",
            env={"OUT_DIR": str(out_dir)},
            workdir=WORKDIR,
            setup_process_group=False,
        )
    )
    _wait_for_heartbeat(proc)
    return proc, int(read_json(out_dir / "hang.json")["child"])


@pytest.mark.timeout(60)
def test_terminate_hung_process_and_its_children(launcher: TrainingLauncher, tmp_path: Path) -> None:
    proc, grandchild = _hanging(launcher, tmp_path)
    assert proc.poll() is None
    # -SIGTERM, not -SIGKILL: it ended on the SIGTERM, before any escalation
    assert proc.terminate(grace_s=30.0) == -signal.SIGTERM
    wait_until("the training process's own subprocess to end", lambda: gone(grandchild))


@pytest.mark.timeout(60)
def test_end_returns_once_the_process_is_gone_and_kills_its_group(
    launcher: TrainingLauncher, tmp_path: Path
) -> None:
    """What a restart waits for before it forks the rank again: the old process gone (a zombie
    at least: its memory is freed), its subprocesses killed; the exit code follows."""
    proc, grandchild = _hanging(launcher, tmp_path)
    proc.end(grace_s=30.0)
    assert gone(proc.pid)  # a zombie or reaped, right when end() returns
    assert proc.wait(10) == -signal.SIGTERM
    wait_until("the training process's own subprocess to end", lambda: gone(grandchild))


@pytest.mark.timeout(60)
def test_terminate_escalates_to_kill_after_grace(launcher: TrainingLauncher, tmp_path: Path) -> None:
    proc = launcher.start(
        ProcessSpec(
            "elastic_workloads:hang_ignoring_sigterm",
            env={"OUT_DIR": str(tmp_path)},
            workdir=WORKDIR,
            setup_process_group=False,
        )
    )
    _wait_for_heartbeat(proc)
    proc.request_stop()  # the SIGTERM that terminate() sends first
    wait_until("the process to survive a SIGTERM", (tmp_path / "sigterm.json").exists)
    assert proc.poll() is None
    assert proc.terminate(grace_s=1.0) == -signal.SIGKILL  # so terminate() had to escalate
    assert proc.poll() == -signal.SIGKILL
    assert proc.terminate() == -signal.SIGKILL  # idempotent


@pytest.mark.timeout(120)
def test_training_process_dies_with_its_launcher(tmp_path: Path) -> None:
    """A killed actor leaves no training process (nor its subprocesses) behind."""
    driver = f"""
import os, signal, time
from dlu_elastic.worker.process import ProcessSpec, TrainingLauncher
launcher = TrainingLauncher()
spec = ProcessSpec("elastic_workloads:hang", env={{"OUT_DIR": {str(tmp_path)!r}}}, workdir={WORKDIR!r},
                   setup_process_group=False)
proc = launcher.start(spec)
deadline = time.time() + 60
while not os.path.exists({str(tmp_path / "hang.json")!r}) and time.time() < deadline:
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""
    result = subprocess.run([sys.executable, "-c", driver], capture_output=True, timeout=100)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()[-2000:]
    record = read_json(tmp_path / "hang.json")
    wait_until("the training process to die with its launcher", lambda: gone(record["pid"]))
    wait_until("the training process's subprocess to die with its launcher", lambda: gone(record["child"]))


def _allreduce_round(launcher: TrainingLauncher, tmp_path: Path) -> list[TrainingProcess]:
    """Four ranks that set up gloo and allreduce once, as one round of training would."""
    port = free_port()
    procs = [
        launcher.start(
            ProcessSpec(
                "elastic_workloads:allreduce_only", env=torchrun_env(r, 4, port, tmp_path), workdir=WORKDIR
            )
        )
        for r in range(4)
    ]
    assert wait_all(procs) == [0, 0, 0, 0], [p.last_failure for p in procs]
    return procs


@pytest.mark.timeout(180)
def test_a_restart_forks_fresh_ranks_with_torch_already_loaded(
    launcher: TrainingLauncher, tmp_path: Path
) -> None:
    """What makes an in-place restart cheap: the next round's ranks are new forks of the warm
    zygote, torch already imported (benchmarks/inplace_restart.py measures the saving)."""
    rounds = [_allreduce_round(launcher, tmp_path) for _ in range(3)]
    pids = [p.pid for procs in rounds for p in procs]
    assert len(set(pids)) == len(pids)
    for procs in rounds:
        for proc in procs:
            events = proc.events()
            assert kinds(events) == [ProcessEventKind.STARTED, ProcessEventKind.HEARTBEAT], events
            assert "torch preloaded: True" in (events[0].message or "")
            assert events[1].metric == 4.0  # the allreduce of four ones


@pytest.mark.timeout(120)
def test_agent_store_serves_ranks_started_in_any_order(launcher: TrainingLauncher, tmp_path: Path) -> None:
    """The agent's TCPStore (dlu_elastic.worker.store) is up before any rank: rank 0 starting
    last must not matter, and every rank is a client of it."""
    from dlu_elastic.worker import store

    port = free_port()
    hosted = launcher.start(
        ProcessSpec(
            store.ENTRYPOINT,
            env={store.HOST_ENV: "127.0.0.1", store.PORT_ENV: str(port)},
            setup_process_group=False,
        )
    )
    _wait_for_heartbeat(hosted)
    procs = [
        launcher.start(
            ProcessSpec(
                "elastic_workloads:allreduce_sum",
                env={**torchrun_env(rank, 4, port, tmp_path), store.AGENT_STORE_ENV: "True"},
                workdir=WORKDIR,
            )
        )
        for rank in (3, 2, 1, 0)
    ]
    assert wait_all(procs) == [0, 0, 0, 0], [p.last_failure for p in procs]
    assert all(read_json(tmp_path / f"allreduce-{rank}.json")["sum"] == 10 for rank in range(4))
    assert hosted.poll() is None, "the store must outlive the round's processes"
    assert hosted.terminate(1.0) == -signal.SIGTERM


@pytest.mark.timeout(120)
def test_ranks_started_before_their_store_are_served_once_it_takes_the_listening_socket(
    launcher: TrainingLauncher, tmp_path: Path
) -> None:
    """The agent's listening socket (store.listen) is handed to the store it forks beside its
    rank: ranks that connect before the store serves are queued by the kernel, not refused."""
    from dlu_elastic.worker import store

    listener = store.listen("127.0.0.1")
    port = int(listener.getsockname()[1])
    try:
        procs = [
            launcher.start(
                ProcessSpec(
                    "elastic_workloads:allreduce_sum",
                    env={**torchrun_env(rank, 4, port, tmp_path), store.AGENT_STORE_ENV: "True"},
                    workdir=WORKDIR,
                )
            )
            for rank in (3, 2, 1, 0)
        ]
        started: set[int] = set()

        def all_started() -> bool:
            started.update(
                p.pid for p in procs if any(e.kind is ProcessEventKind.STARTED for e in p.events())
            )
            return len(started) == len(procs)

        wait_until("every rank to be started", all_started)
        # Nothing serves the port yet: the ranks' connections wait in the kernel's queue.
        wait_until("the ranks' connections to be queued", lambda: queued_connections(port) >= 1)
        assert all(p.poll() is None for p in procs), [p.last_failure for p in procs]
        hosted = launcher.start(
            ProcessSpec(
                store.ENTRYPOINT,
                env={store.HOST_ENV: "127.0.0.1", store.PORT_ENV: str(port)},
                setup_process_group=False,
                pass_fds=(listener.fileno(),),
            )
        )
    finally:
        listener.close()  # the store has its own copy
    assert wait_all(procs) == [0, 0, 0, 0], [p.last_failure for p in procs]
    assert all(read_json(tmp_path / f"allreduce-{rank}.json")["sum"] == 10 for rank in range(4))
    assert hosted.poll() is None
    assert hosted.terminate(1.0) == -signal.SIGTERM


def queued_connections(port: int) -> int:
    """Connections waiting to be accepted on the IPv4 socket listening on `port` (its rx_queue
    in /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            return int(queues.split(":")[1], 16)
    return 0


def test_listen_names_the_host_it_cannot_bind() -> None:
    from dlu_elastic.worker import store

    with pytest.raises(OSError):
        store.listen("192.0.2.1")  # TEST-NET-1: no address of this machine
