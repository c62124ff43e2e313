"""Every private Ray symbol DLU touches, in one place, each checked before it is used.

Ray (2.60) has no public way to do what these do: keep a local node on 127.0.0.1 (`ray.init`
rewrites `_node_ip_address="127.0.0.1"` to the host's interface address, and every Ray server
then listens on all interfaces), leave the autoscaler monitor, the API server and (where no
driver reads worker output) the log monitor out of a local head (`ray.init` takes neither
`no_monitor` nor a way to skip the other two), give the raylet
another worker script, remove a placement group by id, or read and write the GCS's key-value
store, or find the node's log dir (where rank logs of a cluster job go). `SYMBOLS` names each symbol, the parameters DLU passes it, and what DLU does without it;
`problem()` says what is wrong with one on the installed Ray (the unit tests call it for each),
`get()` returns it, or None with one logged warning when Ray changed it. A changed symbol never
breaks a run: DLU falls back to Ray's own behaviour (no lean head, no zygote, Ray's address
resolution), except the embedded state store, which cannot work without the KV (it raises).

Nothing here imports Ray (nor `inspect`) when this module is imported: the Ray-worker entry,
a process started for every Ray worker, imports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import ipaddress
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)


class Private(NamedTuple):
    """One private Ray symbol: `module` (imported), then `attr` (dotted, may be empty)."""

    module: str
    attr: str
    params: tuple[str, ...] = ()  # names DLU passes: each must be in its signature
    kind: str = "callable"  # "callable", "property", "module" or "value" (any attribute)
    fallback: str = ""

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attr}" if self.attr else self.module


_NODE = "ray._private.node"
_KV = "ray.experimental.internal_kv"
# the KV also holds remote drivers' requests (dlu_prime.mailbox: the package uploads they make)
_KV_FALLBACK = "the embedded store fails; a cluster job's launcher answers no remote requests"
SYMBOLS: dict[str, Private] = {
    "resolve_ip": Private(
        "ray._private.services", "resolve_ip_for_localhost", ("host",),
        fallback="Ray moves a local node off 127.0.0.1 onto the host's address",
    ),
    "node_init": Private(_NODE, "Node.__init__", ("ray_params",), fallback="Ray's own worker script (no zygote)"),
    "worker_path": Private(
        "ray._private.parameter", "RayParams.__init__", ("worker_path",),
        fallback="Ray's own worker script (no zygote)",
    ),
    "log_monitor": Private(
        "ray._private.parameter", "RayParams.__init__", ("include_log_monitor",),
        fallback="Ray starts its log monitor even where no driver reads worker output",
    ),
    "default_worker": Private(
        "ray._private.workers.default_worker", "", kind="module", fallback="Ray's own worker script (no zygote)"
    ),
    "start_monitor": Private(_NODE, "Node.start_monitor", fallback="Ray starts its autoscaler monitor"),
    "start_ray_process": Private(
        "ray._private.services", "start_ray_process", ("command", "process_type"),
        fallback="the raylet starts Ray's own (minimal) dashboard agent",
    ),
    "wait_for_port": Private(
        _NODE, "wait_for_persisted_port", ("poll_interval_ms",),
        fallback="the head looks for the GCS's port file every 100 ms",
    ),
    "ray_path": Private("ray._private.services", "RAY_PATH", kind="value", fallback="as start_ray_process"),
    "start_api_server": Private(
        _NODE, "Node.start_api_server", ("include_dashboard", "raise_on_failure"),
        fallback="Ray starts its API server",
    ),
    "placement_group_id": Private(
        "ray._raylet", "PlacementGroupID.from_hex", fallback="a placement group not found by name is left to Ray"
    ),
    "kv_get": Private(_KV, "_internal_kv_get", ("key", "namespace"), fallback=_KV_FALLBACK),
    "kv_put": Private(_KV, "_internal_kv_put", ("key", "value", "overwrite", "namespace"), fallback="the embedded store fails"),
    "kv_del": Private(_KV, "_internal_kv_del", ("key", "del_by_prefix", "namespace"), fallback=_KV_FALLBACK),
    "kv_list": Private(_KV, "_internal_kv_list", ("prefix", "namespace"), fallback=_KV_FALLBACK),
    "node_logs_dir": Private(
        _NODE, "Node.get_logs_dir_path", fallback="rank logs of a cluster job go under $DLU_HOME/logs on each node",
    ),
    "global_node": Private("ray._private.worker", "_global_node", kind="value", fallback="as node_logs_dir"),
    "error_printer": Private(
        "ray._private.worker", "print_to_stdstream", ("data", "ignore_prefix"),
        fallback="a quiet `dlu run` shows the raylet's messages (e.g. \"A worker died\")",
    ),
    "actor_table": Private(
        "ray._private.state", "state.actor_table", ("actor_id", "actor_state_name"),
        fallback="a rebuilt PrimeMaster cannot tell where a gone actor last ran (the death of a replacement its predecessor placed, unsaved, is taken for the one its failover began for)",
    ),
    "actor_restarted": Private(
        "ray.runtime_context", "RuntimeContext.was_current_actor_reconstructed", kind="property",
        fallback="an actor restarted by Ray is taken for a fresh one",
    ),
}  # fmt: skip

# Conventions, not symbols (the unit tests check them): the module a Ray worker runs, the job id
# Ray's core reads from the environment when Ray is imported, and the nil job id.
DEFAULT_WORKER_MODULE = SYMBOLS["default_worker"].module
JOB_ENV = "RAY_JOB_ID"
NIL_JOB = "ffffffff"
_NIL_NODE = "f" * 56  # an actor that never got a node
# Ray's worker script, for the worker entry where DLU cannot be imported (set while Ray starts).
DEFAULT_WORKER_ENV = "DLU_RAY_DEFAULT_WORKER"


class RayInternalsChanged(RuntimeError):
    """A private Ray symbol DLU needs is gone or has another shape in the installed Ray."""


def ray_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _resolve(symbol: Private) -> tuple[Any, Any, str]:
    """(owner, value, last attribute name) of `symbol`; raises on anything missing."""
    import inspect

    owner: Any = None
    if symbol.kind == "module":  # found, not imported: importing a worker's main module may act
        found = importlib.util.find_spec(symbol.module)
        if found is None:
            raise ModuleNotFoundError(symbol.module)
        return None, found, ""
    value: Any = importlib.import_module(symbol.module)
    last = ""
    for part in symbol.attr.split(".") if symbol.attr else ():
        owner, last = value, part
        value = inspect.getattr_static(owner, part) if symbol.kind == "property" else getattr(owner, part)
    return owner, value, last


def _accepts(fn: Any, name: str) -> bool:
    import inspect

    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True  # a compiled function without a signature: callable is all that can be seen
    kinds = {p.kind for p in parameters.values()}
    return name in parameters or inspect.Parameter.VAR_KEYWORD in kinds


def problem(key: str) -> str | None:
    """What is wrong with symbol `key` on the installed Ray (None: it is there, as expected)."""
    symbol = SYMBOLS[key]
    try:
        _, value, _ = _resolve(symbol)
    except Exception as exc:  # an ImportError, an AttributeError, or anything Ray raises on import
        return f"{symbol.name} is gone in Ray {ray_version()} ({type(exc).__name__}: {exc})"
    if symbol.kind == "property" and not isinstance(value, property):
        return f"{symbol.name} is no longer a property in Ray {ray_version()}"
    if symbol.kind == "callable":
        if not callable(value):
            return f"{symbol.name} is no longer callable in Ray {ray_version()}"
        missing = [p for p in symbol.params if not _accepts(value, p)]
        if missing:
            return f"{symbol.name} no longer takes {', '.join(missing)} in Ray {ray_version()}"
    return None


_checked: dict[str, str | None] = {}


def available(key: str) -> bool:
    """Whether symbol `key` can be used; the first time it cannot, one warning says so."""
    if key not in _checked:
        found = _checked[key] = problem(key)
        if found is not None:
            logger.warning("%s; DLU falls back: %s", found, SYMBOLS[key].fallback)
    return _checked[key] is None


def _get(key: str) -> Any:
    """The symbol itself, looked up at each call (tests replace some), or RayInternalsChanged."""
    if not available(key):
        raise RayInternalsChanged(_checked[key] or key)
    return _resolve(SYMBOLS[key])[1]


@contextmanager
def _patched(key: str, make: Callable[[Any], Any]) -> Iterator[bool]:
    """Replace symbol `key` with `make(original)` while the block runs; yields whether it did."""
    if not available(key):
        yield False
        return
    owner, original, name = _resolve(SYMBOLS[key])
    setattr(owner, name, make(original))
    try:
        yield True
    finally:
        setattr(owner, name, original)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@contextmanager
def pin_loopback() -> Iterator[None]:
    """While the block runs (a `ray.init`, a `Cluster` on loopback), a loopback address given to
    Ray stays loopback, so the node listens on 127.0.0.1 only and a driver reaches it there.
    Restored afterwards: nothing else in the process sees Ray changed."""

    def keep_loopback(original: Callable[[str], str]) -> Callable[[str], str]:
        return lambda host: host if _is_loopback(host) else original(host)

    with _patched("resolve_ip", keep_loopback):
        yield


def _skip_process(*args: Any, **kwargs: Any) -> None:
    del args, kwargs


def default_worker_script() -> str | None:
    """Ray's own worker script, found without importing Ray (None, with a warning, if moved)."""
    found = importlib.util.find_spec("ray")
    if found is not None and found.origin is not None:
        script = Path(found.origin).parent.joinpath(*DEFAULT_WORKER_MODULE.split(".")[1:]).with_suffix(".py")
        if script.is_file():
            return str(script)
    if DEFAULT_WORKER_ENV not in _checked:
        _checked[DEFAULT_WORKER_ENV] = f"{DEFAULT_WORKER_MODULE} has no file in Ray {ray_version()}"
        logger.warning("%s; Ray workers start without the zygote", _checked[DEFAULT_WORKER_ENV])
    return None


