"""dlu-api stays light: importing it pulls in no heavy dependency, and a local run without
dlu-prime fails with an error that says what to install.

Each check runs in a fresh interpreter, so that modules other tests imported do not hide a
heavy import and fake `dlu_prime` packages never leak into this process. All local-client
scenarios share one interpreter (they undo their changes), to keep the tests fast.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

HEAVY = ("ray", "torch", "grpc", "google.protobuf", "dlu_prime", "dlu_elastic")


def _python(code: str) -> Any:
    """Run `code` in a fresh interpreter and return the JSON it prints; fail with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_importing_dlu_api_loads_no_heavy_module() -> None:
    result = _python(
        f"""
        import json, sys
        import dlu_api, dlu_api.cli, dlu_api.client, dlu_api.builder
        heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)
        # httpx (and the rich it imports) only with the remote client, rich otherwise only for
        # the live view of `dlu run`: every Ray worker that imports dlu_api would pay for them
        lazy = "httpx" in sys.modules or "rich" in sys.modules
        from dlu_api.client import RemoteJobClient
        print(json.dumps({{
            "heavy": heavy,
            "lazy": lazy,
            # the probe can see modules that are imported: these two are
            "light": ["pydantic" in sys.modules, "httpx" in sys.modules],
        }}))
        """
    )
    assert result["heavy"] == []
    assert result["lazy"] is False
    assert result["light"] == [True, True]


# One interpreter, several ways of lacking dlu_prime.local; each scenario's message by name.
_SCENARIOS = """
import importlib, json, sys

from dlu_api.client.local import local_client
from dlu_api.errors import MissingComponentError

FAKE_ROOT = sys.argv[1]


class HideDluPrime:
    # As in an environment without dlu-prime: `import dlu_prime.local` fails with
    # ModuleNotFoundError(name="dlu_prime").
    def find_spec(self, name, path=None, target=None):
        if name == "dlu_prime" or name.startswith("dlu_prime."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def forget_dlu_prime():
    for key in [k for k in sys.modules if k == "dlu_prime" or k.startswith("dlu_prime.")]:
        del sys.modules[key]
    importlib.invalidate_caches()


def attempt():
    try:
        local_client()
    except MissingComponentError as exc:
        return {"raised": True, "message": str(exc), "import_error": isinstance(exc, ImportError)}
    return {"raised": False}


results = {}

forget_dlu_prime()
sys.meta_path.insert(0, HideDluPrime())
results["not_installed"] = attempt()
del sys.meta_path[0]

forget_dlu_prime()
sys.modules["dlu_prime"] = None
results["blocked_in_sys_modules"] = attempt()

forget_dlu_prime()
importlib.import_module("dlu_prime")
sys.modules["dlu_prime.local"] = None
results["no_local_module"] = attempt()

for case in ("fake_without_local", "fake_local_missing_dep"):
    forget_dlu_prime()
    sys.path.insert(0, f"{FAKE_ROOT}/{case}")
    assert importlib.import_module("dlu_prime").FAKE == case
    results[case] = attempt()
    del sys.path[0]

print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def local_client_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("fake_prime")
    for case in ("fake_without_local", "fake_local_missing_dep"):
        package = root / case / "dlu_prime"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"FAKE = {case!r}\n")
    (root / "fake_local_missing_dep" / "dlu_prime" / "local.py").write_text(
        "import not_a_real_dependency_xyz  # noqa\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", _SCENARIOS, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    results: dict[str, dict[str, Any]] = json.loads(proc.stdout)
    for case, result in results.items():
        assert result["raised"], f"{case}: local_client() did not raise MissingComponentError"
        assert result["import_error"], f"{case}: MissingComponentError is not an ImportError"
    return results


def test_local_client_without_dlu_prime_says_what_to_install(
    local_client_errors: dict[str, dict[str, Any]],
) -> None:
    message = local_client_errors["not_installed"]["message"]
    assert "pip install" in message
    assert "dlu-prime" in message
    assert "--address" in message  # the cluster alternative is offered too


def test_local_client_with_dlu_prime_blocked_in_sys_modules(
    local_client_errors: dict[str, dict[str, Any]],
) -> None:
    # sys.modules["dlu_prime"] = None makes Python report the submodule as missing, not the
    # package; whichever message results, it tells the user which pip command fixes it.
    message = local_client_errors["blocked_in_sys_modules"]["message"]
    assert "pip install" in message
    assert "dlu-prime" in message


@pytest.mark.parametrize("case", ["no_local_module", "fake_without_local"])
def test_local_client_with_dlu_prime_lacking_local_says_upgrade(
    local_client_errors: dict[str, dict[str, Any]], case: str
) -> None:
    message = local_client_errors[case]["message"]
    assert "upgrade" in message
    assert "dlu_prime.local" in message
    assert "pip install -U dlu-prime" in message


def test_local_client_with_dlu_prime_missing_a_dependency(
    local_client_errors: dict[str, dict[str, Any]],
) -> None:
    message = local_client_errors["fake_local_missing_dep"]["message"]
    assert "not_a_real_dependency_xyz" in message
    assert "pip install --force-reinstall dlu-prime" in message


def test_a_local_run_warms_the_node_up_before_importing_ray_or_torch() -> None:
    # `dlu run` starts the zygote (its imports use a core the CLI leaves idle) before it imports
    # the local client: neither the warm-up nor what it imports may pull in Ray or torch.
    result = _python(
        """
        import json, sys
        from dlu_prime import zygote
        started = []
        zygote.ensure_started = lambda preload, idle_s=None: started.append(list(preload))
        from dlu_api.client.local import warm_up_local
        from dlu_api.spec import spec_from_dict
        role = {"name": "t", "kind": "elastic", "entrypoint": "train.py",
                "elastic": {"nnodes": 1, "nproc_per_node": 2}}
        warm_up_local(spec_from_dict({"name": "w", "device_type": "CPU", "roles": [role]}))
        elastic = len(started)
        simple = {"name": "s", "kind": "simple", "entrypoint": "m:f"}
        warm_up_local(spec_from_dict({"name": "w", "device_type": "CPU", "roles": [simple]}))
        print(json.dumps({
            "started": started,
            "elastic": elastic,
            "heavy": sorted(m for m in ("ray", "torch", "grpc") if m in sys.modules),
        }))
        """
    )
    assert result["elastic"] == 1, "an elastic role starts the node's zygote"
    assert len(result["started"]) == 1, "a role without training processes starts nothing"
    assert "torch" in result["started"][0]
    assert result["heavy"] == []


def test_a_local_run_takes_its_job_name_before_importing_ray(tmp_path: Path) -> None:
    # `dlu run` refuses a name another process runs before it starts or imports anything heavy.
    result = _python(
        f"""
        import json, os, sys
        from pathlib import Path
        os.environ["DLU_HOME"] = {str(tmp_path)!r}
        from dlu_api.client.local import reserve_local
        from dlu_api.spec import spec_from_dict
        simple = {{"name": "s", "kind": "simple", "entrypoint": "m:f"}}
        reserve_local(spec_from_dict({{"name": "named", "device_type": "CPU", "roles": [simple]}}))
        from dlu_prime import job_lock
        print(json.dumps({{
            "holder": job_lock.holder(Path({str(tmp_path)!r}) / "jobs" / "named.lock"),
            "pid": os.getpid(),
            "heavy": sorted(m for m in ("ray", "torch", "grpc") if m in sys.modules),
        }}))
        """
    )
    assert result["holder"] == result["pid"]
    assert result["heavy"] == []
