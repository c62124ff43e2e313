"""Reading rank logs: local files from the offset reached (never from the start again), and a
cluster's through Ray's dashboard log API, here a fake one on a real HTTP server (port 0): one
stream per file, read incrementally, and nothing asked for twice."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from dlu_api.cli.tee import tee_filter
from dlu_api.client.rank_files import FileTailer, read_rank_logs
from dlu_api.client.ray_logs import RayLogApi, RemoteRankLogs
from dlu_api.errors import ClusterError
from dlu_api.rank_logs import parse_rank_file
from dlu_api.spec.io import spec_from_dict

pytestmark = pytest.mark.timeout(60)


def _append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(text)


# --- local files ----------------------------------------------------------------------------


def test_tailer_reads_only_what_was_appended(tmp_path: Path) -> None:
    out = tmp_path / "w" / "rank0.out"
    _append(out, "a\nb")
    tailer = FileTailer(tmp_path)
    assert list(tailer.poll()) == ["[w/rank0] a"]  # "b" waits for its end
    assert list(tailer.poll()) == []
    _append(out, "c\nd\n")
    _append(tmp_path / "w" / "rank1.err", "e\n")  # a file that appeared since
    assert list(tailer.poll()) == ["[w/rank0] bc", "[w/rank0] d", "[w/rank1:err] e"]
    _append(out, "tail")
    assert list(tailer.flush()) == ["[w/rank0] tail"]


def test_tailer_never_rereads_from_the_start(tmp_path: Path) -> None:
    out = tmp_path / "w" / "rank0.out"
    _append(out, "x\n" * 1000)
    tailer = FileTailer(tmp_path)
    assert len(list(tailer.poll())) == 1000
    # Overwrite what was read in place: a reader going back to the start would see it.
    with out.open("r+") as handle:
        handle.write("Z\n" * 1000)
    _append(out, "new\n")
    assert list(tailer.poll()) == ["[w/rank0] new"]


def test_read_without_follow_selects_and_orders(tmp_path: Path) -> None:
    _append(tmp_path / "t" / "rank1.err", "t1 err\n")
    _append(tmp_path / "t" / "rank1.out", "t1 out\npartial")
    _append(tmp_path / "t" / "rank0.out", "t0 out\n")
    _append(tmp_path / "h" / "rank1.out", "h1 out\n")
    assert list(read_rank_logs(tmp_path)) == [
        "[h/rank1] h1 out",
        "[t/rank0] t0 out",
        "[t/rank1] t1 out",
        "[t/rank1] partial",
        "[t/rank1:err] t1 err",
    ]
    assert list(read_rank_logs(tmp_path, rank=1)) == [
        "[h/rank1] h1 out",
        "[t/rank1] t1 out",
        "[t/rank1] partial",
        "[t/rank1:err] t1 err",
    ]
    assert list(read_rank_logs(tmp_path, role="t", rank=0)) == ["[t/rank0] t0 out"]


def test_follow_ends_when_the_job_stops(tmp_path: Path) -> None:
    out = tmp_path / "t" / "rank0.out"
    writes = iter(["one\n", "two\n", "three"])

    def running() -> bool:
        text = next(writes, None)
        if text is not None:
            _append(out, text)
        return text is not None and not text.startswith("three")

    assert list(read_rank_logs(tmp_path, follow=running, poll_s=0.01)) == [
        "[t/rank0] one",
        "[t/rank0] two",
        "[t/rank0] three",  # the last, unfinished line comes once the job has stopped
    ]


def test_tee_filter_follows_the_spec() -> None:
    base: dict[str, Any] = {"name": "j", "roles": [{"name": "t", "entrypoint": "m:f"}]}
    assert tee_filter(spec_from_dict(base)) is None
    wanted = tee_filter(spec_from_dict({**base, "logs": {"redirects": 3, "tee": "0:1,1:3"}}))
    assert wanted is not None
    names = ["t/rank0.out", "t/rank0.err", "t/rank1.out", "t/rank1.err", "t/rank2.out"]
    files = [f for f in map(parse_rank_file, names) if f is not None]
    assert [f.path for f in files if wanted(f)] == ["t/rank0.out", "t/rank1.out", "t/rank1.err"]


# --- a cluster's, through a fake dashboard log API --------------------------------------------


class FakeLogApi:
    """Two nodes with rank files under dlu/<job>/<run>/; files grow while the test runs."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytearray] = {}
        self.lock = threading.Condition()
        self.requests: Counter[str] = Counter()
        self.closed = threading.Event()

    def append(self, node: str, name: str, data: bytes) -> None:
        with self.lock:
            self.files.setdefault((node, name), bytearray()).extend(data)
            self.lock.notify_all()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                del format, args

            def _json(self, result: Any) -> None:
                body = json.dumps({"result": True, "msg": "", "data": {"result": result}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                api.requests[f"{url.path} {query.get('filename', '')}".strip()] += 1
                if url.path == "/api/v0/nodes":
                    nodes = [{"node_id": "n1", "state": "ALIVE"}, {"node_id": "n2", "state": "ALIVE"}]
                    self._json({"total": 3, "result": [*nodes, {"node_id": "n3", "state": "DEAD"}]})
                elif url.path == "/api/v0/logs":
                    assert query["glob"] == "dlu/job/run1/*/rank*.*"
                    with api.lock:
                        names = [name for (node, name) in api.files if node == query["node_id"]]
                    self._json(
                        {
                            "worker_out": [n for n in names if n.endswith(".out")],
                            "internal": [n for n in names if n.endswith(".err")],
                        }
                    )
                elif url.path == "/api/v0/logs/file":
                    assert query["lines"] == "-1"
                    with api.lock:
                        data = bytes(api.files[query["node_id"], query["filename"]])
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(data)
                elif url.path == "/api/v0/logs/stream":
                    assert query["lines"] == "-1" and float(query["interval"]) > 0
                    self._stream(query["node_id"], query["filename"])
                else:
                    self.send_response(404)
                    self.end_headers()

            def _stream(self, node: str, name: str) -> None:
                self.send_response(200)
                self.end_headers()
                sent = 0
                while not api.closed.is_set():
                    with api.lock:
                        data = bytes(api.files[node, name][sent:])
                        if not data:
                            api.lock.wait(0.05)
                            continue
                    try:
                        self.wfile.write(data)
                        self.wfile.flush()
                    except OSError:
                        return
                    sent += len(data)

        return Handler


@pytest.fixture
def fake() -> Iterator[tuple[FakeLogApi, httpx.Client, str]]:
    api = FakeLogApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), api.handler())
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    client = httpx.Client(base_url=address, timeout=10.0)
    yield api, client, address
    api.closed.set()
    client.close()
    server.shutdown()
    server.server_close()


