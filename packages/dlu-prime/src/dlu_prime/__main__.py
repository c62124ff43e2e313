"""`python -m dlu_prime launch|stop|status`: the entrypoint a Ray cluster runs for a DLU job."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from dlu_api.errors import DLUError
from dlu_api.spec.io import load_spec, spec_from_dict


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dlu_prime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch", help="run a job on the connected Ray cluster and wait for it")
    source = launch.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", help="path of a YAML or JSON spec file")
    source.add_argument("--spec-json", help="the spec as one JSON string")
    launch.add_argument("--workdir", default=os.getcwd(), help="directory user code is imported from")
    launch.add_argument("--address", default="auto", help="Ray address (default: auto)")
    launch.add_argument(
        "--resume", action="store_true", help="restart a stored job from its state store (new cluster)"
    )
    for name in ("stop", "status"):
        cmd = sub.add_parser(name, help=f"{name} a running job")
        cmd.add_argument("job")
        cmd.add_argument("--address", default="auto")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = _parser().parse_args(argv)
    from dlu_prime import launcher, ray_env

    try:
        ray_env.connect(args.address)
        if args.command == "launch":
            spec = load_spec(args.spec) if args.spec else spec_from_dict(json.loads(args.spec_json))
            status = launcher.run_job(
                spec, args.workdir, lambda s: print(f"[dlu] {s.name}: {s.stage.value}", flush=True)
            )
            print(status.model_dump_json(indent=2), flush=True)
            return status.exit_code if status.exit_code is not None else 1
        if args.command == "stop":
            found = launcher.stop_job(args.job)
            print(
                f"stop requested for {args.job}" if found else f"no running job {args.job}; leftovers removed"
            )
            return 0
        status = launcher.job_status(args.job)
        if status is None:
            print(f"no running job {args.job}", file=sys.stderr)
            return 1
        print(status.model_dump_json(indent=2))
        return 0
    except DLUError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
