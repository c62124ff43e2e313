"""`python -m dlu_brain`: the same as `dlu brain serve`."""

from __future__ import annotations

import argparse
import logging

from dlu_brain.serve import DEFAULT_PORT, serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dlu_brain", description="Run the DLU Brain.")
    parser.add_argument(
        "--db",
        default=None,
        help="sqlite:///PATH or postgresql+psycopg://...; default $DLU_BRAIN_DB or $DLU_HOME/brain.sqlite",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--ray-address", default=None, help="Ray cluster to monitor (e.g. auto); unset: no Cluster Monitor"
    )
    parser.add_argument("--monitor-period", type=float, default=10.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(
        args.db,
        args.host,
        args.port,
        args.ray_address,
        args.monitor_period,
        announce=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    main()
