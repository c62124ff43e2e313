"""GPU smoke test through the real `dlu run` path: 2 ranks on NCCL, one crash, one in-place restart.

The job (device_type GPU, one elastic role of 1 node x 2 processes, one GPU each, comm backend
nccl) runs `gpu_smoke_train.py`: an NCCL all-reduce every step, rank 1 raising once at step 3.
`dlu run` starts an embedded Ray (which finds the GPUs), the node check runs its probe on NCCL
(the node's leader on its GPU), the ranks are forked from the node's zygote, and DLU restarts
them in place after the crash. The run passes when:

- `dlu run` exits 0 and the job record says STOPPED, exit 0, exactly one in-place restart;
- the node check passed and NCCL built a one-rank communicator for it (NCCL's INIT log);
- every rank of both attempts began with its own CUDA_VISIBLE_DEVICES (set by Ray), LOCAL_RANK
  and DLU_DEVICE, saw exactly one GPU, not the other rank's, and was no bad fork (the zygote
  never touched CUDA);
- both ranks of the second attempt finished every all-reduce with the right sum on NCCL.

Where fewer than 2 GPUs are visible (`nvidia-smi -L`, else /proc/driver/nvidia/gpus, narrowed
by CUDA_VISIBLE_DEVICES; nothing here calls CUDA) it prints `SKIPPED: <why>` and exits 0: NCCL
refuses two ranks on one GPU. First, with one GPU or more, `gpu_flash_smoke.py` (flash
checkpoint of CUDA tensors: save, crash, restore, same values). Prints PASSED or FAILED with the reasons, then FIGURE lines.
Usage: `uv run python benchmarks/gpu_smoke.py`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from figures import figure
from job_e2e import Mode, Run, end_leftovers, run_cli, stop_zygotes

ROOT = Path(__file__).resolve().parents[1]
TRAIN = "benchmarks/gpu_smoke_train.py"
NAME = "gpu-smoke"
RANKS = 2
CRASH_RANK, CRASH_AT, STEPS = 1, 3, 6
# NCCL's INIT log line for a ready communicator: "comm 0x.. rank R nranks N cudaDev D ... - Init COMPLETE"
NCCL_READY = re.compile(r"rank (\d+) nranks (\d+) .*Init COMPLETE")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str  # "GPU-..." as nvidia-smi prints it; "" when unknown


def _node_gpus() -> list[Gpu]:
    """The node's NVIDIA GPUs, from `nvidia-smi -L` or the driver's /proc entries."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        listed = None
    if listed is not None and listed.returncode == 0:
        found = re.findall(r"^GPU (\d+): (.*?) \(UUID: (\S+)\)", listed.stdout, re.MULTILINE)
        return [Gpu(int(index), name, uuid) for index, name, uuid in found]
    root = Path("/proc/driver/nvidia/gpus")
    if not root.is_dir():
        return []
    gpus: list[Gpu] = []
    for index, entry in enumerate(sorted(root.iterdir())):
        info = (entry / "information").read_text(errors="replace") if (entry / "information").exists() else ""
        model = re.search(r"^Model:\s*(.+)$", info, re.MULTILINE)
        uuid = re.search(r"^GPU UUID:\s*(\S+)$", info, re.MULTILINE)
        gpus.append(Gpu(index, model.group(1) if model else entry.name, uuid.group(1) if uuid else ""))
    return gpus


