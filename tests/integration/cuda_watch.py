"""Run the code paths that precede a fork under a profiler hook recording every call into CUDA.

A process that forks training processes (the torch zygote) or Ray workers (the Ray zygote)
must not have initialised the CUDA driver: a forked child of such a process cannot use CUDA
("Cannot re-initialize CUDA in forked subprocess"), and it could not honour the
CUDA_VISIBLE_DEVICES its rank sets anyway. `torch.cuda.is_available()` and `device_count()`
already do (through `cudaGetDeviceCount`), so the check is on calls, not on `is_initialized()`,
and it needs no GPU: the calls happen (and fail quietly) on a machine without one.

Usage: `python cuda_watch.py PHASE...`; the phases run in order in this one process, with the
hook installed before anything is imported, and the last stdout line is a JSON object
{phase: {"calls": [what was called, from where], "info": {...}}}. Phases:

- `zygote`: the torch zygote's preload (`zygote_server._preload` of the default list), then a fork
  whose child reports whether torch marks it a bad fork (torch does so after any CUDA call
  that went through its bindings in the parent, even without a GPU);
- `node_check`: the node-check probe's entrypoint as a training process runs it, device cpu,
  a pair of one (the probe runs for real: gloo, matmul, allreduce);
- `ray_workers`: the Ray zygote's preload (`dlu_prime.ray_workers.PRELOAD`);
- `control`: `torch.cuda.device_count()` and `is_available()`; the harness must catch them (and
  the child of a fork after them must be a bad fork), or a clean result above proves nothing.

Each phase also reports the driver libraries mapped into the process (/proc/self/maps): what a
C library loads by itself escapes the hook, but on a machine with a GPU driver no CUDA call can
happen without libcuda loaded (where there is no driver, nothing can load it: an empty list).
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
import threading
from types import FrameType
from typing import Any

# Python functions that reach the CUDA driver or runtime, or NVML / AMD SMI (torch/cuda/__init__.py).
_PY_ENTRY_POINTS = {
    "torch.cuda": {
        "init",
        "_lazy_init",
        "is_available",
        "device_count",
        "_device_count_nvml",
        "_raw_device_count_nvml",
        "_raw_device_uuid_nvml",
        "_device_count_amdsmi",
        "_raw_device_count_amdsmi",
        "_raw_device_uuid_amdsmi",
        "_get_pynvml_handler",
        "_get_amdsmi_handler",
        "_get_nvml_device_index",
        "current_device",
        "set_device",
        "synchronize",
        "get_device_name",
        "get_device_capability",
        "get_device_properties",
        "get_arch_list",
        "get_gencode_flags",
        "is_bf16_supported",
        "is_tf32_supported",
        "cudart",
        "mem_get_info",
    },
    "torch.accelerator": {
        "is_available",
        "device_count",
        "current_device_index",
        "current_device_idx",
        "set_device_index",
        "set_device_idx",
        "synchronize",
        "current_stream",
    },
}
# NVML / AMD SMI bindings: their functions named after the C API (nvmlInit, amdsmi_init, ...)
# and the loaders of their libraries. Importing the binding runs only its module and class
# bodies, which touch no driver (seen on an H200: torch.cuda imports pynvml where installed).
_PY_ENTRY_MODULES = {
    "pynvml": ("nvml", "_LoadNvmlLibrary", "_nvmlGetFunctionPointer"),
    "amdsmi": ("amdsmi_",),
}
# torch._C builtins that are CUDA entry points: every `_cuda_*` (verified: even
# `_cuda_getArchFlags` marks a later fork bad) but the flag read below, and the accelerator
# hooks but the compile-time `_accelerator_getAccelerator` (verified: no bad fork after it).
_C_SAFE = {"_cuda_isInBadFork", "_accelerator_getAccelerator"}
_DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libamd_smi.so", "libamdhip64.so")

_calls: list[str] = []
_verdicts: dict[Any, str | None] = {}  # code object -> entry point it is (None: not one)


def _where(frame: FrameType | None, depth: int = 4) -> str:
    """The innermost callers, outermost last: 'module:line < module:line ...' (import machinery
    left out)."""
    parts: list[str] = []
    while frame is not None and len(parts) < depth:
        module = str(frame.f_globals.get("__name__", "?"))
        if not module.startswith("importlib"):
            parts.append(f"{module}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(parts)


def _python_entry(frame: FrameType) -> str | None:
    code = frame.f_code
    if code in _verdicts:
        return _verdicts[code]
    module = str(frame.f_globals.get("__name__", ""))
    verdict: str | None = None
    binding = _PY_ENTRY_MODULES.get(module.split(".")[0])
    is_function = bool(code.co_flags & inspect.CO_OPTIMIZED)  # not a module or class body
    if code.co_name in _PY_ENTRY_POINTS.get(module, ()) or (
        binding is not None and is_function and code.co_name.startswith(binding)
    ):
        verdict = f"{module}.{code.co_name}"
    elif module == "ctypes" and code.co_name == "__init__" and "handle" in code.co_varnames:
        verdict = "ctypes.CDLL"  # judged per call: which library
    _verdicts[code] = verdict
    return verdict


def _hook(frame: FrameType, event: str, arg: Any) -> None:
    if event == "call":
        entry = _python_entry(frame)
        if entry == "ctypes.CDLL":
            library = str(frame.f_locals.get("name") or "")
            if any(lib in library for lib in _DRIVER_LIBRARIES):
                _calls.append(f"ctypes.CDLL({library!r}) from {_where(frame.f_back)}")
        elif entry is not None:
            _calls.append(f"{entry} from {_where(frame.f_back)}")
    elif event == "c_call" and getattr(arg, "__module__", None) == "torch._C":
        name = str(getattr(arg, "__name__", ""))
        if name.startswith(("_cuda_", "_accelerator_")) and name not in _C_SAFE:
            _calls.append(f"torch._C.{name} from {_where(frame)}")


def _driver_libraries_mapped() -> list[str]:
    """Driver libraries this process has loaded, however it got them (a C library's own dlopen
    included, which no Python hook sees): on a machine with a GPU driver, CUDA needs them."""
    found: set[str] = set()
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
            if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(_DRIVER_LIBRARIES):
                found.add(fields[5].strip())
    return sorted(found)


def _mapped_by_torch_import() -> list[str]:
    """Driver libraries a bare `import torch` maps in a fresh interpreter. CUDA 13's cuBLASLt
    dlopens libcuda.so.1 while torch loads (seen on an H200, torch 2.11+cu130): a mapping, not an
    initialisation, which every process importing torch has and a fork survives (the children of
    such a zygote used CUDA there). A phase may map nothing beyond it."""
    code = (
        "import json, os, torch; print(json.dumps(sorted({l.split(maxsplit=5)[5].strip() "
        "for l in open('/proc/self/maps') if len(l.split(maxsplit=5)) == 6 and "
        f"os.path.basename(l.split(maxsplit=5)[5].strip()).startswith({_DRIVER_LIBRARIES!r})}})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def _child_in_bad_fork() -> bool:
    """Fork; the child reports torch's bad-fork flag (a flag read, no CUDA call)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        sys.setprofile(None)
        import torch

        os.write(write_fd, b"1" if torch.cuda._is_in_bad_fork() else b"0")  # pyright: ignore[reportPrivateUsage]
        os._exit(0)
    os.close(write_fd)
    answer = os.read(read_fd, 1)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return answer == b"1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def phase_zygote() -> dict[str, Any]:
    from dlu_elastic.worker.warmup import PRELOAD
    from dlu_prime import zygote_server

    loaded, failed = zygote_server._preload(PRELOAD)  # pyright: ignore[reportPrivateUsage]
    return {"preload": list(PRELOAD), "loaded": loaded, "failed": failed}


