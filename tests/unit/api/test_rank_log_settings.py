"""Per-rank log settings: stream modes as torchrun's, the spec's `logs` block, the file layout."""

from __future__ import annotations

import pytest

from dlu_api.errors import SpecError
from dlu_api.rank_logs import (
    BOTH,
    NONE,
    STDERR,
    STDOUT,
    LineSplitter,
    RankStreams,
    mode_for,
    parse_modes,
    parse_rank_file,
    rank_file,
    relative_rank_file,
    select,
)
from dlu_api.spec.io import spec_from_dict

BASE = {"name": "logs-job", "roles": [{"name": "t", "entrypoint": "m:f"}]}


@pytest.mark.parametrize(
    ("text", "want"), [("0", 0), ("3", 3), (2, 2), ("0:1,1:2", {0: 1, 1: 2}), (" 4 : 3 ", {4: 3})]
)
def test_modes_parse(text: str | int, want: object) -> None:
    assert parse_modes(text, "logs.tee") == want


@pytest.mark.parametrize("text", ["4", "-1", "x", "0:4", "0:1,0:2", "1:", "", "0:1;1:2"])
def test_bad_modes_name_the_field(text: str) -> None:
    with pytest.raises(
        ValueError, match=r"logs\.redirects .*(not a stream mode|twice): give logs\.redirects"
    ):
        parse_modes(text, "logs.redirects")


def test_per_rank_modes_leave_other_ranks_at_none() -> None:
    modes = parse_modes("0:1,2:3", "x")
    assert [mode_for(modes, r) for r in range(4)] == [STDOUT, NONE, BOTH, NONE]
    assert mode_for(STDERR, 7) == STDERR


def test_tee_implies_the_file() -> None:
    """As torchrun: a tee'd stream goes to the file too; `redirects` alone is not printed."""
    streams = RankStreams.of("1", "2", rank=0)
    assert (streams.to_file, streams.tee) == (BOTH, STDERR)
    assert streams.writes(STDOUT) and streams.writes(STDERR)
    quiet = RankStreams.of("0", "0:1", rank=1)
    assert (quiet.to_file, quiet.tee) == (NONE, NONE)
    assert RankStreams.of("0", "0:1", rank=0).to_file == STDOUT


def test_spec_logs_defaults() -> None:
    logs = spec_from_dict(BASE).logs
    assert (logs.dir, logs.redirects, logs.tee) == (None, "3", "0")


def test_spec_logs_accepts_numbers_and_per_rank_text() -> None:
    logs = spec_from_dict({**BASE, "logs": {"dir": "/data/l", "redirects": 1, "tee": "0:3,1:1"}}).logs
    assert (logs.dir, logs.redirects, logs.tee) == ("/data/l", "1", "0:3,1:1")


@pytest.mark.parametrize(
    ("logs", "field", "words"),
    [
        ({"redirects": 5}, "logs.redirects", "not a stream mode"),
        ({"tee": "0:1,x"}, "logs.tee", "not a stream mode"),
        ({"dir": "relative/logs"}, "logs.dir", "is relative"),
        ({"dir": "  "}, "logs.dir", "is empty"),
        ({"redirect": 1}, "logs.redirect", "rename it to 'redirects'"),
    ],
)
def test_spec_logs_errors_name_the_field(logs: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_dict({**BASE, "logs": logs})
    assert len(info.value.problems) == 1
    text = str(info.value.problems[0])
    assert text.startswith(f"{field}:") and words in text


def test_layout() -> None:
    path = rank_file("/l", "job", "abc", "trainer", 3, "err")
    assert str(path) == "/l/job/abc/trainer/rank3.err"
    assert relative_rank_file("job", "abc", "trainer", 3, "out") == "dlu/job/abc/trainer/rank3.out"
    found = parse_rank_file(str(path))
    assert found is not None and (found.role, found.rank, found.stream, found.label) == (
        "trainer",
        3,
        "err",
        "[trainer/rank3:err]",
    )
    assert parse_rank_file("/l/job/abc/trainer/rank3.log") is None
    assert parse_rank_file("rank1.out") is None


def test_select_filters_and_orders() -> None:
    names = ["w/rank1.err", "w/rank1.out", "t/rank10.out", "t/rank2.out", "w/rank0.out"]
    files = [f for f in map(parse_rank_file, names) if f is not None]
    assert [f.path for f in select(files, None, None)] == [
        "t/rank2.out",
        "t/rank10.out",
        "w/rank0.out",
        "w/rank1.out",
        "w/rank1.err",
    ]
    assert [f.path for f in select(files, None, 1)] == ["w/rank1.out", "w/rank1.err"]
    assert [f.path for f in select(files, "t", None)] == ["t/rank2.out", "t/rank10.out"]


def test_line_splitter_keeps_partial_lines() -> None:
    split = LineSplitter()
    assert split.feed(b"a\nb") == ["a"]
    assert split.feed(b"c\n\nd") == ["bc", ""]
    assert split.flush() == ["d"]
    assert split.flush() == []
