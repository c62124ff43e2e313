"""Spec files that plain YAML/JSON loading gets wrong: not UTF-8 (a traceback before), and keys
written twice (the last silently won). Each is a problem naming the file, the key and the lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlu_api.cli import app
from dlu_api.errors import SpecError
from dlu_api.spec.io import load_spec, load_spec_text
from dlu_api.spec.strict import DuplicateKey, load_json, load_yaml

pytestmark = pytest.mark.timeout(60)

GOOD_YAML = """\
name: demo
device_type: CPU
device_per_node: 0
roles:
  - name: worker
    entrypoint: pkg.mod:main
    total: 2
"""


def _problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return [str(p) for p in info.value.problems]


# --- encoding ------------------------------------------------------------------------------


def test_a_latin1_file_is_refused_naming_the_file_the_line_and_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes(GOOD_YAML.replace("worker", "w\xf6rker").encode("latin-1"))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    [problem] = info.value.problems
    assert problem.field == "spec"
    assert str(path) in problem.message
    assert "must be UTF-8" in problem.message
    assert "byte 0xf6 at line 5, column 12" in problem.message
    assert "save" in problem.fix and "UTF-8" in problem.fix and str(path) in problem.fix


def test_a_utf8_file_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    data = {"name": "demo", "device_type": "CPU", "device_per_node": 0, "roles": [
        {"name": "wörker", "entrypoint": "pkg.mod:main"}]}  # fmt: skip
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(data, ensure_ascii=False).encode())
    with pytest.raises(SpecError) as info:  # loads; only the role name pattern is wrong
        load_spec(path)
    assert [p.field for p in info.value.problems] == ["roles[wörker].name"]


def test_dlu_validate_reports_a_non_utf8_file_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "utf16.yaml"
    path.write_bytes(GOOD_YAML.encode("utf-16"))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert f"{path}: 1 problem(s)" in result.output
    assert "is not UTF-8 text" in result.output


# --- duplicate keys ------------------------------------------------------------------------


def test_a_top_level_key_written_twice_names_the_file_the_key_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(GOOD_YAML + "name: other\n", encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    [problem] = info.value.problems
    assert problem.field == "name"
    assert str(path) in problem.message
    assert "'name' 2 times in the top level (lines 1, 8)" in problem.message
    assert "YAML keeps only the last" in problem.message
    assert problem.fix == "keep one 'name' in the top level: delete or rename the one(s) on line(s) 8."


def test_duplicates_deep_in_yaml_are_found_with_the_role_named(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(
        GOOD_YAML
        + "    resources:\n      cpu: 1\n      cpu: 2\n"
        + "  - name: ps\n    entrypoint: a:b\n    env: {A: '1', A: '2', B: '3'}\n",
        encoding="utf-8",
    )
    problems = _problems(path)
    assert len(problems) == 2, problems
    assert problems[0].startswith("roles[worker].resources.cpu: ")
    assert "in roles[worker].resources (lines 9, 10)" in problems[0]
    assert problems[1].startswith("roles[ps].env.A: ")
    assert "(lines 13, 13)" in problems[1]


def test_duplicates_in_json_are_found_at_any_depth_with_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(
        '{"name": "demo", "device_type": "CPU", "device_per_node": 0,\n'
        ' "roles": [\n'
        '   {"name": "worker", "entrypoint": "pkg.mod:main",\n'
        '    "total": 1,\n'
        '    "total": 2}],\n'
        ' "config": {"lr": {"a": 1, "a": 2}, "s": "\\"{,\\"a\\":"}\n'
        "}\n",
        encoding="utf-8",
    )
    problems = _problems(path)
    assert len(problems) == 2, problems
    assert problems[0].startswith("roles[worker].total: ")
    assert (
        str(path) in problems[0]
        and "(lines 4, 5)" in problems[0]
        and "JSON keeps only the last" in problems[0]
    )
    assert problems[1].startswith("config.lr.a: ") and "(lines 6, 6)" in problems[1]


def test_equal_keys_in_different_mappings_and_yaml_merges_are_not_duplicates() -> None:
    text = (
        "base: &base {cpu: 1, memory: 1GiB}\n"
        "a: {<<: *base, cpu: 2}\n"
        "b: {cpu: 3}\n"
        "list: [{cpu: 1}, {cpu: 2}]\n"
    )
    data, duplicates = load_yaml(text)
    assert duplicates == []
    assert data["a"] == {"cpu": 2, "memory": "1GiB"}


def test_quoted_and_plain_spellings_of_one_key_are_the_same_key() -> None:
    _, duplicates = load_yaml('name: a\n"name": b\n')
    assert duplicates == [DuplicateKey((), "name", (1, 2))]
    _, numbers = load_yaml("1: a\n'1': b\n")  # an int and a string: different keys
    assert numbers == []


def test_json_strings_holding_braces_and_keys_do_not_confuse_the_key_walk() -> None:
    text = '{"a": "x\\"}{\\"a\\": 1", "b": [{"a": 1}, {"a": 2, "c": {"a": 3}}], "a2": "a"}'
    data, duplicates = load_json(text)
    assert duplicates == []
    assert data["b"][1]["c"] == {"a": 3}
    _, found = load_json('[{"k": 1}, {"k": 1, "k": 2}]')
    assert found == [DuplicateKey((1,), "k", (1, 1))]


def test_an_alias_bomb_is_refused_before_it_is_built() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]
    with pytest.raises(SpecError) as info:  # 10^6 leaves if expanded
        load_yaml("\n".join(lines) + "\n")
    assert "50,000 values" in info.value.problems[0].message
    # a few aliases, expanded, are fine and still walked once per node
    _, duplicates = load_yaml("\n".join(lines[:3]) + "\n")
    assert duplicates == []


def test_text_without_a_file_is_named_as_the_spec() -> None:
    with pytest.raises(SpecError) as info:
        load_spec_text("name: a\nname: b\n")
    assert "the spec sets 'name' 2 times" in info.value.problems[0].message


def test_syntax_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n", encoding="utf-8")
    [problem] = _problems(path)
    assert f"cannot parse YAML in {path}" in problem


def test_dlu_run_overrides_are_applied_to_the_checked_file(tmp_path: Path) -> None:
    """`dlu run --name` rebuilds the spec from the file's data: a duplicate there is refused
    before anything starts (exit 2, the usage-error code), not silently overridden."""
    path = tmp_path / "twice.yaml"
    path.write_text(GOOD_YAML + "name: other\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["run", str(path), "--name", "third"])
    assert result.exit_code == 2, result.output
    assert "'name' 2 times" in result.output