def visible_gpus(environ: dict[str, str] | None = None) -> list[Gpu]:
    """The GPUs a process started here may use: the node's, narrowed by CUDA_VISIBLE_DEVICES
    (indices or UUID prefixes, read as CUDA does: up to the first entry it cannot use)."""
    gpus = _node_gpus()
    setting = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if setting is None:
        return gpus
    chosen: list[Gpu] = []
    for entry in (part.strip() for part in setting.split(",")):
        match = (
            [g for g in gpus if g.index == int(entry)]
            if entry.isdigit()
            else [g for g in gpus if g.uuid and entry.startswith("GPU-") and g.uuid.startswith(entry)]
        )
        if not match or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def skip_reason(gpus: list[Gpu]) -> str | None:
    """Why the smoke cannot run here, or None when it can."""
    if len(gpus) >= RANKS:
        return None
    where = "nvidia-smi -L / /proc/driver/nvidia/gpus"
    narrowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if narrowed is not None:
        where += f", CUDA_VISIBLE_DEVICES={narrowed!r}"
    return (
        f"the GPU smoke needs {RANKS} NVIDIA GPUs ({RANKS} NCCL ranks, one GPU each: NCCL refuses two "
        f"ranks on one GPU); {len(gpus)} visible ({where})"
    )


def write_spec(folder: Path, gpus: int) -> Path:
    from dlu_api.spec import spec_from_dict

    data: dict[str, Any] = {
        "name": NAME,
        "device_type": "GPU",
        "device_per_node": gpus,
        "node_num": 1,
        "roles": [
            {
                "name": "trainer",
                "kind": "elastic",
                "entrypoint": f"{TRAIN} --out {folder / 'out'} --steps {STEPS} "
                f"--crash-at-step {CRASH_AT} --crash-rank {CRASH_RANK}",
                "resources": {"cpu": 0.5, "gpu": 1},
                "env": {
                    "NCCL_DEBUG": "INFO",
                    "NCCL_DEBUG_SUBSYS": "INIT",
                    "NCCL_DEBUG_FILE": str(folder / "nccl" / "nccl.%h.%p.log"),
                },
                "elastic": {
                    "nnodes": 1,
                    "nproc_per_node": RANKS,
                    "comm_backend": "nccl",
                    "node_check": {"matmul_size": 512, "allreduce_mb": 4, "timeout_s": 120},
                },
            }
        ],
    }
    spec_from_dict(data)  # a mistake here fails before Ray starts
    path = folder / "job.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _bare(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-")


def nccl_communicators(folder: Path) -> list[int]:
    """The size of every NCCL communicator that finished its init, from NCCL's INIT log files."""
    sizes: list[int] = []
    for log in sorted((folder / "nccl").glob("nccl.*.log")):
        sizes += [int(m.group(2)) for m in NCCL_READY.finditer(log.read_text(errors="replace"))]
    return sizes


def check(run: Run, folder: Path, gpus: list[Gpu]) -> list[str]:
    """Every way the run fell short (empty: it passed)."""
    tail = "\n".join(run.output[-40:])
    if run.code != 0:
        return [f"dlu run exited {run.code}:\n{tail}"]
    problems: list[str] = []
    job = _read(folder / "home" / "jobs" / f"{NAME}.json")
    if job is None:
        return [f"no job record in {folder / 'home'}:\n{tail}"]
    status = job["status"]
    restarts = sum(role.get("inplace_restart_count", 0) for role in status["roles"])
    if (status["stage"], status["exit_code"], restarts) != ("STOPPED", 0, 1):
        problems.append(
            f"job record: {status['stage']}, exit {status['exit_code']}, {restarts} in-place restart(s) "
            "(want STOPPED, 0, 1)"
        )
    kinds = [event["kind"] for event in status["events"]]
    if "node_check" not in kinds or "faulty_node" in kinds:
        problems.append(f"node check did not pass: events {kinds}")
    sizes = nccl_communicators(folder)
    if 1 not in sizes:
        problems.append(f"no one-rank NCCL communicator (the node-check probe's); communicators: {sizes}")
    if sizes.count(RANKS) < 2 * RANKS:
        problems.append(f"want {2 * RANKS} NCCL communicators of {RANKS} ranks (two attempts); got {sizes}")
    out = folder / "out"
    if not (out / "crashed").exists():
        problems.append("the injected crash did not happen")
    known = {_bare(g.uuid) for g in gpus if g.uuid}
    for attempt in range(2):
        starts = [_read(out / f"start-rank{rank}-attempt{attempt}.json") for rank in range(RANKS)]
        for rank, start in enumerate(starts):
            problems += _start_problems(rank, attempt, start, known)
        uuids = [s["gpu_uuid"] for s in starts if s is not None]
        if len(set(uuids)) != len(uuids):
            problems.append(f"attempt {attempt}: two ranks on one GPU: {uuids}")
    for rank in range(RANKS):
        done = _read(out / f"done-rank{rank}-attempt1.json")
        if done is None:
            problems.append(f"rank {rank} did not finish its second attempt")
        elif done["backend"] != "nccl" or done["world_size"] != RANKS or len(done["sums"]) != STEPS:
            problems.append(f"rank {rank}: {done}")
    return problems


