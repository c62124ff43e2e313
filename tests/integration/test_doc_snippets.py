"""Every code block of README.md and docs/*.md runs as printed, or says why not (see
`doc_snippets` for the marker convention): python blocks run as scripts, yaml job specs are
validated and run on a local Ray (one, shared), yaml fragments validated inside a job, bash
blocks run as scripts; the marked ones are at least compiled, parsed or syntax-checked."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from doc_snippets import ROOT, MarkerError, Snippet, all_snippets, extract
from short_tmp import short_tmp_dir

from dlu_api.spec import load_spec, spec_from_dict

SNIPPETS = all_snippets()
BY_LANG: dict[str, list[Snippet]] = {}
for _snippet in SNIPPETS:
    BY_LANG.setdefault(_snippet.lang, []).append(_snippet)

JOBS = [s for s in BY_LANG.get("yaml", []) if s.runs]
PYTHON = [s for s in BY_LANG.get("python", []) if s.runs]
BASH = [s for s in BY_LANG.get("bash", []) if s.runs]
FRAGMENTS = [s for s in BY_LANG.get("yaml", []) if s.marker == "fragment"]

MINIMAL_JOB: dict[str, Any] = {
    "name": "snippet",
    "device_type": "CPU",
    "device_per_node": 0,
    "roles": [{"name": "worker", "entrypoint": "examples.hello.workers:main"}],
}

# `uv run X` in a block runs X in this environment (what uv run does in a synced checkout).
UV_SHIM = 'uv() { if [ "$1" = run ]; then shift; "$@"; else command uv "$@"; fi; }\n'


def ids(snippets: list[Snippet]) -> list[str]:
    return [s.id for s in snippets]


def private_env(tmp_path: Path) -> dict[str, str]:
    """Its own Ray temp dir and DLU_HOME, the venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("LM_CHECKPOINT_DIR",)}
    env["RAY_TMPDIR"] = short_tmp_dir("dlu-snippet-")
    env["DLU_HOME"] = str(tmp_path / "home")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


# the convention, checked with no Ray -------------------------------------------------------------
def test_the_docs_have_runnable_snippets_of_each_kind() -> None:
    """The extraction finds what the docs hold (a broken fence parser would find nothing)."""
    assert "README.md" in {s.path for s in JOBS} and "README.md" in {s.path for s in PYTHON}
    assert BASH, "no runnable bash block"


def test_every_marker_has_a_reason_and_a_block() -> None:
    assert [
        s.marker for s in extract("<!-- snippet: no-run (needs a GPU) -->\n```bash\nnvidia-smi\n```\n", "x")
    ] == ["no-run"]
    for bad in (
        "<!-- snippet: no-run -->\n```bash\nls\n```\n",  # no reason
        "<!-- snippet: skip (why) -->\n```bash\nls\n```\n",  # unknown marker
        "<!-- snippet: no-run (why) -->\nsome text\n```bash\nls\n```\n",  # not before the block
    ):
        with pytest.raises(MarkerError):
            extract(bad, "x")


@pytest.mark.parametrize("snippet", BY_LANG.get("python", []), ids=ids(BY_LANG.get("python", [])))
def test_python_blocks_compile(snippet: Snippet) -> None:
    ast.parse(snippet.code, filename=snippet.id)


@pytest.mark.parametrize("snippet", BY_LANG.get("yaml", []), ids=ids(BY_LANG.get("yaml", [])))
def test_yaml_blocks_parse_and_unmarked_ones_are_job_specs(snippet: Snippet) -> None:
    data = yaml.safe_load(snippet.code)
    assert isinstance(data, dict), f"{snippet.id}: not a mapping"
    whole = {"name", "roles"} <= set(data)  # pyright: ignore[reportUnknownArgumentType]
    if snippet.runs:
        assert whole, f"{snippet.id}: not a whole job spec; mark it <!-- snippet: fragment (why) -->"
    if whole:  # a job spec that is not run here (e.g. it needs GPUs) is still a valid one
        spec_from_dict(data)


@pytest.mark.parametrize("snippet", BY_LANG.get("bash", []), ids=ids(BY_LANG.get("bash", [])))
def test_bash_blocks_parse(snippet: Snippet) -> None:
    done = subprocess.run(["bash", "-n"], input=snippet.code, text=True, capture_output=True, check=False)
    assert done.returncode == 0, f"{snippet.id}: {done.stderr}"


@pytest.mark.parametrize("snippet", FRAGMENTS, ids=ids(FRAGMENTS))
def test_yaml_fragments_are_valid_inside_a_job(snippet: Snippet) -> None:
    spec_from_dict({**MINIMAL_JOB, **yaml.safe_load(snippet.code)})


# run as printed ----------------------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet", JOBS, ids=ids(JOBS))
def test_yaml_job_specs_validate_and_run(snippet: Snippet, ray_session: Any, tmp_path: Path) -> None:
    from dlu_prime import launcher

    path = tmp_path / "job.yaml"
    path.write_text(snippet.code, encoding="utf-8")
    spec = load_spec(path)  # the loader of `dlu validate` and `dlu run`
    status = launcher.run_job(spec, str(ROOT))
    assert status.exit_code == 0, f"{snippet.id}: {status.reason}"
    assert not [e for e in status.events if e.kind == "stalled"], f"{snippet.id}: it stalled"


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet", PYTHON, ids=ids(PYTHON))
def test_python_blocks_run_as_printed(snippet: Snippet, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=private_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, f"{snippet.id}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("snippet", BASH, ids=ids(BASH))
def test_bash_blocks_run_as_printed(snippet: Snippet, tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", UV_SHIM + snippet.code],
        cwd=ROOT,
        env=private_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, f"{snippet.id}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
