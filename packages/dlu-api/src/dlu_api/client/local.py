"""The local client lives in dlu-prime (it needs Ray); this module finds it or says what to install."""

from __future__ import annotations

import importlib
import logging
import os
from typing import TYPE_CHECKING, Any

from dlu_api.client.base import JobClient
from dlu_api.errors import MissingComponentError

if TYPE_CHECKING:
    from dlu_api.spec.models import JobSpec

LOCAL_CLIENT_PATH = "dlu_prime.local:LocalJobClient"
LOCAL_RECORDS_PATH = "dlu_prime.local_records:LocalRecords"  # imports no Ray
# Import no Ray: they run before the local client is imported.
LOCAL_WARMUP_PATH = "dlu_prime.roles:warm_up_this_node"
LOCAL_PREFLIGHT_PATH = "dlu_prime.preflight:check_local"
LOCAL_RESERVE_PATH = "dlu_prime.job_files:reserve"

INSTALL_HINT = (
    "Running a job on this machine needs dlu-prime (the DLU control plane, with Ray). "
    "Install it with `pip install 'dlu-api[local]'` (or `pip install dlu-prime`), "
    "or run on a cluster instead with `--address http://HEAD:8265`."
)


VERBOSE_ENV = "DLU_VERBOSE"  # set: `dlu run` and `Job.run()` are not quiet (as `--verbose`)

QUIET_RAY_OPTIONS: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
"""`ray.init` options of a quiet `dlu run`: no worker output forwarded to the driver (the
PrimeMaster's INFO log, Ray's warnings from inside actors, the ranks' own output) and only
errors from Ray's own logger here (e.g. its token-authentication notice)."""


def local_client(ray_options: dict[str, Any] | None = None) -> JobClient:
    """A client that runs jobs on an embedded Ray in this process, started with `ray_options`
    (passed to `ray.init`).

    Raises:
        MissingComponentError: dlu-prime, or something it needs, is not installed.
    """
    return _prime_client(LOCAL_CLIENT_PATH, ray_options or {})


def local_records() -> JobClient:
    """A client of the local jobs that exist (their status, stop, delete, logs, debug, scale,
    list), read from their files with no Ray imported: a `dlu status` answers at once.

    Raises:
        MissingComponentError: dlu-prime is not installed.
    """
    return _prime_client(LOCAL_RECORDS_PATH, {})


def _prime_client(path: str, options: dict[str, Any]) -> JobClient:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or "?"
        if missing == "dlu_prime":
            raise MissingComponentError(INSTALL_HINT) from None
        if missing == module_name:
            raise MissingComponentError(
                f"the installed dlu-prime has no {module_name}; upgrade it to match dlu-api "
                "(`pip install -U dlu-prime`)."
            ) from None
        raise MissingComponentError(
            f"dlu-prime is installed but its dependency {missing!r} is missing; "
            "reinstall it with `pip install --force-reinstall dlu-prime`."
        ) from None
    client_class = getattr(module, attr, None)
    if client_class is None:
        raise MissingComponentError(
            f"the installed dlu-prime has no {path}; upgrade it to match dlu-api (`pip install -U dlu-prime`)."
        )
    client = client_class(**options)
    if not isinstance(client, JobClient):
        raise MissingComponentError(f"{path} is not a JobClient; reinstall dlu-prime.")
    return client


def reserve_local(spec: JobSpec) -> None:
    """Take `spec`'s job name on this machine for the local client of this process, before
    anything starts: a name another process runs is refused here. Without dlu-prime it does
    nothing: `local_client` says what to install.

    Raises:
        JobNameTakenError: another process runs a job of that name; the message names its pid.
    """
    found = _prime_function(LOCAL_RESERVE_PATH)
    if found is not None:
        found(spec.name)


def check_local(spec: JobSpec) -> None:
    """Refuse `spec` if it cannot run on this machine (missing script or module, more CPUs, GPUs
    or memory than there are, ...) before anything starts: no Ray, no zygote. Without dlu-prime
    it does nothing: `local_client` says what to install.

    Raises:
        SpecError: every problem found.
    """
    found = _prime_function(LOCAL_PREFLIGHT_PATH)
    if found is not None:
        found(spec, os.getcwd(), {})


def warm_up_local(spec: JobSpec) -> None:
    """Start the node warm-ups of `spec`'s roles on this machine, as the local client does when it
    starts the embedded Ray, only earlier. Without dlu-prime it does nothing: `local_client`
    says what to install.
    """
    found = _prime_function(LOCAL_WARMUP_PATH)
    if found is not None:
        found(spec.roles)


def _prime_function(path: str) -> Any:
    """dlu-prime's function at 'module:attr', or None where dlu-prime is not installed."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        return None
    return getattr(module, attr)