def _start_problems(rank: int, attempt: int, start: dict[str, Any] | None, known: set[str]) -> list[str]:
    where = f"rank {rank} attempt {attempt}"
    if start is None:
        return [f"{where}: no start record"]
    env = start["env"]
    found: list[str] = []
    if start["bad_fork_at_start"] or start["cuda_initialized_at_start"]:
        found.append(f"{where}: CUDA was touched before the training process ran: {start}")
    if not env.get("CUDA_VISIBLE_DEVICES") or start["device_count"] != 1:
        found.append(f"{where}: Ray's allocation should show exactly one GPU: {start}")
    if env.get("LOCAL_RANK") != str(rank) or env.get("DLU_DEVICE") != "cuda:0" or start["device"] != "cuda:0":
        found.append(f"{where}: wrong LOCAL_RANK or device: {start}")
    if known and _bare(start["gpu_uuid"]) not in known:
        found.append(f"{where}: GPU {start['gpu_uuid']} is not one nvidia-smi lists: {sorted(known)}")
    return found


def main() -> int:
    import gpu_flash_smoke  # flash checkpoints of CUDA tensors: one GPU is enough

    if gpu_flash_smoke.skip_reason() is None and gpu_flash_smoke.main() != 0:
        return 1
    gpus = visible_gpus()
    reason = skip_reason(gpus)
    if reason is not None:
        print(f"SKIPPED: {reason}", flush=True)
        return 0
    print(f"GPUs: {', '.join(f'{g.index} {g.name}' for g in gpus)}", flush=True)
    folder = Path(tempfile.mkdtemp(prefix="dlu-gpu-", dir="/tmp"))
    for sub in ("z", "nccl", "out"):
        (folder / sub).mkdir()
    spec = write_spec(folder, len(gpus))
    try:
        run = run_cli(spec, folder, folder / "z", Mode(verbose=True))  # as before: Ray output too
    finally:
        stop_zygotes(folder / "z")
        end_leftovers(folder)
    problems = check(run, folder, gpus)
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems), flush=True)
        print(f"(run folder kept: {folder})", flush=True)
        return 1
    record = _read(folder / "home" / "jobs" / f"{NAME}.json") or {}
    in_place = [
        e["duration_s"]
        for e in record.get("status", {}).get("events", [])
        if e["kind"] == "failover_done" and e.get("tier") == "in_place" and e.get("duration_s") is not None
    ]
    shutil.rmtree(folder, ignore_errors=True)
    print(
        f"PASSED: {RANKS} NCCL ranks on {RANKS} GPUs, node check on NCCL, crash at step {CRASH_AT} "
        f"restarted in place once; dlu run {run.seconds:.1f} s",
        flush=True,
    )
    figure(
        "gpu_smoke_dlu_run",
        run.seconds,
        "s",
        label="GPU smoke (2 NCCL ranks, one crash): dlu run start to exit",
    )
    if in_place:
        figure(
            "gpu_smoke_in_place_restart",
            in_place[0],
            "s",
            label="GPU smoke: crash -> both ranks training again",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
