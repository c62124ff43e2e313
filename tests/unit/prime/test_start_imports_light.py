"""What is imported while a local job starts holds nothing it does not use: no HTTP client in
`dlu run` and the embedded Ray's worker zygote (httpx, with the rich and click it imports, is the
Brain client's, imported when one is made), and no spec models or YAML loader in the training
processes' zygote. Each check runs in a fresh interpreter, so that modules other tests imported
hide nothing."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import importlib, json, os, sys
    os.environ["RAY_JOB_ID"] = "ffffffff"  # as the worker zygote imports Ray
    from dlu_prime.actor_paths import ACTOR_MODULES
    for name in ("dlu_prime.local", *ACTOR_MODULES, "dlu_prime.ray_workers"):
        importlib.import_module(name)
    before = sorted(m for m in ("httpx", "rich", "click") if m in sys.modules)
    from dlu_prime.brain_port import BrainClient
    client = BrainClient("http://127.0.0.1:9")
    print(json.dumps({"before": before, "after": "httpx" in sys.modules, "http": type(client._http).__module__}))
    """
)


@pytest.mark.timeout(120)
def test_the_local_client_and_actor_modules_import_no_http_client() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["before"] == []
    assert found["after"] is True  # a Brain client still gets its HTTP client
    assert found["http"].startswith("httpx")


TRAINING_ZYGOTE_PROBE = textwrap.dedent(
    """
    import json, sys
    from dlu_elastic.worker.warmup import PRELOAD
    dlu_modules = [m for m in PRELOAD if m.startswith("dlu")]
    for name in dlu_modules:
        __import__(name)
    heavy = sorted(m for m in ("dlu_api.spec.models", "dlu_api.spec.io", "yaml") if m in sys.modules)
    print(json.dumps({"dlu_modules": dlu_modules, "heavy": heavy}))
    """
)


@pytest.mark.timeout(120)
def test_the_training_zygote_imports_no_spec_models() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", TRAINING_ZYGOTE_PROBE], capture_output=True, text=True, timeout=110
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["dlu_modules"], "the zygote preloads a DLU module"
    assert found["heavy"] == []


def test_every_spec_name_loads_on_first_use() -> None:
    spec = importlib.import_module("dlu_api.spec")
    for name in spec.__all__:
        assert getattr(spec, name) is not None, name
    assert set(spec.__all__) <= set(dir(spec))
    with pytest.raises(AttributeError):
        _ = spec.not_a_spec_name


MASTER_PROBE = textwrap.dedent(
    """
    import json, sys, threading
    import dlu_prime.local
    from dlu_prime import launcher
    before = sorted(m for m in ("dlu_prime.master.actor", "dlu_prime.master.manager") if m in sys.modules)
    seen = []
    thread = launcher.prefetch_master()
    seen.append(thread.name)
    thread.join(60)
    print(json.dumps({"before": before, "after": launcher.MASTER_MODULE in sys.modules,
                      "thread": seen[0], "main": threading.current_thread().name}))
    """
)


@pytest.mark.timeout(120)
def test_the_prime_masters_modules_are_imported_beside_rays_start() -> None:
    """`dlu run` imports the local client before it starts Ray; the PrimeMaster's modules (0.2 to
    0.4 s of CPU), which only the submission needs, are imported in a thread during Ray's start
    (`LocalJobClient._submit` calls `launcher.prefetch_master` just before `ray_env.init_local`)."""
    proc = subprocess.run([sys.executable, "-c", MASTER_PROBE], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["before"] == []
    assert found["after"] is True
    assert found["thread"] == "dlu-import-master" != found["main"]