def phase_node_check() -> dict[str, Any]:
    from dlu_elastic.node_check import entry
    from dlu_elastic.worker.process import ForwardingHealth, ProcessEvent, context_from_env
    from dlu_prime.runtime.context import set_current_worker

    os.environ.update(
        {
            "DLU_DEVICE": "cpu",
            entry.PROBE_RANK_ENV: "0",
            entry.PROBE_SIZE_ENV: "1",
            entry.PROBE_NODE_ENV: "node-0",
            entry.PROBE_SETTINGS_ENV: json.dumps({"matmul_size": 64, "allreduce_mb": 0.01, "timeout_s": 60}),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
        }
    )
    events: list[ProcessEvent] = []
    set_current_worker(context_from_env(ForwardingHealth(sink=events.append)))
    entry.main()
    return {"metrics": [e.metric for e in events]}


def phase_ray_workers() -> dict[str, Any]:
    from dlu_prime import ray_workers, zygote_server

    os.environ[ray_workers.JOB_ENV] = ray_workers.NIL_JOB  # as the Ray zygote imports Ray
    loaded, failed = zygote_server._preload(ray_workers.PRELOAD)  # pyright: ignore[reportPrivateUsage]
    return {"preload": list(ray_workers.PRELOAD), "loaded": loaded, "failed": failed}


def phase_control() -> dict[str, Any]:
    import torch

    return {"device_count": torch.cuda.device_count(), "available": torch.cuda.is_available()}


PHASES = {
    "zygote": phase_zygote,
    "node_check": phase_node_check,
    "ray_workers": phase_ray_workers,
    "control": phase_control,
}


def main(phases: list[str]) -> None:
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise SystemExit(f"unknown phase(s) {unknown}; choose from {sorted(PHASES)}")
    report: dict[str, Any] = {}
    threading.setprofile(_hook)  # threads the code under test starts
    sys.setprofile(_hook)
    try:
        for phase in phases:
            _calls.clear()
            info = PHASES[phase]()
            calls = list(_calls)  # before the fork below: the child's own calls are not the phase's
            info["driver_mapped"] = _driver_libraries_mapped()
            if "torch" in sys.modules:
                info["child_in_bad_fork"] = _child_in_bad_fork()
            report[phase] = {"calls": calls, "info": info}
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # pyright: ignore[reportArgumentType]
    report["torch_import"] = {"driver_mapped": _mapped_by_torch_import()}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
