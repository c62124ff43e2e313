"""DLU control plane on Ray: PrimeMaster, PrimeManager, scheduler and worker runtime."""

import os as _os

# Ray reads this when it is imported: under `uv run` it would otherwise re-run every worker
# through uv with the whole repository uploaded as working_dir.
_os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`dlu_prime.SubMaster` without importing the runtime at package import time."""
    if name == "SubMaster":
        from dlu_prime.worker.submaster import SubMaster

        return SubMaster
    raise AttributeError(name)
