"""Issue 28, "Reading a spec": each hostile or accepted-but-wrong input becomes a clear problem
naming the field and the fix, in bounded memory, before anything starts; and a data channel that
a role reads and no role writes is caught statically."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dlu_api.errors import Problem, SpecError
from dlu_api.spec import strict
from dlu_api.spec.channels import channel_problems
from dlu_api.spec.io import load_spec, load_spec_text, spec_from_dict
from dlu_api.spec.plain import MAX_NODES

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[3]
HEAD = "name: demo\ndevice_type: CPU\ndevice_per_node: 0\n"
ROLE = "roles:\n  - name: w\n    entrypoint: 'm:f'\n"


def _problems(text: str, fmt: str = "yaml") -> list[Problem]:
    with pytest.raises(SpecError) as info:
        load_spec_text(text, fmt=fmt)
    str(info.value).encode("utf-8")  # every message prints
    return info.value.problems


def _peak_mb(action: Callable[[], Any]) -> float:
    tracemalloc.start()
    try:
        action()
    except SpecError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
    return peak


# --- 5: deep nesting ------------------------------------------------------------------------

DEEP = 500


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        (HEAD + ROLE + "config:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(DEEP)), "yaml"),
        (HEAD + ROLE + "config: " + "[" * DEEP + "]" * DEEP + "\n", "yaml"),
        ('{"name": "demo", "config": ' + '{"a": ' * DEEP + "1" + "}" * (DEEP + 1), "json"),
        ("[" * 100_000 + "]" * 100_000, "json"),
    ],
    ids=["yaml-block", "yaml-flow", "json", "json-100000"],
)
def test_deep_nesting_is_refused_naming_the_limit(text: str, fmt: str) -> None:
    [problem] = _problems(text, fmt)
    assert problem.field == "spec"
    assert "more than 64 levels deep" in problem.message and "flatten" in problem.fix


def test_deep_data_given_as_python_is_refused_too() -> None:
    config: dict[str, Any] = {}
    node = config
    for _ in range(DEEP):
        node["a"] = {}
        node = node["a"]
    with pytest.raises(SpecError, match="64 levels"):
        spec_from_dict({"name": "demo", "config": config, "roles": [{"name": "w", "entrypoint": "m:f"}]})


# --- 6: alias bombs --------------------------------------------------------------------------


def _laughs(levels: int) -> str:
    lines = ["config:", "  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return HEAD + ROLE + "\n".join(lines) + "\n"


def test_a_billion_laughs_is_refused_in_bounded_memory() -> None:
    [problem] = _problems(_laughs(10))
    assert f"more than {MAX_NODES:,} values" in problem.message and "billion laughs" in problem.fix
    assert _peak_mb(lambda: load_spec_text(_laughs(10))) < 16


def test_an_alias_holding_itself_is_refused() -> None:
    [problem] = _problems(HEAD + ROLE + "config: &c {a: [*c]}\n")
    assert "*c inside the value it names" in problem.message


def test_a_few_aliases_still_work() -> None:
    spec = load_spec_text(HEAD + ROLE + "config:\n  base: &b {lr: 0.1}\n  run: *b\n")
    assert spec.config["run"] == {"lr": 0.1}


# --- 7: size, and libyaml --------------------------------------------------------------------


def test_a_50mb_file_is_refused_by_its_size_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes((HEAD + ROLE + "config: {blob: '").encode() + b"x" * 50_000_000 + b"'}\n")
    peak = _peak_mb(lambda: load_spec(path))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    [problem] = info.value.problems
    assert "too large for a job spec; the limit is 1,048,576 bytes (1 MiB)" in problem.message
    assert str(path) in problem.message and "in config" in problem.fix
    assert peak < 8  # the file is never read


def test_yaml_is_read_by_libyaml_where_it_is_installed() -> None:
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML was built without libyaml")
    assert issubclass(strict._Loader, yaml.CSafeLoader)  # pyright: ignore[reportPrivateUsage]


def test_a_spec_just_under_the_limits_loads() -> None:
    keys = "".join(f"  k{i}: {i}\n" for i in range(MAX_NODES // 2 - 20))
    spec = load_spec_text(HEAD + ROLE + "config:\n" + keys)
    assert len(spec.config) == MAX_NODES // 2 - 20


# --- 8: invalid Unicode, unknown keys ---------------------------------------------------------


def test_lone_surrogates_are_problems_and_hide_no_unknown_key() -> None:
    data = {
        "name": "demo",
        "roles": [{"name": "\ud800", "entrypoint": "m:f"}],
        "\ud800": 1,
        "colour": 2,
        "speed": 3,
    }
    problems = _problems(json.dumps(data), "json")
    fields = {p.field for p in problems}
    assert {"\\ud800", "roles[0].name", "colour", "speed"} <= fields
    surrogate = next(p for p in problems if p.field == "\\ud800")
    assert "lone surrogate" in surrogate.message and "valid pair" in surrogate.fix


# --- 9: YAML 1.1 base-60 numbers ----------------------------------------------------------------


def test_nnodes_with_a_colon_is_the_range_it_says() -> None:
    spec = load_spec_text(
        HEAD + "roles:\n  - {name: w, kind: elastic, entrypoint: 'm:f', elastic: {nnodes: 1:3}}\n"
    )
    elastic = spec.roles[0].elastic
    assert elastic is not None and (elastic.min_nodes, elastic.max_nodes) == (1, 3)


def test_other_colon_values_are_text_not_base_60() -> None:
    spec = load_spec_text(HEAD + ROLE + "config: {at: 1:30, ratio: 2:4}\n")
    assert spec.config == {"at": "1:30", "ratio": "2:4"}
    [problem] = _problems(HEAD + ROLE + "    total: 1:3\n")
    assert problem.field == "roles[w].total" and "whole number" in problem.fix


# --- 10: bounds ---------------------------------------------------------------------------------


def test_a_million_actors_is_refused_naming_the_field_and_the_bound() -> None:
    [problem] = _problems(HEAD + ROLE + "    total: 1000000\n")
    assert problem.field == "roles[w].total"
    assert "10000" in problem.message and "set total to a value <= 10000" in problem.fix


# --- 11: every problem at once ------------------------------------------------------------------


def test_a_duplicate_key_hides_no_other_problem_and_a_date_asks_for_quotes() -> None:
    problems = _problems(HEAD + ROLE + "name: again\nconfig: {start: 2024-01-01}\nbogus: 1\n")
    by_field = {p.field: p for p in problems}
    assert set(by_field) == {"name", "config.start", "bogus"}
    assert "sets 'name' 2 times" in by_field["name"].message
    date = by_field["config.start"]
    assert "as a date" in date.message and "only JSON values" in date.message
    assert "quote it" in date.fix and "start: '2024-01-01'" in date.fix


# --- 12: accepted but wrong ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field", "fix_part"),
    [
        ("roles:\n  - {name: w, kind: elastic, entrypoint: 'm:f', elastic: {nnodes: '٣'}}\n",
         "roles[w].elastic.nnodes", "'MIN:MAX'"),
        ("roles:\n  - {name: w, kind: elastic, entrypoint: 'm:f', elastic: {nnodes: '1_0'}}\n",
         "roles[w].elastic.nnodes", "'MIN:MAX'"),
        (ROLE + "    total: '1_0'\n", "roles[w].total", "digits 0-9"),
        (ROLE + "    per_group: '٣'\n", "roles[w].per_group", "digits 0-9"),
        (ROLE + f"node_num: {2**63}\n", "node_num", "<= 10000"),
        (ROLE + "health: {heartbeat_interval_s: true}\n", "health.heartbeat_interval_s", "to a number"),
        (ROLE + "health: {heartbeat_timeout_s: .inf}\n", "health.heartbeat_timeout_s", "finite number"),
        (ROLE + "health: {monitor_interval_s: .nan}\n", "health.monitor_interval_s", "finite number"),
        (ROLE + "state_store: {name: ''}\n", "state_store.name", "'embedded'"),
        (ROLE + "state_store: {name: '  '}\n", "state_store.name", "'embedded'"),
        (ROLE + "    resources: {memory: '٣GiB'}\n", "roles[w].resources.memory", "4GiB"),
        (ROLE + "    resources: {custom: {accel: true}}\n", "roles[w].resources.custom", "amount >= 0"),
    ],
)  # fmt: skip
def test_accepted_but_wrong_values_are_refused(extra: str, field: str, fix_part: str) -> None:
    problems = _problems(HEAD + extra)
    assert [p.field for p in problems] == [field], [str(p) for p in problems]
    assert fix_part in str(problems[0])


# --- 1 (static part): a channel read and never written --------------------------------------------

PIPELINE = "examples.pipeline.roles"


def _pipeline(*roles: str) -> str:
    lines = [f"  - {{name: {r}, entrypoint: '{PIPELINE}:{r}'}}" for r in roles]
    return HEAD + "roles:\n" + "\n".join(lines) + "\n"


def test_a_channel_nobody_writes_names_the_role_that_would_wait() -> None:
    spec = load_spec_text(_pipeline("tokenizer", "trainer"))  # the README's two roles alone
    problems = channel_problems(spec, str(REPO))
    assert [p.field for p in problems] == ["roles[tokenizer].entrypoint", "roles[trainer].entrypoint"]
    assert "reads the data channel 'raw'" in problems[0].message
    assert "no role of the job writes" in problems[0].message and "roles.py:" in problems[0].message
    assert "add the role that writes 'raw'" in problems[0].fix
    assert "'batches'" in problems[1].message


def test_the_whole_pipeline_has_no_channel_problem() -> None:
    spec = load_spec(REPO / "examples" / "pipeline" / "job.yaml")
    assert channel_problems(spec, str(REPO)) == []


@pytest.mark.parametrize(
    "body",
    [
        "    channel(NAME).get('me')\n",  # a name that is not a literal: could be any channel
        "    helper(channel('q'))\n",  # handed on: the helper might write it
        "    c = channel('q')\n    c.get('me')\n    send(c)\n",
    ],
)
def test_what_cannot_be_known_is_not_reported(tmp_path: Path, body: str) -> None:
    (tmp_path / "mine.py").write_text(
        "from dlu_prime.runtime import channel\nNAME = 'q'\n\n\ndef reader():\n"
        + body
        + "\n\ndef other():\n    channel('q').get('me')\n"
    )
    spec = load_spec_text(
        HEAD + "roles:\n  - {name: a, entrypoint: 'mine:reader'}\n  - {name: b, entrypoint: 'mine:other'}\n"
    )
    assert channel_problems(spec, str(tmp_path)) == []


def test_a_custom_role_s_sub_master_might_write_any_channel(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(
        "from dlu_prime.runtime import channel\n\n\ndef f():\n    channel('q').get('me')\n"
    )
    text = HEAD + "roles:\n  - {name: a, entrypoint: 'mine:f'}\n"
    assert len(channel_problems(load_spec_text(text), str(tmp_path))) == 1
    custom = text.replace("'mine:f'}", "'mine:f', kind: custom, sub_master: 'mine:Sub'}")
    assert channel_problems(load_spec_text(custom), str(tmp_path)) == []


def test_a_script_and_a_helper_function_are_read_too(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(
        "from dlu_prime.runtime import channel as ch\n\n\ndef drain():\n    for x in ch('in').iterate('me'):\n"
        "        pass\n\n\ndrain()\n"
    )
    (tmp_path / "w.py").write_text(
        "import dlu_prime.runtime as rt\n\n\ndef put():\n    rt.channel('other').put(1)\n"
    )
    spec = load_spec_text(
        HEAD + "roles:\n  - {name: s, entrypoint: 'job.py'}\n  - {name: w, entrypoint: 'w:put'}\n"
    )
    [problem] = channel_problems(spec, str(tmp_path))
    assert problem.field == "roles[s].entrypoint" and "'in'" in problem.message
