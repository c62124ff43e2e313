"""Release check: build every package, then install dlu-api alone from its wheel into a fresh
venv and use it there, as a user's driver machine would.

    uv run python scripts/release_check.py [--keep DIR]

Steps: `uv build --all-packages` (a wheel and an sdist per package) into a temporary folder;
`uv venv` + `uv pip install` of the dlu-api wheel alone (dependency versions pinned to uv.lock);
then in that venv: no ray, torch or grpc installed, `dlu --help`, `dlu schema`, and
`dlu validate` of every example spec (ok) and of a broken one (refused, naming the field).
Prints one line per step and exits 1 at the first failure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dlu_api", "dlu_brain", "dlu_elastic", "dlu_prime", "dlu_store_redis")
HEAVY = ("ray", "torch", "grpc")  # a driver never needs them


class CheckFailed(Exception):
    pass


def run(*cmd: str | Path, cwd: Path = ROOT, ok_codes: tuple[int, ...] = (0,)) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode not in ok_codes:
        raise CheckFailed(
            f"`{' '.join(map(str, cmd))}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout + done.stderr


def build(uv: str, dist: Path) -> list[Path]:
    run(uv, "build", "--all-packages", "-q", "-o", dist)
    files = sorted(f for f in dist.iterdir() if f.suffix in (".whl", ".gz"))
    for package in PACKAGES:
        kinds = {f.suffix for f in files if f.name.startswith(package + "-")}
        if not {".whl", ".gz"} <= kinds:
            raise CheckFailed(f"{package}: no wheel and sdist among {[f.name for f in files]}")
    return files


def install_api_alone(uv: str, dist: Path, work: Path) -> Path:
    constraints = work / "constraints.txt"
    run(uv, "export", "--frozen", "--all-packages", "--no-emit-workspace", "--no-hashes", "--no-header",
        "-q", "-o", constraints)  # fmt: skip
    venv = work / "venv"
    run(uv, "venv", "-q", venv)
    (wheel,) = dist.glob("dlu_api-*.whl")
    run(uv, "pip", "install", "-q", "--python", venv / "bin" / "python", "-c", constraints, wheel)
    return venv


def check_driver(venv: Path, work: Path) -> int:
    python, dlu = venv / "bin" / "python", venv / "bin" / "dlu"
    probe = f"import importlib.util, json; print(json.dumps([m for m in {HEAVY!r} if importlib.util.find_spec(m)]))"
    found = json.loads(run(python, "-c", probe, cwd=work))
    if found:
        raise CheckFailed(f"dlu-api alone pulled in {found}")
    for command in ("run", "submit", "status", "validate"):
        if command not in run(dlu, "--help", cwd=work):
            raise CheckFailed(f"`dlu --help` does not list {command}")
    json.loads(run(dlu, "schema", cwd=work))
    specs = work / "specs"
    shutil.copytree(ROOT / "examples", specs / "examples")  # outside the checkout: no workspace import
    names = sorted(str(p.relative_to(specs)) for p in specs.glob("examples/*/job.yaml"))
    out = run(dlu, "validate", *names, cwd=specs)
    if out.count(": ok") != len(names):
        raise CheckFailed(f"dlu validate of the examples:\n{out}")
    (specs / "bad.yaml").write_text("name: Bad_Name\nroles: [{name: r, entrypoint: m:f}]\n")
    refused = run(dlu, "validate", "bad.yaml", cwd=specs, ok_codes=(1, 2))
    if "- name:" not in refused:
        raise CheckFailed(f"a broken spec was not refused naming the field:\n{refused}")
    return len(names)


def main() -> int:
    parser = argparse.ArgumentParser(description="Build every package; install dlu-api alone and use it.")
    parser.add_argument("--keep", type=Path, default=None, help="build and install here, and keep it")
    args = parser.parse_args()
    uv = shutil.which("uv")
    if uv is None:
        print("release check: uv is not on PATH", file=sys.stderr)
        return 1
    work = args.keep or Path(tempfile.mkdtemp(prefix="dlu-release-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        dist = work / "dist"
        files = build(uv, dist)
        print(f"built {len(files)} files for {len(PACKAGES)} packages: {', '.join(f.name for f in files)}")
        venv = install_api_alone(uv, dist, work)
        print(f"installed the dlu-api wheel alone into {venv} (no {', '.join(HEAVY)})")
        count = check_driver(venv, work)
        print(f"dlu --help, dlu schema ok; dlu validate: {count} example specs ok, a broken one refused")
    except CheckFailed as exc:
        print(f"release check FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print("release check: ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
