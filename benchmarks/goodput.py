"""Projected goodput of a Llama-3-scale job: DLU's flash checkpoints vs periodic disk ones.

A 16,384-GPU job (2,048 nodes x 8) trains for 54 days and meets Llama 3's interruption rate
(419 unexpected interruptions in 54 days, about 78% of them hardware). Each interruption costs
detection + recovery + the work redone since the checkpoint it resumes from; checkpoints cost
their blocking time. The effective training time ratio is (wall time - those costs) / wall
time. Two models, fed by flags (each flag's help names its source):

- baseline: a checkpoint to shared storage every 30 minutes (half an interval redone on
  average), every interruption restarts the whole job;
- DLU: software faults restart in place (the process is forked again; the rank's state is in
  its agent's memory: at most the step in flight is redone); hardware faults lose a node, whose
  ranks are replaced (role tier) and whose shard is restored from its buddy's replica when
  replicas are on (the spec's elastic.checkpoint.replicas: 1), else from the last persisted step.

Prints both ratios and the inputs. Usage: `uv run python benchmarks/goodput.py [--flags]`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from figures import figure

LLAMA3 = "The Llama 3 Herd of Models (Meta, 2024), section 3.3.4"


@dataclass(frozen=True)
class Costs:
    per_fault_s: float
    overhead_fraction: float  # checkpoint blocking time per unit of training time


def ratio(days: float, faults: float, costs: Costs) -> float:
    wall = days * 86400.0
    lost = faults * costs.per_fault_s
    return max(0.0, (wall - lost) / wall * (1.0 - costs.overhead_fraction))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--days", type=float, default=54.0, help=f"training span in days ({LLAMA3}: 54-day snapshot)"
    )
    p.add_argument("--gpus", type=int, default=16384, help=f"GPUs in the job ({LLAMA3}: 16K H100)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (Grand Teton, 8 x H100)")
    p.add_argument(
        "--interruptions", type=float, default=419, help=f"unexpected interruptions in the span ({LLAMA3})"
    )
    p.add_argument(
        "--hardware-share", type=float, default=0.78, help=f"share of them due to hardware ({LLAMA3}: ~78%%)"
    )
    p.add_argument(
        "--step-s",
        type=float,
        default=5.9,
        help="training step time: 6 x 405e9 params x 16M tokens per step / (16,384 GPUs x 41%% MFU "
        f"x 989 TFLOPS BF16) ({LLAMA3}: 405B, 16M-token batches, 38-43%% MFU)",
    )
    p.add_argument(
        "--baseline-interval-min",
        type=float,
        default=30.0,
        help="periodic disk checkpoint interval (the issue: 30 minutes)",
    )
    p.add_argument(
        "--baseline-save-blocking-s",
        type=float,
        default=60.0,
        help="what one disk checkpoint blocks training (assumption: no public Llama 3 figure; set your own)",
    )
    p.add_argument(
        "--baseline-detect-s",
        type=float,
        default=300.0,
        help="fault detected (assumption: NCCL/watchdog timeouts of minutes)",
    )
    p.add_argument(
        "--baseline-restart-s",
        type=float,
        default=600.0,
        help="full job restart: reschedule, init, load the checkpoint (assumption; set your own)",
    )
    p.add_argument(
        "--dlu-detect-s",
        type=float,
        default=1.0,
        help="DLU fault detection: a process exit is seen at once, a lost Ray node in ~1 s "
        "(docs/performance.md: node removed -> training at the smaller world 1.65 s, incl. detection)",
    )
    p.add_argument(
        "--dlu-inplace-s",
        type=float,
        default=0.25,
        help="DLU in-place restart (docs/performance.md: crash -> all ranks training again 0.222 s, budget 0.25 s)",
    )
    p.add_argument(
        "--dlu-node-recovery-s",
        type=float,
        default=4.0,
        help="DLU role-tier recovery of a lost node's ranks (DESIGN section 9 budget: 4 s)",
    )
    p.add_argument(
        "--dlu-save-blocking-s",
        type=float,
        default=0.1,
        help="flash save blocking per step (benchmarks/flash_checkpoint.py; scale to your state per GPU)",
    )
    p.add_argument("--dlu-flash-every", type=int, default=1, help="flash save every N steps")
    p.add_argument(
        "--dlu-persist-every",
        type=int,
        default=100,
        help="persist every k-th flash step (the spec's elastic.checkpoint.persist_every)",
    )
    p.add_argument(
        "--dlu-replicas",
        type=int,
        default=1,
        choices=(0, 1),
        help="buddy replicas, the spec's elastic.checkpoint.replicas (1: a lost node's ranks restore "
        "from the buddy's copy; tests/integration/test_flash_node_loss.py)",
    )
    p.add_argument(
        "--dlu-disk-restore-s",
        type=float,
        default=60.0,
        help="restore a lost node's shard from durable storage (assumption; same order as the baseline load)",
    )
    return p.parse_args()


def main() -> None:
    a = parse()
    hw = a.interruptions * a.hardware_share
    sw = a.interruptions - hw
    interval = a.baseline_interval_min * 60.0
    baseline = Costs(
        per_fault_s=a.baseline_detect_s + a.baseline_restart_s + interval / 2.0,
        overhead_fraction=a.baseline_save_blocking_s / interval,
    )
    flash_lost = a.step_s * a.dlu_flash_every / 2.0 + a.step_s  # half a save period, plus the step in flight
    if a.dlu_replicas:
        node_lost, node_load = flash_lost, 0.0
    else:
        node_lost, node_load = a.step_s * a.dlu_flash_every * a.dlu_persist_every / 2.0, a.dlu_disk_restore_s
    dlu_per_fault = (
        sw * (a.dlu_detect_s + a.dlu_inplace_s + flash_lost)
        + hw * (a.dlu_detect_s + a.dlu_node_recovery_s + node_load + node_lost)
    ) / a.interruptions
    dlu = Costs(
        per_fault_s=dlu_per_fault, overhead_fraction=a.dlu_save_blocking_s / (a.step_s * a.dlu_flash_every)
    )
    base_ratio = ratio(a.days, a.interruptions, baseline)
    dlu_ratio = ratio(a.days, a.interruptions, dlu)
    print(
        f"job: {a.gpus} GPUs ({a.gpus // a.gpus_per_node} nodes x {a.gpus_per_node}), {a.days:g} days, "
        f"{a.interruptions:g} interruptions ({hw:.0f} hardware, {sw:.0f} software), step {a.step_s} s"
    )
    print(
        f"baseline (disk every {a.baseline_interval_min:g} min, full restart): {baseline.per_fault_s:.0f} s per fault, "
        f"checkpoint overhead {baseline.overhead_fraction:.2%}, effective training time ratio {base_ratio:.4f}"
    )
    print(
        f"DLU (flash every {a.dlu_flash_every} step(s), replicas {a.dlu_replicas}, persist every {a.dlu_persist_every}): "
        f"{dlu.per_fault_s:.0f} s per fault, save overhead {dlu.overhead_fraction:.2%}, "
        f"effective training time ratio {dlu_ratio:.4f}"
    )
    figure(
        "goodput_baseline",
        base_ratio,
        "ratio",
        None,
        "effective training time ratio, 30-min disk checkpoints",
    )
    figure("goodput_dlu", dlu_ratio, "ratio", None, "effective training time ratio, DLU flash checkpoints")


if __name__ == "__main__":
    main()
