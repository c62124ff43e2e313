"""`dlu brain serve|status`, `dlu history`, `dlu plan`: cluster mode's commands. dlu-brain (and Ray,
for the Cluster Monitor) are imported only when a command runs: `import dlu_api` stays light."""

from __future__ import annotations

import importlib
import json
from types import ModuleType
from typing import Annotated, Any

import typer

from dlu_api.cli.shared import app, echo, fail

BRAIN_HINT = "this command needs dlu-brain (the Brain of cluster mode): `pip install dlu-brain`"
BRAIN_URL_ENV = "DLU_BRAIN_URL"
DEFAULT_BRAIN_URL = "http://127.0.0.1:8470"

brain_app = typer.Typer(
    name="brain", help="The Brain (cluster mode): one per Ray cluster.", no_args_is_help=True
)
app.add_typer(brain_app)

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="DLU_BRAIN_DB",
        help="sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DB; unset: $DLU_HOME/brain.sqlite.",
    ),
]
BrainUrlOpt = Annotated[str, typer.Option("--brain", envvar=BRAIN_URL_ENV, help="The Brain's URL.")]


def _brain(module: str) -> ModuleType:
    try:
        return importlib.import_module(f"dlu_brain.{module}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "dlu_brain":
            raise fail(BRAIN_HINT) from None
        raise fail(
            f"dlu-brain is installed but its dependency {exc.name!r} is missing: reinstall dlu-brain"
        ) from None


def _database(url: str | None) -> Any:
    serve = _brain("serve")
    db_module = _brain("db")
    try:
        database = db_module.BrainDatabase(url or serve.default_db_url())
    except ValueError as exc:
        raise fail(str(exc)) from None
    try:
        database.migrate()  # an empty or older database reads as the current schema
    except (db_module.DatabaseUnavailableError, db_module.SchemaTooNewError) as exc:
        database.close()
        raise fail(str(exc), code=1) from None
    return database


@brain_app.command("serve")
def brain_serve(
    db: DbOpt = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0 for a cluster's jobs).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8470,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Ray cluster for the Cluster Monitor (e.g. auto); unset: none."),
    ] = None,
) -> None:
    """Run the Brain until SIGTERM/Ctrl-C: jobs report statistics to it and ask it for plans.
    A restart resumes every running job's administrator from the database."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve = _brain("serve")
    try:
        serve.serve(db, host, port, ray_address, announce=echo)
    except ValueError as exc:
        raise fail(str(exc)) from None


@brain_app.command("status")
def brain_status(brain: BrainUrlOpt = DEFAULT_BRAIN_URL) -> None:
    """Ask a running Brain what it serves: its database, running jobs and the cluster's last sample."""
    import httpx

    try:
        answer = httpx.get(f"{brain.rstrip('/')}/v1/status", timeout=5)
    except httpx.HTTPError as exc:
        raise fail(f"no Brain answers at {brain} ({exc}); start one with `dlu brain serve`", code=1) from None
    if answer.status_code != 200:
        raise fail(f"the Brain at {brain} answered {answer.status_code}: {answer.text[:300]}", code=1)
    status = answer.json()
    echo(f"Brain at {brain}: database {status['database']}, {len(status['jobs'])} running jobs")
    for job in status["jobs"]:
        threshold = job.get("marginal_threshold")  # absent from an older Brain's answer
        shown = f", threshold {threshold:.0%} of linear" if isinstance(threshold, int | float) else ""
        target = job.get("backlog_target_s")  # absent from an older Brain's answer
        shown += f", backlog target {target:g} s" if isinstance(target, int | float) else ""
        echo(f"  {job['name']} run {job['run_id']}: sizes {json.dumps(job['sizes'], sort_keys=True)}{shown}")
    cluster = status.get("cluster")
    if cluster:
        echo(
            f"  cluster: {cluster['nodes_alive']} nodes alive, {cluster['nodes_dead']} dead, free {json.dumps(cluster['available'], sort_keys=True)}"
        )


@app.command()
def history(db: DbOpt = None, limit: Annotated[int, typer.Option(help="Jobs to show.")] = 20) -> None:
    """Finished jobs from the Brain's database: outcome, and per role the sizes it ran at with their
    throughput (the best marked *)."""
    report = _brain("report")
    database = _database(db)
    try:
        for line in report.history_lines(database, limit):
            echo(line)
    finally:
        database.close()


@app.command()
def plan(job: Annotated[str, typer.Argument(help="The job's name.")], db: DbOpt = None) -> None:
    """A job's current plan from the Brain's database (size or memory per role, the algorithm and why)
    and its latest optimize events."""
    report = _brain("report")
    database = _database(db)
    try:
        for line in report.plan_lines(database, job):
            echo(line)
    except KeyError as exc:
        raise fail(str(exc.args[0]), code=1) from None
    finally:
        database.close()
