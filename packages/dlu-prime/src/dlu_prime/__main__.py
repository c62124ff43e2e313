"""`python -m dlu_prime launch|stop|status|debug|scale`: DLU's commands on a Ray cluster.

A remote driver (dlu-api alone, Ray Jobs REST API) submits `launch` as a Ray job and reads its
log, so besides human-readable lines it prints the wire lines of `dlu_api.client.wire`: the
job's events and status as they change, and the answers to the requests the driver leaves in
its mailbox (`dlu_prime.mailbox`). The other commands do the same things from a shell on the
cluster (or `ray job submit -- python -m dlu_prime status JOB`); the driver does not use them.
Exit codes: the job's own for `launch`; 0 ok; 1 no such job; 2 refused; 3 version mismatch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from dlu_api.cli.render import ProgressPrinter, status_text
from dlu_api.client import wire
from dlu_api.errors import DLUError, JobNameTakenError, SpecError
from dlu_api.spec.io import load_spec, spec_from_dict
from dlu_api.status import JobStatus

logger = logging.getLogger(__name__)

EXIT_NOT_FOUND = 1
EXIT_REFUSED = 2
EXIT_VERSION = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dlu_prime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch", help="run a job on the connected Ray cluster and wait for it")
    source = launch.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", help="path of a YAML or JSON spec file")
    source.add_argument("--spec-json", help="the spec as one JSON string")
    launch.add_argument("--workdir", default=None, help="directory user code is imported from (default: cwd)")
    launch.add_argument(
        "--resume", action="store_true", help="restart a stored job from its state store (new cluster)"
    )
    stop = sub.add_parser("stop", help="stop a running job (or remove what is left of it)")
    stop.add_argument("job")
    status = sub.add_parser("status", help="a job's status from its PrimeMaster, else its state store")
    status.add_argument("job")
    status.add_argument("--json", action="store_true", help="print the status as a DLU-STATUS wire line")
    status.add_argument(
        "--store-json",
        help='the job\'s state store as {"name": ..., "options": {...}}, read when no PrimeMaster runs',
    )
    debug = sub.add_parser(
        "debug", help="mark_unhealthy | get_step | set_step on a role, through the PrimeMaster"
    )
    debug.add_argument("job")
    debug.add_argument("action", choices=["mark_unhealthy", "get_step", "set_step"])
    debug.add_argument("role")
    debug.add_argument("--rank", type=int, default=None)
    debug.add_argument("--step", type=int, default=None)
    scale = sub.add_parser("scale", help="set a simple role's actor count, through the PrimeMaster")
    scale.add_argument("job")
    scale.add_argument("role")
    scale.add_argument("size", type=int)
    for cmd in (launch, stop, status, debug, scale):
        cmd.add_argument("--address", default="auto", help="Ray address (default: auto)")
        cmd.add_argument(
            wire.API_VERSION_FLAG,
            dest="api_version",
            help="the driver's dlu-api version; refused (exit 3) when this dlu-prime does not support it",
        )
    return parser


_emit_lock = threading.Lock()


def _emit(text: str) -> None:
    """One whole line (the mailbox answers from worker threads)."""
    with _emit_lock:
        print(text, flush=True)


def _error(kind: str, message: str, **extra: Any) -> None:
    """The error for a person (stderr) and for a remote driver (a wire line in the job log)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    _emit(wire.line(wire.ERROR, {"kind": kind, "message": message, **extra}))


