"""`dlu history`, `dlu plan`, `dlu brain status` and the error without dlu-brain; `import dlu_api`
still imports no dlu_brain, sqlalchemy or ray."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlu_api.cli import app
from dlu_brain import Brain, BrainDatabase, BrainServer
from dlu_prime.brain_port import JobRegistration, RoleShape, StatSample

pytestmark = pytest.mark.timeout(90)


def _filled(url: str) -> None:
    brain = Brain(BrainDatabase(url))
    brain.resume()
    shape = RoleShape(kind="elastic", size=2, min_size=1, max_size=4, elastic=True)
    reg = JobRegistration(name="lm", run_id="r1", roles={"trainer": shape}, entrypoint="t:m", config_hash="h")
    brain.start_job(reg)
    samples = [StatSample(seq=i + 1, time=float(i), kind="throughput", role="trainer", world_size=1 + i % 3,
                          samples_per_s=[50.0, 95.0, 99.0][i % 3]) for i in range(9)]  # fmt: skip
    brain.add_samples("lm", "r1", samples)
    brain.end_job("lm", "r1", "succeeded")
    brain.start_job(reg.model_copy(update={"run_id": "r2"}))
    brain.db.close()


def test_history_and_plan(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.sqlite'}"
    _filled(url)
    result = CliRunner().invoke(app, ["history", "--db", url])
    assert result.exit_code == 0, result.output
    assert "lm run r1: succeeded" in result.output
    assert "trainer: 1: 50.0/s, 2: 95.0/s, 3*: 99.0/s" in result.output
    result = CliRunner().invoke(app, ["plan", "lm", "--db", url])
    assert result.exit_code == 0, result.output
    assert "lm run r2: running" in result.output
    assert "trainer: size 2 [proposed, history_best_size] trainer starts at 2" in result.output
    result = CliRunner().invoke(app, ["plan", "nobody", "--db", url])
    assert result.exit_code == 1 and "has no job 'nobody'" in result.output


def test_a_bad_db_url_is_refused() -> None:
    result = CliRunner().invoke(app, ["history", "--db", "mysql://x/y"])
    assert result.exit_code == 2 and "SQLite or PostgreSQL only" in result.output


def test_brain_status(tmp_path: Path) -> None:
    brain = Brain(BrainDatabase(f"sqlite:///{tmp_path / 'b.sqlite'}"))
    server = BrainServer(brain)
    server.serve_in_thread()
    try:
        result = CliRunner().invoke(app, ["brain", "status", "--brain", server.url])
        assert result.exit_code == 0, result.output
        assert "0 running jobs" in result.output
    finally:
        server.shutdown()
        server.server_close()
    result = CliRunner().invoke(app, ["brain", "status", "--brain", server.url])
    assert result.exit_code == 1 and "no Brain answers" in result.output


def test_without_dlu_brain_the_commands_say_what_to_install() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        class Hide:
            def find_spec(self, name, path=None, target=None):
                if name == "dlu_brain" or name.startswith("dlu_brain."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Hide())
        import dlu_api.cli
        from typer.testing import CliRunner
        loaded = sorted(m for m in ("dlu_brain", "sqlalchemy", "ray") if m in sys.modules)
        r = CliRunner().invoke(dlu_api.cli.app, ["history"])
        print(json.dumps({"loaded": loaded, "code": r.exit_code, "out": r.output}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["loaded"] == []
    assert result["code"] == 2 and "needs dlu-brain" in result["out"]