def _ranks(client: httpx.Client, address: str) -> RemoteRankLogs:
    return RemoteRankLogs(RayLogApi(address, client.request, client.stream), "job", "run1", list_every_s=0.2)


def test_remote_read_lists_every_alive_node(fake: tuple[FakeLogApi, httpx.Client, str]) -> None:
    api, client, address = fake
    api.append("n1", "dlu/job/run1/t/rank0.out", b"zero\n")
    api.append("n2", "dlu/job/run1/t/rank1.out", b"one\nhalf")
    api.append("n2", "dlu/job/run1/t/rank1.err", b"oops\n")
    ranks = _ranks(client, address)
    assert list(ranks.read(None, None)) == [
        "[t/rank0] zero",
        "[t/rank1] one",
        "[t/rank1] half",
        "[t/rank1:err] oops",
    ]
    assert list(ranks.read("t", 1)) == ["[t/rank1] one", "[t/rank1] half", "[t/rank1:err] oops"]
    assert api.requests["/api/v0/logs/file dlu/job/run1/t/rank0.out"] == 1


def test_remote_follow_is_incremental(fake: tuple[FakeLogApi, httpx.Client, str]) -> None:
    api, client, address = fake
    api.append("n1", "dlu/job/run1/t/rank0.out", b"a1\n")
    api.append("n2", "dlu/job/run1/t/rank1.out", b"b1\n")
    running = threading.Event()
    running.set()
    got: list[str] = []

    def follow() -> None:
        for line in _ranks(client, address).follow(None, None, running.is_set):
            got.append(line)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()

    def wait_for(line: str) -> None:
        deadline = time.monotonic() + 20
        while line not in got:
            assert time.monotonic() < deadline, f"{line!r} never came; got {got}"
            time.sleep(0.02)

    wait_for("[t/rank0] a1")
    wait_for("[t/rank1] b1")
    api.append("n1", "dlu/job/run1/t/rank0.out", b"a2\na")
    wait_for("[t/rank0] a2")
    api.append("n1", "dlu/job/run1/t/rank0.out", b"3\n")
    wait_for("[t/rank0] a3")
    running.clear()  # the job stopped: the follower ends after its last look
    reader.join(20)
    assert not reader.is_alive()
    assert sorted(got) == ["[t/rank0] a1", "[t/rank0] a2", "[t/rank0] a3", "[t/rank1] b1"]
    # one stream per file, held open: no file was asked for again, nor downloaded whole
    assert api.requests["/api/v0/logs/stream dlu/job/run1/t/rank0.out"] == 1
    assert api.requests["/api/v0/logs/stream dlu/job/run1/t/rank1.out"] == 1
    assert not any(key.startswith("/api/v0/logs/file") for key in api.requests)


def test_a_cluster_without_the_log_api_says_so(fake: tuple[FakeLogApi, httpx.Client, str]) -> None:
    _, client, address = fake
    api = RayLogApi(
        address, lambda method, path, **kw: client.request(method, "/nothing" + path, **kw), client.stream
    )
    with pytest.raises(ClusterError, match=r"has no log API .* dashboard"):
        api.alive_nodes()


def test_remote_follow_reads_what_came_just_before_the_end(
    fake: tuple[FakeLogApi, httpx.Client, str],
) -> None:
    """`dlu run`'s tee: a rank that printed and ended between two looks for files is still read
    in full once the run says the job ended."""
    api, client, address = fake
    ranks = RemoteRankLogs(RayLogApi(address, client.request, client.stream), "job", "run1", list_every_s=600)
    ended = threading.Event()
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(ranks.follow(None, None, lambda: True, ended=ended)))
    reader.start()
    time.sleep(0.3)  # its first look found nothing
    api.append("n2", "dlu/job/run1/w/rank0.out", b"printed last\n")
    ended.set()
    reader.join(20)
    assert not reader.is_alive()
    assert got == ["[w/rank0] printed last"]


def test_a_large_file_is_read_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dlu_api.client import rank_files

    monkeypatch.setattr(rank_files, "CHUNK", 7)
    _append(tmp_path / "w" / "rank0.out", "".join(f"line {i}\n" for i in range(50)) + "end")
    assert list(read_rank_logs(tmp_path)) == [f"[w/rank0] line {i}" for i in range(50)] + ["[w/rank0] end"]
