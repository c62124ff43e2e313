"""The real `dlu validate` and `dlu run` on hostile spec files: the same problems, no traceback,
and nothing started (no Ray session, no job record)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[3]
DLU = str(Path(sys.executable).parent / "dlu")
HEAD = "name: hostile\ndevice_type: CPU\ndevice_per_node: 0\n"

DEEP = HEAD + "roles:\n  - {name: w, entrypoint: 'm:f'}\nconfig: " + "[" * 500 + "]" * 500 + "\n"
LAUGHS = (
    HEAD
    + "roles:\n  - {name: w, entrypoint: 'm:f'}\nconfig:\n  l0: &l0 [a, a, a, a, a, a, a, a, a]\n"
    + "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))
)
MILLION = HEAD + "roles:\n  - {name: w, entrypoint: 'm:f', total: 1000000}\n"
NO_WRITER = (  # the README's first spec: two of the pipeline's four roles
    HEAD + "roles:\n"
    "  - {name: tokenizer, entrypoint: 'examples.pipeline.roles:tokenizer', resources: {cpu: 0.1}}\n"
    "  - {name: trainer, entrypoint: 'examples.pipeline.roles:trainer', resources: {cpu: 0.1}}\n"
)


def _problem_lines(output: str) -> list[str]:
    return sorted(line.strip() for line in output.splitlines() if line.strip().startswith("- "))


def _dlu(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DLU, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (DEEP, ["more than 64 levels deep"]),
        (LAUGHS, ["more than 50,000 values"]),
        (MILLION, ["roles[w].total", "set total to a value <= 10000"]),
        (NO_WRITER, ["reads the data channel 'raw'", "reads the data channel 'batches'"]),
    ],
    ids=["deep", "billion-laughs", "million-actors", "channel-without-writer"],
)
def test_validate_and_run_refuse_alike_and_start_nothing(tmp_path: Path, text: str, says: list[str]) -> None:
    spec = tmp_path / "hostile.yaml"
    spec.write_text(text, encoding="utf-8")
    ray_tmp, home = tmp_path / "ray", tmp_path / "home"
    ray_tmp.mkdir()
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "DLU_HOME": str(home)}
    env.pop("DLU_ADDRESS", None)

    validated = _dlu(["validate", str(spec)], env)
    ran = _dlu(["run", str(spec)], env)

    assert validated.returncode == 1, validated.stdout + validated.stderr  # a failed check
    assert ran.returncode == 2, ran.stdout + ran.stderr  # a refusal
    for result in (validated, ran):
        output = result.stdout + result.stderr
        assert "Traceback" not in output and "RecursionError" not in output
        for part in says:
            assert part in output
    assert _problem_lines(validated.stdout) == _problem_lines(ran.stderr)  # the same problems
    assert list(ray_tmp.iterdir()) == []  # no Ray session was started
    assert not (home / "jobs" / "hostile.json").exists()  # no job was recorded
