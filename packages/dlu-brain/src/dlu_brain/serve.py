"""`dlu brain serve`: the Brain's long-lived process (one per Ray cluster)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

from dlu_brain.db import BrainDatabase, DatabaseUnavailableError, check_url, default_sqlite_url
from dlu_brain.monitor import ClusterMonitor
from dlu_brain.server import BrainServer
from dlu_brain.service import Brain

logger = logging.getLogger(__name__)

DB_ENV = "DLU_BRAIN_DB"
DEFAULT_PORT = 8470


def default_db_url() -> str:
    home = Path(os.environ.get("DLU_HOME") or Path.home() / ".dlu")
    return os.environ.get(DB_ENV) or default_sqlite_url(home)


def serve(
    db_url: str | None = None,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    ray_address: str | None = None,
    monitor_period_s: float = 10.0,
    announce: object = print,
) -> None:
    """Run until SIGTERM/SIGINT. A database that is down at start is waited for (the Brain
    answers 503 meanwhile); a bad URL is refused at once."""
    url = check_url(db_url or default_db_url())
    brain = Brain(BrainDatabase(url))
    try:
        brain.resume()
    except DatabaseUnavailableError as exc:
        logger.warning("%s; serving 503 until it answers", exc)
    server = BrainServer(brain, host, port)
    monitor: ClusterMonitor | None = None
    if ray_address:
        import ray

        ray.init(address=ray_address, namespace="dlu", logging_level=logging.WARNING, log_to_driver=False)
        monitor = ClusterMonitor(brain.cluster_sample, monitor_period_s)
        monitor.start()
    stop = threading.Event()

    def _stop(*_: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server.serve_in_thread()
    if callable(announce):
        announce(f"Brain serving at {server.url} (database {brain.db.where}, pid {os.getpid()})")
    stop.wait()
    server.shutdown()
    if monitor:
        monitor.stop()
    brain.db.close()