class _Terminated(Exception):
    """SIGTERM: Ray's job stop (`ray job stop`, the REST stop) asks the launcher to end."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise _Terminated


def _launch(args: argparse.Namespace) -> int:
    from dlu_prime import preflight, ray_env

    spec = load_spec(args.spec) if args.spec else spec_from_dict(json.loads(args.spec_json))
    workdir = args.workdir or os.getcwd()
    preflight.check(spec, workdir)  # what needs no Ray, before joining it
    from dlu_prime.publish import StatusPublisher, status_interval_s

    try:
        interval_s = status_interval_s()
    except ValueError as exc:
        _error(wire.KIND_OTHER, str(exc))
        return EXIT_REFUSED
    ray_env.connect(args.address)
    from dlu_prime import launcher, mailbox

    publisher = StatusPublisher(_emit, interval_s)
    box = mailbox.Mailbox(spec.name, _emit)
    signal.signal(signal.SIGTERM, _raise_terminated)
    created = False
    try:
        launcher.submit_job(spec, workdir, args.resume)
        created = True
        from dlu_prime.compat import installed_version

        accepted = {"name": spec.name, "dlu_prime": installed_version("dlu-prime")}
        _emit(wire.line(wire.ACCEPTED, {**accepted, wire.MAILBOX: mailbox.supported()}))
        printer = ProgressPrinter(_emit)

        def on_update(status: JobStatus) -> None:
            printer(status)
            publisher(status)

        final = launcher.wait_job(spec, on_update, on_poll=box.poll)
    except _Terminated:
        # The PrimeMaster is detached: without this, the job would outlive a stopped Ray job.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if created:
            launcher.stop_job(spec.name, "its Ray job was stopped")
        _emit(f"[{spec.name}] stop requested: the Ray job running the launcher was stopped")
        return 143
    finally:
        box.close()
    _emit(status_text(final, events=10))
    publisher.final(final)
    return final.exit_code if final.exit_code is not None else 1


def _stop(args: argparse.Namespace) -> int:
    from dlu_prime import launcher

    found = launcher.stop_job(args.job)
    _emit(
        f"stop requested for {args.job}"
        if found
        else f"no running PrimeMaster for {args.job}; what was left of it is removed"
    )
    return 0 if found else EXIT_NOT_FOUND


def _status(args: argparse.Namespace) -> int:
    from dlu_prime import launcher

    status = launcher.job_status(args.job)
    if status is None and args.store_json:
        store = json.loads(args.store_json)
        status = launcher.stored_status(args.job, str(store.get("name")), dict(store.get("options") or {}))
    if status is None:
        print(f"no running job {args.job}", file=sys.stderr)
        return EXIT_NOT_FOUND
    _emit(wire.status_line(status) if args.json else status_text(status))
    return 0


def _debug(args: argparse.Namespace) -> int:
    from dlu_prime import launcher

    try:
        result = launcher.debug_job(args.job, args.action, args.role, args.rank, args.step)
    except (LookupError, ValueError) as exc:
        _emit(wire.line(wire.DEBUG, {"error": str(exc)}))
        return EXIT_NOT_FOUND
    _emit(wire.line(wire.DEBUG, {"result": result}))
    return 0


def _scale(args: argparse.Namespace) -> int:
    from dlu_prime import launcher

    try:
        result = launcher.scale_job(args.job, args.role, args.size)
    except (LookupError, ValueError) as exc:
        _emit(wire.line(wire.DEBUG, {"error": str(exc)}))
        return EXIT_NOT_FOUND
    _emit(wire.line(wire.DEBUG, {"result": result}))
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    if args.api_version:
        from dlu_prime.compat import api_version_problem

        problem = api_version_problem(args.api_version)
        if problem is not None:
            _error(wire.KIND_VERSION, problem)
            return EXIT_VERSION
    from dlu_prime import ray_env

    try:
        if args.command == "launch":
            return _launch(args)  # joins Ray after the checks that need none
        ray_env.connect(args.address)
        if args.command == "stop":
            return _stop(args)
        if args.command == "debug":
            return _debug(args)
        if args.command == "scale":
            return _scale(args)
        return _status(args)
    except SpecError as exc:
        problems = [{"field": p.field, "message": p.message, "fix": p.fix} for p in exc.problems]
        _error(wire.KIND_SPEC, str(exc), problems=problems)
        return EXIT_REFUSED
    except JobNameTakenError as exc:
        _error(wire.KIND_NAME_TAKEN, str(exc))
        return EXIT_REFUSED
    except DLUError as exc:
        _error(wire.KIND_OTHER, str(exc))
        return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
