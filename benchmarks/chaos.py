"""Chaos campaign ("a job that runs for days"): one long run of the reference elastic job (2
nodes x 2 processes, char-level LM, 0.1 s steps, checkpoints every 5 steps) plus a simple role,
on a multi-node `ray.cluster_utils.Cluster`, hit at seeded random times by every fault kind:
training process crash (SIGKILL) and hang (SIGSTOP), ElasticWorker kill, ElasticMaster kill
(while training and during the node check), PrimeMaster kill (alone, twice in a row, during a
failover) and removal of a Ray node; then a pipeline job whose producer and consumers are
killed, every record counted at the consumers; then a role run into max_restart.

It prints faults injected, recoveries, missed, duplicated, mis-attributed and spurious
recovery events, lost steps, the final loss against a fault-free run of the same training,
leaks (actors, placement groups, training processes), pipeline records lost/duplicated and the
limit stop, and exits 1 on any problem. Usage:

    uv run python benchmarks/chaos.py --minutes 30 --faults 50 --seed 1
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import chaos_reference
from chaos_check import LossCheck, RecordCount, check
from chaos_jobs import Pipeline, Training, start_cluster, steps_for
from chaos_roles import received
from chaos_run import TrainingCampaign, run_limit_case, run_pipeline
from chaos_schedule import FaultKind, Shape, injections, parse_kinds, schedule
from figures import compile_workspace, figure

PIPELINE_SHARE = 0.1  # of the faults, when pipeline kinds are asked for
PIPELINE_SLOT_S = 15.0  # pipeline time per pipeline fault
PIPELINE_INTERVAL_S = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--minutes",
        type=float,
        default=30.0,
        help="length of the fault window of the training run (default 30)",
    )
    parser.add_argument("--faults", type=int, default=50, help="faults to inject in all (default 50)")
    parser.add_argument("--seed", default="1", help="seed of the fault plan (default 1)")
    parser.add_argument("--kinds", default="all", help="comma-separated fault kinds, or 'all' (default)")
    parser.add_argument("--step-seconds", type=float, default=0.1, help="training step length (default 0.1)")
    parser.add_argument("--heartbeat-timeout", type=float, default=5.0, help="health.heartbeat_timeout_s")
    parser.add_argument(
        "--hang-timeout", type=float, default=None, help="health.hang_timeout_s (default off)"
    )
    parser.add_argument("--no-limit-case", action="store_true", help="skip the max_restart stop case")
    parser.add_argument(
        "--reference-loss",
        default=None,
        help="the fault-free final loss for --steps steps, printed by an earlier run (skips computing it)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="train exactly this many steps (default: the run is open-ended and ends 50 steps after "
        "the last fault has been recovered, whatever the machine's step rate)",
    )
    parser.add_argument(
        "--out", default=None, help="where checkpoints, pid logs and records go (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    if args.faults < 1:
        parser.error("--faults must be >= 1")
    if args.reference_loss and args.steps is None:
        parser.error("--reference-loss needs --steps (the loss of an open-ended run is computed at its end)")
    if args.out is not None and Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        # A former run's checkpoints, stop file and probe counter would steer this one.
        parser.error(f"--out {args.out} is not empty: give a new or empty directory")
    try:
        args.kinds = parse_kinds(args.kinds)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    seed: int | str = int(args.seed) if str(args.seed).isdigit() else args.seed
    training_kinds = [k for k in args.kinds if not k.pipeline]
    pipeline_kinds = [k for k in args.kinds if k.pipeline]
    pipeline_faults = min(args.faults, max(len(pipeline_kinds), round(args.faults * PIPELINE_SHARE)))
    if not pipeline_kinds or not training_kinds:  # all the faults go to the one job there is
        pipeline_faults = args.faults if pipeline_kinds else 0
    training_faults = args.faults - pipeline_faults if training_kinds else 0
    duration_s = args.minutes * 60
    nnodes, nproc = 2, 2
    try:
        plan = (
            schedule(
                seed,
                duration_s,
                training_faults,
                training_kinds,
                Shape(ranks=nnodes * nproc, nodes=nnodes),
                start_s=10.0,
                tail_s=max(20.0, 0.05 * duration_s),
            )
            if training_faults
            else []
        )
        pipe_s = max(60.0, PIPELINE_SLOT_S * pipeline_faults + 20.0)
        pipe_plan = (
            schedule(f"{seed}-pipeline", pipe_s, pipeline_faults, pipeline_kinds, start_s=3.0, tail_s=10.0)
            if pipeline_faults
            else []
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"fault plan (seed {seed}): {injections(plan)} on the training job, {injections(pipe_plan)} on the pipeline"
    )
    for p in [*plan, *pipe_plan]:
        print(f"  +{p.at:8.1f} s  {p.kind.value:<26} target {p.target}")

    compile_workspace()
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="dlu-ch-", dir="/tmp"))
    out = Path(args.out or tempfile.mkdtemp(prefix="dlu-chaos-"))
    out.mkdir(parents=True, exist_ok=True)  # the reference writes its losses there from the start
    open_ended = args.steps is None
    # An open-ended run may take at most 4 times the step padding per step before it is cut.
    steps = args.steps or 4 * steps_for(duration_s, args.step_seconds)
    cluster = start_cluster(trainer_nodes=nnodes)
    began = time.monotonic()
    reference = None
    reference_losses = out / "reference-losses.txt"
    try:
        if plan and not args.reference_loss:
            reference = chaos_reference.start(
                steps, nnodes * nproc, losses=reference_losses if open_ended else None
            )
        common = {
            "steps": steps,
            "nnodes": nnodes,
            "nproc": nproc,
            "heartbeat_timeout_s": args.heartbeat_timeout,
            "hang_timeout_s": args.hang_timeout,
            "cluster": True,
        }
        kinds = {p.kind for p in plan}
        training = Training(
            "chaos-lm",
            out=out / "run",
            step_s=args.step_seconds,
            setup_delay_s=2.0 if FaultKind.PRIME_MASTER_IN_FAILOVER in kinds else 0.0,
            node_check_delay_s=3.0 if FaultKind.ELASTIC_MASTER_NODE_CHECK in kinds else 0.0,
            open_ended=open_ended,
            **common,
        )
        outcomes = []
        if plan:
            length = "open-ended (ends after the last fault)" if open_ended else f"{steps} steps"
            print(
                f"campaign run: {length}, steps padded to {args.step_seconds} s, {injections(plan)} faults",
                flush=True,
            )
            outcomes.append(
                TrainingCampaign(training, cluster).run(plan, finish_timeout_s=duration_s * 2 + 600)
            )
        records = None
        if pipe_plan:
            pipeline = Pipeline(
                "chaos-pipe", math.ceil(pipe_s / PIPELINE_INTERVAL_S), out / "pipe", PIPELINE_INTERVAL_S
            )
            print(f"pipeline run: {pipeline.records} records, {injections(pipe_plan)} faults", flush=True)
            outcomes.append(run_pipeline(pipeline, pipe_plan, finish_timeout_s=pipe_s * 3 + 300))
            records = RecordCount(pipeline.records, received(pipeline.out))
        limit = None
        limit_leaks: list[str] = []
        if not args.no_limit_case:
            print("limit case: max_restart=2, 3 ElasticWorker kills", flush=True)
            limit, limit_leaks = run_limit_case(
                Training(
                    "chaos-limit",
                    steps=100_000,
                    out=out / "limit",
                    nnodes=2,
                    nproc=1,
                    max_restart=2,
                    sidecar=False,
                    cluster=True,
                    heartbeat_timeout_s=args.heartbeat_timeout,
                )
            )
        expected = args.reference_loss
        last = outcomes[0].last_step if plan and open_ended else steps
        if reference is not None and last is not None:
            print("waiting for the fault-free reference loss (computed alongside)", flush=True)
            if open_ended:
                expected = chaos_reference.loss_at(reference, reference_losses, last, timeout_s=4 * 3600)
                print(f"fault-free loss after {last} steps: {expected}")
            else:
                expected = chaos_reference.result(reference, timeout_s=4 * 3600)
                print(
                    f"fault-free loss after {steps} steps: {expected} (--reference-loss {expected} skips this)"
                )
    finally:
        if reference is not None and reference.poll() is None:
            reference.kill()
        import ray

        ray.shutdown()
        cluster.shutdown()
    for outcome in outcomes:  # the whole timelines, for a post-mortem of any problem reported
        with open(out / f"{outcome.job}.events.jsonl", "w", encoding="utf-8") as dump:
            dump.writelines(event.model_dump_json() + "\n" for event in outcome.events)
    report = check(
        [f for o in outcomes for f in o.injected],
        {o.job: o.events for o in outcomes},
        {o.job: o.final for o in outcomes if o.final is not None},
        planned=injections(plan) + injections(pipe_plan),
        loss=LossCheck(expected, training.final_loss()) if plan else None,
        leaks=[*[leak for o in outcomes for leak in o.leaks], *limit_leaks],
        records=records,
        limit=limit,
        seed=seed,
        notes=[
            *[n for o in outcomes for n in o.notes],
            f"ran {(time.monotonic() - began) / 60:.1f} min; outputs (timelines: *.events.jsonl) in {out}",
        ],
    )
    print("\n".join(report.lines()), flush=True)
    a = report.accounting
    figure("chaos_faults_injected", len(a.injected), "", None, "chaos: faults injected")
    figure("chaos_recoveries", len(a.recovered), "", None, "chaos: faults with exactly one recovery event")
    figure(
        "chaos_mis_attributed", len(a.mis_attributed), "", 0, "chaos: recovery events blaming the wrong actor"
    )
    figure(
        "chaos_spurious",
        len(a.spurious) + len(a.duplicated),
        "",
        0,
        "chaos: spurious or duplicate recoveries",
    )
    figure(
        "chaos_lost_steps",
        sum(f.lost_steps for f in a.injected),
        "steps",
        None,
        "chaos: training steps redone",
    )
    figure("chaos_leaks", len(report.leaks), "", 0, "chaos: actors, groups, processes left")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
