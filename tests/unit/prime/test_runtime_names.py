"""The runtime SDK's names: each is what it says (never a submodule of the same name), whatever
was imported first, and the Ray-free ones import no Ray. Fresh interpreters: the order of
imports is the point."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_CHECK = """
import importlib, inspect, json, sys
{first}
import dlu_prime.runtime as runtime
kinds = {{}}
for name in runtime.__all__:
    value = getattr(runtime, name)
    kinds[name] = "module" if inspect.ismodule(value) else "ok"
print(json.dumps(kinds))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "first",
    [
        "",
        "import dlu_prime.runtime.rpc, dlu_prime.runtime.data, dlu_prime.runtime.data_channel",
        "import dlu_prime.runtime.sharding, dlu_prime.runtime.context",
    ],
)
def test_every_runtime_name_is_the_object_not_a_submodule(first: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHECK.format(first=first))],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    kinds = json.loads(proc.stdout)
    assert {name for name, kind in kinds.items() if kind != "ok"} == set()


@pytest.mark.timeout(120)
def test_heartbeat_and_rpc_import_no_ray() -> None:
    code = "import sys\nfrom dlu_prime.runtime import heartbeat, current_worker, rpc\nprint('ray' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
