"""What `dlu run` and the embedded Ray's worker zygote import before a job starts holds no HTTP
client: httpx (with the rich and click it imports) is the Brain client's, imported when one is
made. Checked in a fresh interpreter, so that modules other tests imported hide nothing."""

from __future__ import annotations

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
