"""Rank log files of a cluster job, read through Ray's dashboard log API: plain HTTP, so a driver
with only dlu-api reads them.

A cluster job's ranks write under each node's Ray log dir (`dlu/<job>/<run_id>/...`), which is
what the API serves: `GET /api/v0/nodes` finds the nodes, `GET /api/v0/logs?node_id&glob` the
files on one, `GET /api/v0/logs/file?...&lines=-1` a whole file, and
`GET /api/v0/logs/stream?...&lines=-1&interval=S` a file and then what is appended to it, on one
connection. Following reads each file once, incrementally: bytes already received are never asked
for again (only a stream that breaks while the job runs is opened anew, skipping what was read).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import httpx

from dlu_api.client.rank_files import check_selection, selection_text
from dlu_api.errors import ClusterError, DLUError, NotSupportedError
from dlu_api.rank_logs import RAY_SUBDIR, LineSplitter, RankFile, parse_rank_file, select
from dlu_api.status import JobStatus

logger = logging.getLogger(__name__)

STREAM_INTERVAL_S = 0.5
LIST_EVERY_S = 3.0  # how often a follower looks for new files (ranks that start later)
QUIET_AFTER_END_S = 4 * STREAM_INTERVAL_S  # after the job ended: lines still on their way

Request = Callable[..., httpx.Response]


@dataclass(frozen=True, order=True)
class RemoteFile:
    node_id: str
    file: RankFile


class RayLogApi:
    """The dashboard's log endpoints. `request(method, path, **kwargs)` sends one request (and
    turns transport errors into ClusterError); `stream(method, path, **kwargs)` opens a
    streaming response (an httpx context manager)."""

    def __init__(self, address: str, request: Request, stream: Callable[..., Any]) -> None:
        self.address = address
        self._request = request
        self._stream = stream

    def _data(self, response: httpx.Response, what: str) -> Any:
        if response.status_code == 404:
            raise ClusterError(
                f"the cluster at {self.address} has no log API ({what}: HTTP 404); rank logs need "
                "Ray's dashboard (`ray start --head --include-dashboard=true`)"
            )
        if response.status_code >= 400:
            raise ClusterError(
                f"{what} on {self.address} failed: HTTP {response.status_code} {response.text[:500]}"
            )
        body: dict[str, Any] = response.json()
        if not body.get("result", True):
            raise ClusterError(f"{what} on {self.address} failed: {body.get('msg')}")
        data = body.get("data")
        return cast(dict[str, Any], data).get("result") if isinstance(data, dict) else None

    def alive_nodes(self) -> list[str]:
        data = self._data(self._request("GET", "/api/v0/nodes", params={"limit": 10000}), "listing the nodes")
        page = cast(dict[str, Any], data) if isinstance(data, dict) else {}
        rows = cast(list[dict[str, Any]], page.get("result") or [])
        return sorted(
            str(r["node_id"]) for r in rows if r.get("state", "ALIVE") == "ALIVE" and r.get("node_id")
        )

    def list_files(self, node_id: str, glob: str) -> list[str]:
        data = self._data(
            self._request("GET", "/api/v0/logs", params={"node_id": node_id, "glob": glob}),
            f"listing the logs of node {node_id[:8]}",
        )
        groups = cast(dict[str, list[str]], data) if isinstance(data, dict) else {}
        return sorted({str(f) for files in groups.values() for f in files})

    def read(self, node_id: str, filename: str, lines: int = -1) -> Iterator[bytes]:
        """The file, whole or its last `lines` lines, in the chunks it arrives in: a reader that
        stops early reads no further."""
        params = {"node_id": node_id, "filename": filename, "lines": lines}
        with self._stream("GET", "/api/v0/logs/file", params=params) as response:
            if response.status_code >= 400:
                response.read()
                raise ClusterError(
                    f"reading {filename} on node {node_id[:8]} of {self.address} failed: "
                    f"HTTP {response.status_code} {response.text[:500]}"
                )
            yield from response.iter_bytes()

    def follow(
        self,
        node_id: str,
        filename: str,
        skip: int,
        stop: threading.Event,
        lines: int = -1,
        opened: Callable[[httpx.Response], None] | None = None,
    ) -> Iterator[bytes]:
        """The file from byte `skip` on (of the whole file, or of its last `lines` lines when the
        stream opened), then what is appended, until `stop` is set. `opened` gets the response,
        so that another thread can close it (a read waiting for more bytes then ends)."""
        params = {"node_id": node_id, "filename": filename, "lines": lines, "interval": STREAM_INTERVAL_S}
        with self._stream(
            "GET", "/api/v0/logs/stream", params=params, timeout=httpx.Timeout(10.0, read=None)
        ) as response:
            if opened is not None:
                opened(response)
            if response.status_code >= 400:
                response.read()
                raise ClusterError(
                    f"streaming {filename} failed: HTTP {response.status_code} {response.text[:500]}"
                )
            for chunk in response.iter_bytes():
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                if chunk:
                    yield chunk
                if stop.is_set():
                    return


def job_driver_log(submission_id: str) -> str:
    """The file Ray's job server writes a job's entrypoint output to, on its `driver_node_id`
    (the log API lists it there); its own lookup by submission id answered HTTP 500 here."""
    return f"job-driver-{submission_id}.log"


def run_glob(job: str, run_id: str) -> str:
    return f"{RAY_SUBDIR}/{job}/{run_id}/*/rank*.*"


class RemoteRankLogs:
    """The rank logs of one run of a cluster job."""

    def __init__(self, api: RayLogApi, job: str, run_id: str, list_every_s: float = LIST_EVERY_S) -> None:
        self.api = api
        self.glob = run_glob(job, run_id)
        self.list_every_s = list_every_s

    def files(self, role: str | None, rank: int | None) -> list[RemoteFile]:
        """The selected files on the alive nodes. A path is taken from the first node that lists
        it: nodes sharing one log dir (several Ray nodes on one machine) list the same files."""
        found: dict[str, RemoteFile] = {}
        for node in self.api.alive_nodes():
            parsed = (parse_rank_file(name) for name in self.api.list_files(node, self.glob))
            for file in select([f for f in parsed if f is not None], role, rank):
                found.setdefault(file.path, RemoteFile(node, file))
        return sorted(
            found.values(), key=lambda r: (r.file.role, r.file.rank, r.file.stream != "out", r.node_id)
        )

    def read(self, role: str | None, rank: int | None) -> Iterator[str]:
        for remote in self.files(role, rank):
            split = LineSplitter()
            for chunk in self.api.read(remote.node_id, remote.file.path):
                yield from (f"{remote.file.label} {line}" for line in split.feed(chunk))
            yield from (f"{remote.file.label} {line}" for line in split.flush())

    def follow(
        self,
        role: str | None,
        rank: int | None,
        running: Callable[[], bool],
        wanted: Callable[[RankFile], bool] = lambda _: True,
        ended: threading.Event | None = None,
    ) -> Iterator[str]:
        """Every selected file, one stream each, merged as lines come; new files are looked for
        every `list_every_s`. Once the job has ended (`running()` says no at a look, or `ended` is
        set), files are looked for one last time and lines are read until none came for a few
        stream intervals."""
        halt = threading.Event()
        lines: queue.Queue[str] = queue.Queue()
        followed: set[RemoteFile] = set()
        next_list = 0.0
        ended_at: float | None = None
        last_line = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                told = ended is not None and ended.is_set()
                if ended_at is None and (now >= next_list or told):
                    for remote in self.files(role, rank):
                        if remote not in followed and wanted(remote.file):
                            followed.add(remote)
                            threading.Thread(
                                target=self._pump,
                                args=(remote, lines, halt),
                                name="dlu-log-follow",
                                daemon=True,
                            ).start()
                    next_list = now + self.list_every_s
                    if told or not running():
                        ended_at = now
                try:
                    yield lines.get(timeout=0.1)
                    last_line = time.monotonic()
                    continue
                except queue.Empty:
                    pass
                if ended_at is not None and time.monotonic() - max(ended_at, last_line) > QUIET_AFTER_END_S:
                    break
        finally:
            halt.set()
        while not lines.empty():
            yield lines.get_nowait()

    def _pump(self, remote: RemoteFile, lines: queue.Queue[str], stop: threading.Event) -> None:
        """One file's stream into `lines` until `stop`; a stream that ends early is reopened."""
        split = LineSplitter()
        received = 0
        while not stop.is_set():
            try:
                for chunk in self.api.follow(remote.node_id, remote.file.path, received, stop):
                    received += len(chunk)
                    for line in split.feed(chunk):
                        lines.put(f"{remote.file.label} {line}")
            except (ClusterError, httpx.HTTPError) as exc:
                logger.debug("stream of %s broke: %s", remote.file.path, exc)
            if not stop.wait(STREAM_INTERVAL_S):
                continue  # the stream ended while the job runs (agent restart): open it again
        for line in split.flush():
            lines.put(f"{remote.file.label} {line}")


def rank_log_lines(
    api: RayLogApi,
    status: JobStatus,
    role: str | None,
    rank: int | None,
    running: Callable[[], bool] | None,
) -> Iterator[str]:
    """`dlu logs` of a cluster job whose launcher reported `status`; with `running`, followed.

    Raises:
        NotSupportedError: the spec's logs.dir puts the files where Ray's log API cannot read.
        DLUError: no run yet, an unknown role, or no file of that selection.
    """
    name = status.name
    if status.log_dir:
        raise NotSupportedError(
            f"job {name!r} writes its rank logs to {status.log_dir} on each node (its spec's "
            "logs.dir); Ray's log API serves only Ray's own log dir: read them on the nodes, or "
            "leave logs.dir unset"
        )
    if not status.run_id:
        raise DLUError(f"job {name!r} has no rank logs yet: it has not started a run ({status.stage.value})")
    check_selection(status, role, rank)
    ranks = RemoteRankLogs(api, name, status.run_id)
    if running is not None:
        yield from ranks.follow(role, rank, running)
        return
    found = False
    for line in ranks.read(role, rank):
        found = True
        yield line
    if not found:
        raise DLUError(f"job {name!r} has no rank logs{selection_text(role, rank)} on {api.address} yet")
