"""A flood of refused calls on a real ElasticService (127.0.0.1, port 0) is a few log lines, each
with the count since the last, never a line per call (2,000 such calls were 2,017 lines)."""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_elastic.rendezvous.service import SERVICE, ElasticServicer, RunningServer, serve
from dlu_elastic.rendezvous.state import Rendezvous

pytestmark = pytest.mark.timeout(120)

TOKEN = "s3cret-job-token"
LOGGER = "dlu_elastic.rendezvous.service"
_LINE = re.compile(r"^refused (?:a call|(\d+) call\(s\)) \(([^)]+)\)")


def start(interval_s: float) -> RunningServer:
    servicer = ElasticServicer(Rendezvous(min_nodes=1, max_nodes=1))
    return serve("127.0.0.1", 0, token=TOKEN, servicer=servicer, refusal_log_interval_s=interval_s)


def flood(server: RunningServer, tokens: list[str]) -> Counter[grpc.StatusCode]:
    """One Heartbeat per token, all in flight at once; the status codes they got."""
    with grpc.insecure_channel(server.address) as channel:
        heartbeat = channel.unary_unary(
            f"/{SERVICE}/Heartbeat",
            request_serializer=pb.HeartbeatRequest.SerializeToString,
            response_deserializer=pb.HeartbeatResponse.FromString,
        )
        calls = [heartbeat.future(pb.HeartbeatRequest(job_token=t, agent_id="a"), timeout=60) for t in tokens]
        codes: Counter[grpc.StatusCode] = Counter()
        for call in calls:
            codes[call.code()] += 1
    return codes


def refusal_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, int]]:
    """(kind, count, level) of every refusal line logged so far."""
    out: list[tuple[str, int, int]] = []
    for record in caplog.records:
        match = _LINE.match(record.getMessage()) if record.name == LOGGER else None
        if match:
            out.append((match.group(2), int(match.group(1) or 1), record.levelno))
    return out


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    yield caplog


def test_two_thousand_bad_tokens_are_one_line_and_one_count_line(logs: pytest.LogCaptureFixture) -> None:
    server = start(interval_s=3600.0)  # the whole flood falls in one interval
    try:
        codes = flood(server, ["wrong-token"] * 2000)
        assert codes == Counter({grpc.StatusCode.UNAUTHENTICATED: 2000})
        assert refusal_lines(logs) == [("wrong job token", 1, logging.WARNING)]  # the first, at once
    finally:
        server.stop(0)
    # stopping logs what was counted since
    assert refusal_lines(logs) == [
        ("wrong job token", 1, logging.WARNING),
        ("wrong job token", 1999, logging.WARNING),
    ]
    assert "the latest: Heartbeat: wrong job_token for this job" in logs.records[-1].getMessage()


def test_counts_come_out_on_the_timer_while_the_server_runs(logs: pytest.LogCaptureFixture) -> None:
    interval = 0.5
    server = start(interval_s=interval)
    try:
        began = time.monotonic()
        codes = flood(server, ["wrong-token", ""] * 1000)
        flooded_s = time.monotonic() - began
        assert codes == Counter({grpc.StatusCode.UNAUTHENTICATED: 2000})

        def counted() -> Counter[str]:
            total: Counter[str] = Counter()
            for kind, count, _ in refusal_lines(logs):
                total[kind] += count
            return total

        deadline = time.monotonic() + 30
        while counted() != Counter({"wrong job token": 1000, "no job token": 1000}):
            assert time.monotonic() < deadline, counted()
            time.sleep(0.05)
        lines = refusal_lines(logs)
    finally:
        server.stop(0)
    # at most one line per kind per interval while the flood lasted, plus the first and the last
    bound = 2 + int(flooded_s / interval) + 1
    per_kind = Counter(kind for kind, _, _ in lines)
    assert per_kind["wrong job token"] <= bound and per_kind["no job token"] <= bound, (lines, flooded_s)
    assert refusal_lines(logs) == lines  # nothing was left to log at the stop


def test_a_stale_round_is_information_and_counted_too(logs: pytest.LogCaptureFixture) -> None:
    server = start(interval_s=3600.0)
    try:
        with grpc.insecure_channel(server.address) as channel:
            get = channel.unary_unary(
                f"/{SERVICE}/GetRendezvous",
                request_serializer=pb.GetRendezvousRequest.SerializeToString,
                response_deserializer=pb.RendezvousState.FromString,
            )
            for _ in range(300):
                with pytest.raises(grpc.RpcError) as refused:
                    get(pb.GetRendezvousRequest(job_token=TOKEN, agent_id="ghost", round=7), timeout=10)
                assert isinstance(refused.value, grpc.Call)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        server.stop(0)
    assert refusal_lines(logs) == [
        ("stale round or not a member", 1, logging.INFO),
        ("stale round or not a member", 299, logging.INFO),
    ]