AGENT_STUB_SCRIPT = str(Path(__file__).with_name("ray_agent_stub.py"))
AGENT_STUB_ENV = "DLU_RAY_AGENT_STUB"
_AGENT_COMMAND = "--dashboard_agent_command="


def agent_stub_enabled() -> bool:
    return os.environ.get(AGENT_STUB_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def with_agent_stub(command: list[str], agent_script: str) -> list[str]:
    """A raylet command whose dashboard agent, where Ray runs its minimal one (plain `ray`), is
    dlu_prime/ray_agent_stub.py; any other command as it is."""
    stub = AGENT_STUB_SCRIPT
    if any(c.isspace() or c == '"' for c in stub):  # it would need quoting inside the command
        return command
    out: list[str] = []
    for arg in command:
        if arg.startswith(_AGENT_COMMAND) and " --minimal" in arg and arg.count(agent_script) == 1:
            arg = arg.replace(agent_script, stub)
        out.append(arg)
    return out


def _stub_agent(original: Callable[..., Any]) -> Callable[..., Any]:
    agent_script = os.path.join(str(_get("ray_path")), "dashboard", "agent.py")

    def start(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        return original(with_agent_stub(list(command), agent_script), process_type, *args, **kwargs)

    return start


PORT_POLL_MS = 5
"""How often the starting head looks for the port file the GCS writes once it listens (Ray: every
100 ms, so 50 ms lost on average at every start); a file read each time, for well under a second."""


def _poll_sooner(original: Callable[..., Any]) -> Callable[..., Any]:
    def wait(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("poll_interval_ms", PORT_POLL_MS)
        return original(*args, **kwargs)

    return wait


@contextmanager
def lean_head(
    *,
    skip_api_server: bool,
    worker_script: str | None,
    skip_log_monitor: bool = False,
    stub_agent: bool = False,
) -> Iterator[None]:
    """While Ray starts a head in this process: no autoscaler monitor, no API server if
    `skip_api_server`, no log monitor if `skip_log_monitor` (it only forwards worker output to
    drivers), a stub for Ray's minimal dashboard agent if `stub_agent` (dlu_prime.ray_agent_stub),
    the GCS's port file looked for every PORT_POLL_MS, and the raylet runs `worker_script` (if given) instead of Ray's worker script,
    which is then in the environment under DEFAULT_WORKER_ENV. Each part that Ray no longer
    supports is left out, alone; everything is restored afterwards."""
    ray_script = default_worker_script() if worker_script else None
    use_script = bool(ray_script) and available("worker_path") and available("default_worker")
    no_log_monitor = skip_log_monitor and available("log_monitor")

    def with_params(original: Callable[..., None]) -> Callable[..., None]:
        def init(self: Any, ray_params: Any, *args: Any, **kwargs: Any) -> None:
            if use_script and getattr(ray_params, "worker_path", "unset") is None:  # None: Ray's own
                ray_params.worker_path = worker_script
            if no_log_monitor and getattr(ray_params, "include_log_monitor", "unset") is None:
                ray_params.include_log_monitor = False
            original(self, ray_params, *args, **kwargs)

        return init

    saved_env = os.environ.get(DEFAULT_WORKER_ENV)
    with ExitStack() as stack:
        stack.enter_context(_patched("start_monitor", lambda _: _skip_process))
        stack.enter_context(_patched("wait_for_port", _poll_sooner))
        if stub_agent and available("ray_path"):
            stack.enter_context(_patched("start_ray_process", _stub_agent))
        if skip_api_server:
            stack.enter_context(_patched("start_api_server", lambda _: _skip_process))
        patched = (use_script or no_log_monitor) and stack.enter_context(_patched("node_init", with_params))
        if patched and use_script and ray_script:
            os.environ[DEFAULT_WORKER_ENV] = ray_script
        try:
            yield
        finally:
            if saved_env is None:
                os.environ.pop(DEFAULT_WORKER_ENV, None)
            else:
                os.environ[DEFAULT_WORKER_ENV] = saved_env


def placement_group(pg_id_hex: str) -> Any | None:
    """The placement group with this id (Ray has no public constructor from an id); None if
    Ray changed how one is built."""
    if not available("placement_group_id"):
        return None
    from ray.util.placement_group import PlacementGroup

    return PlacementGroup(_get("placement_group_id")(pg_id_hex))


def kv_get(key: str, namespace: str | None) -> bytes | None:
    return _get("kv_get")(key, namespace=namespace)


def dashboard_running() -> bool:
    """Whether this Ray has a dashboard (where its state API lives): the address it publishes
    in the GCS. Asked because the state API, without one, waits 40 s before it says so."""
    if not available("kv_get"):
        return False
    return kv_get("dashboard", namespace="dashboard") is not None


def kv_put_if_absent(key: str, value: bytes, namespace: str | None) -> bool:
    """Create `key` unless it exists; True means it already existed (nothing written)."""
    return bool(_get("kv_put")(key, value, overwrite=False, namespace=namespace))


def kv_delete(key: str, namespace: str | None, *, by_prefix: bool = False) -> None:
    _get("kv_del")(key, del_by_prefix=by_prefix, namespace=namespace)


def kv_keys(prefix: str, namespace: str | None) -> list[bytes]:
    return list(_get("kv_list")(prefix, namespace=namespace))


def dead_actor_nodes(names: Sequence[str]) -> dict[str, str]:
    """The node each named actor Ray records as dead last ran on, the one that ended last
    where a name had several incarnations; names Ray has no dead actor of are left out. The
    GCS's actor table (public only through `ray.util.state`, which needs the API server a
    local head leaves out), asked once for every dead actor: a rebuilt PrimeMaster asks it
    when it resumes a saved failover, not in every pass."""
    wanted = set(names)
    if not wanted or not available("actor_table"):
        return {}
    try:
        table = _get("actor_table")(actor_id=None, actor_state_name="DEAD")
    except Exception as exc:  # the GCS unreachable, or a table of another shape
        logger.warning("cannot read Ray's table of dead actors (%s); where they ran is unknown", exc)
        return {}
    latest: dict[str, tuple[float, str]] = {}
    for info in table.values() if isinstance(table, dict) else ():
        name, node = info.get("Name"), (info.get("Address") or {}).get("NodeID")
        if name not in wanted or not node or node == _NIL_NODE:
            continue
        ended = float(info.get("EndTime") or 0)
        if name not in latest or ended >= latest[name][0]:
            latest[name] = (ended, node)
    return {name: node for name, (_, node) in latest.items()}


def actor_was_restarted() -> bool:
    """Whether Ray restarted the current actor. The property is public, but Ray reads its own
    deprecated `RuntimeContext.actor_id` inside it ("Use get_actor_id() instead", advice for
    Ray's code, not ours): that warning alone is silenced. Ray has no public restart count
    (`ray.util.state` needs the API server a local head leaves out)."""
    if not available("actor_restarted"):
        return False
    import ray

    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"(?s).*Use get_actor_id\(\) instead", category=DeprecationWarning
        )
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def session_logs_dir() -> str | None:
    """The log dir of this process's Ray node (the session's `logs/`, which Ray's dashboard log
    API serves), or None outside a Ray worker or where Ray changed how it is found."""
    if not (available("node_logs_dir") and available("global_node")):
        return None
    node = _get("global_node")
    if node is None:
        return None
    try:
        return str(_get("node_logs_dir")(node))
    except Exception as exc:  # a node object of another shape: fall back, visibly once
        logger.warning("cannot read the Ray node's log dir (%s); rank logs go under $DLU_HOME", exc)
        return None


RAYLET_SOURCE = "raylet"  # the `pid` Ray's driver gives the messages its error listener prints


def quiet_raylet_messages() -> bool:
    """From now on, what Ray's driver prints of the raylet's error messages ("(raylet) A worker
    died or was killed ...": a process of a job ending is what DLU reports itself, as an event)
    goes to this module's log at DEBUG instead of stdout; what else it prints is unchanged.
    Ray's error listener looks the printer up at each message, so replacing it suffices.
    Returns whether it could (False, with one warning, where Ray changed)."""
    if not available("error_printer"):
        return False
    owner, original, name = _resolve(SYMBOLS["error_printer"])
    if getattr(original, "dlu_quiet", False):
        return True

    def printer(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == RAYLET_SOURCE:
            for line in data.get("lines", []):
                logger.debug("(raylet) %s", line)
            return
        original(data, ignore_prefix)

    printer.dlu_quiet = True  # type: ignore[attr-defined]
    setattr(owner, name, printer)
    return True
