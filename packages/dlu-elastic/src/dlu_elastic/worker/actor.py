"""ElasticWorker: the actor of one rank of an elastic role.

The actor itself does not import torch: training runs in a process forked from the node's
zygote (torch preloaded, see zygote.py), so an in-place restart costs a fork and a rendezvous,
not an actor restart and a fresh `import torch`, and a replaced actor forks too. The actor is
the rank's agent: it joins the ElasticMaster's rendezvous,
sets torchrun's environment, relays heartbeats and failures, and restarts its process when
the master opens a new round, even after that process exited 0 (see finished.py).

This module is the Ray actor shell and the rendezvous loop; the steps of following one round
(watching the process, beats, the master's decisions, a finished rank) are in agent_loop.py.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_api.spec.entrypoint import EntrypointKind, parse_entrypoint
from dlu_api.spec.models import ElasticSettings, HealthSettings, RoleSpec
from dlu_api.vocabulary import ActorStage
from dlu_elastic.checkpoint.agent import AgentCheckpoints
from dlu_elastic.node_check.entry import PROBE_NODE_ENV, PROBE_RANK_ENV, PROBE_SETTINGS_ENV, PROBE_SIZE_ENV
from dlu_elastic.rendezvous.client import ElasticClient, RendezvousError
from dlu_elastic.worker import error_file, store
from dlu_elastic.worker.agent_loop import (
    HEARTBEAT_CALLS_PER_S,
    MASTER_GONE,
    MASTER_GONE_PATIENCE_S,
    MIN_HEARTBEAT_INTERVAL_S,
    ElasticAgentLoop,
    heartbeat_interval,
)
from dlu_elastic.worker.process import ProcessEventKind, ProcessSpec, TrainingLauncher, TrainingProcess
from dlu_elastic.worker.torchrun_env import restart_count, torchrun_env
from dlu_prime.worker.entrypoint import EntrypointError, LoadedEntrypoint, Outcome, Result
from dlu_prime.worker.rank_logs import RankOutput, log_root, redirect_this_process

logger = logging.getLogger(__name__)

# Re-exported: tests import the heartbeat pacing from here.
__all__ = [
    "HEARTBEAT_CALLS_PER_S",
    "MIN_HEARTBEAT_INTERVAL_S",
    "PROBE_ENTRY",
    "SETUP_DELAY_ENV",
    "ElasticWorkerActor",
    "free_port",
    "heartbeat_interval",
    "is_class_entrypoint",
]

PROBE_ENTRY = "dlu_elastic.node_check.entry:main"
# Fault injection: seconds every setup sleeps (a slow actor start keeps a failover in flight).
SETUP_DELAY_ENV = "DLU_FAULT_SETUP_DELAY_S"
# How long an agent waits for its node's zygote to import torch before it joins a round anyway
# (see `_ready_to_fork`): the fork then waits for it in its turn.
ZYGOTE_READY_S = 120.0


def is_class_entrypoint(text: str, workdir: str | None) -> bool:
    """Whether 'module:Name' names a class, read from the module's source without importing it
    (importing would load torch into the actor for nothing when it is a function)."""
    import ast
    import importlib.util
    import sys

    from dlu_api.source_tree import parse_source

    entry = parse_entrypoint(text)
    if entry.kind is not EntrypointKind.OBJECT or "." in entry.attr:
        return False
    if workdir and workdir not in sys.path:
        sys.path.insert(0, workdir)
    found = importlib.util.find_spec(entry.module)
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return False
    with open(found.origin, encoding="utf-8") as source:
        tree = parse_source(source.read(), found.origin)
    return any(isinstance(node, ast.ClassDef) and node.name == entry.attr for node in tree.body)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ElasticWorkerActor(ElasticAgentLoop):
    redirects_own_output = False  # its training processes write the rank's files

    # lifecycle ---------------------------------------------------------------------------------
    def setup(self, env: dict[str, str] | None = None) -> dict[str, Any]:
        if env:
            os.environ.update(env)
        delay = float(os.environ.get(SETUP_DELAY_ENV) or 0)
        if delay > 0:
            time.sleep(delay)
        self.role_spec = RoleSpec.model_validate_json(self.info.role_json)
        self._health = (
            HealthSettings.model_validate_json(self.info.health_json)
            if self.info.health_json
            else HealthSettings()
        )
        assert self.role_spec.elastic is not None
        self.elastic: ElasticSettings = self.role_spec.elastic
        self.logs = self.info.logs_settings()
        self._check_entrypoint()
        self.class_mode = is_class_entrypoint(self.info.entrypoint, self.info.workdir)
        self._setup_checkpoints()
        self.launcher = TrainingLauncher()
        if not self.class_mode:
            self.launcher.prepare()  # the node's zygote imports torch meanwhile
        import ray

        self.host = ray.util.get_node_ip_address()
        self.process: TrainingProcess | None = None
        self._store: TrainingProcess | None = None
        self._retired_store: TrainingProcess | None = None  # the last round's: see _retire_store
        self.rounds = 0
        self._restart_count: int | None = None  # TORCHELASTIC_RESTART_COUNT of its last round
        self._script_beats = False  # a process of this rank has beaten: the next ones must too
        self.stage = ActorStage.READY
        return self.identity()

    def _setup_checkpoints(self) -> None:
        """This rank's flash-checkpoint slots live in a folder this agent owns (it outlives the
        training process): see dlu_elastic.checkpoint.agent."""
        self._checkpoints: AgentCheckpoints | None = (
            None if self.class_mode else AgentCheckpoints.of_worker(self.info, self.elastic.checkpoint)
        )

    def receive_replica(self, run: str, rank: int, slot: int, data: bytes | None) -> None:
        """A copy of a buddied rank's checkpoint slot (see dlu_elastic.checkpoint.replica)."""
        checkpoints = getattr(self, "_checkpoints", None)
        if checkpoints is None:
            raise RuntimeError(f"{self.info.actor_name} keeps no checkpoint replicas")
        checkpoints.receive_replica(run, rank, slot, data)

    def _finished(self, round_: int, interval: float) -> Result | None:
        """Its process exited 0: its restore report (if any) goes out before FINISH shows."""
        checkpoints = getattr(self, "_checkpoints", None)
        if checkpoints is not None:
            checkpoints.flush_report()
        return super()._finished(round_, interval)

    def _end_checkpoints(self) -> None:
        checkpoints = getattr(self, "_checkpoints", None)
        if checkpoints is not None:
            checkpoints.end()

    def _check_entrypoint(self) -> None:
        """Self check without importing user code (it runs in the training process)."""
        spec = ProcessSpec(self.info.entrypoint, workdir=self.info.workdir)
        try:
            entry = spec.resolved_entrypoint()
        except ValueError as exc:
            raise EntrypointError(str(exc)) from exc
        if entry.kind is EntrypointKind.SCRIPT:
            path = (
                entry.target
                if os.path.isabs(entry.target)
                else os.path.join(self.info.workdir or "", entry.target)
            )
            if not os.path.isfile(path):
                raise EntrypointError(f"training script {entry.target!r} not found at {path}")
        else:
            import importlib.util

            module = entry.module if entry.kind is EntrypointKind.OBJECT else entry.target
            if importlib.util.find_spec(module) is None:
                raise EntrypointError(f"training module {module!r} not found")

    def status(self) -> dict[str, Any]:
        """The actor's status, plus its current training process (debugging, fault injection)."""
        process = getattr(self, "process", None)
        return {
            **super().status(),
            "process_pid": process.pid if process is not None and process.alive else None,
            "training_ended": self.training_ended,
        }

    def _usage_pids(self) -> list[int]:
        """The agent and its training process (forked by the node's zygote, not its child)."""
        process = getattr(self, "process", None)
        own = super()._usage_pids()
        return [*own, process.pid] if process is not None and process.alive else own

    def rendezvous_address(self) -> tuple[str, int]:
        """Where a node-check pair led by this rank meets."""
        return self.host, free_port(self.host)

    def node_check(
        self, node: str, pair_rank: int, pair_size: int, host: str, port: int, settings: str
    ) -> dict[str, Any]:
        """Run the probe in a forked process; report its time or its error."""
        env = {
            PROBE_RANK_ENV: str(pair_rank),
            PROBE_SIZE_ENV: str(pair_size),
            PROBE_SETTINGS_ENV: settings,
            PROBE_NODE_ENV: node,
            "MASTER_ADDR": host,
            "MASTER_PORT": str(port),
        }
        spec = ProcessSpec(PROBE_ENTRY, env=env, setup_process_group=False, device=self._device())
        process = self.launcher.start(spec)
        timeout = float(json.loads(settings)["timeout_s"]) * 3 + 10
        code = process.wait(timeout)
        if code is None:
            process.terminate(1.0)
            return {"node": node, "elapsed_s": None, "error": f"probe did not finish in {timeout:.0f}s"}
        elapsed = [
            e.metric
            for e in process.events()
            if e.kind is ProcessEventKind.HEARTBEAT and e.metric is not None
        ]
        if code != 0 or not elapsed:
            error = process.last_failure or f"probe exited with code {code}"
            return {"node": node, "elapsed_s": None, "error": error.strip().splitlines()[-1]}
        return {"node": node, "elapsed_s": elapsed[-1], "error": None}

    def _device(self) -> str:
        return os.environ.get("DLU_DEVICE", "cpu")

    def start(self) -> None:
        if self.stage is ActorStage.RUNNING:
            return
        if self.class_mode:
            self._start_in_actor()
            return
        self.stage = ActorStage.RUNNING
        self.started_at = time.time()
        self.health.pause()  # this agent watches its process itself (see _watch)
        self._thread = threading.Thread(
            target=self._agent, name=f"dlu-agent-{self.info.actor_name}", daemon=True
        )
        self._thread.start()

    def _start_in_actor(self) -> None:
        """A class with @rpc methods (an RL role) lives in the actor: one rendezvous, a process
        group in this process, then the instance serves calls (and runs run(), if it has one)."""
        endpoint = self._endpoint()
        client = ElasticClient(endpoint["address"], endpoint["token"], timeout_s=10.0, wait_for_ready=True)
        try:
            state = client.rendezvous(**self._join_args(free_port(self.host)), timeout_s=600.0)
        finally:
            client.close()
        spec = self._process_spec(state, agent_store=False)  # this process hosts its own
        redirect_this_process(spec.output)  # the rank lives in this actor: so does its output
        os.environ.update({**spec.env, "DLU_DEVICE": spec.device})
        if spec.setup_process_group:
            import torch.distributed as dist

            dist.init_process_group(spec.resolved_backend())
        self.entry = LoadedEntrypoint(self.info.entrypoint, self.info.workdir)
        self._rpc_ready.set()
        super().start()

    def stop(self) -> None:
        self._stop.set()
        if self.process is not None:
            self.process.terminate(2.0)
        self._end_store(wait=True)
        self._end_checkpoints()

    # the agent loop (one round's steps: agent_loop.py) ------------------------------------------
    def _agent(self) -> None:
        try:
            result = self._train()
        except Exception as exc:
            import traceback

            result = Result(Outcome.FAILED, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        self.result = result
        self.finished_at = time.time()
        self.stage = ActorStage.FINISH if result.outcome is Outcome.SUCCESS else ActorStage.FAILED

    def _train(self) -> Result:
        self._client = self._connect()
        try:
            while not self._stop.is_set():
                self._ready_to_fork()
                listener = store.listen(self.host) if self.elastic.agent_store else None
                try:
                    port = int(listener.getsockname()[1]) if listener is not None else free_port(self.host)
                    try:
                        state = self._client.rendezvous(**self._join_args(port), timeout_s=600.0)
                    except RendezvousError as exc:
                        # The ElasticMaster died while this agent joined: wait for the one the
                        # PrimeMaster sets up again (its endpoint is published), then join it.
                        if exc.code in MASTER_GONE and self._await_new_master(MASTER_GONE_PATIENCE_S, 0.5):
                            continue
                        raise
                    self.rounds += 1
                    if listener is not None and (state.master_addr, state.master_port) == (self.host, port):
                        self._start_store(listener, port)  # not waited for: see store.py
                finally:
                    if listener is not None:
                        listener.close()  # the store has its own copy
                if self.process is not None:
                    self.process.end(2.0)  # the previous round's: gone before the next starts
                self.process = self.launcher.start(self._process_spec(state))
                if self._checkpoints is not None:
                    self._checkpoints.training_process(self.process.pid)
                try:
                    outcome = self._watch(state.round, self.process)
                finally:
                    self._retire_store()
                if outcome is not None:
                    return outcome
            return Result(Outcome.FAILED, "stopped")
        finally:
            self._end_store()
            self._client.close()

    def _ready_to_fork(self) -> None:
        """Join a round only once this node's zygote forks at once. A round completes when its
        last agent joins; its peers' processes then start and wait for this rank's in the
        process group's init. An agent whose zygote still imports torch (an actor Ray rebuilt,
        a fresh node: 20 s and more on a loaded machine) would keep them waiting there, past
        their first-beat allowance, and their agents would kill them as hung and count it on
        them (issue 27): its peers wait in the rendezvous instead, where nothing is judged."""
        try:
            self.launcher.warm_up(ZYGOTE_READY_S)
        except RuntimeError as exc:  # its process start tries again, and reports what fails
            logger.warning("%s: %s; joining the round anyway", self.info.actor_name, exc)

    # the agent's TCPStore (see dlu_elastic.worker.store) ----------------------------------------
    def _start_store(self, listener: socket.socket, port: int) -> None:
        """Fork this round's store on the socket this agent offered the rendezvous."""
        env = {store.HOST_ENV: self.host, store.PORT_ENV: str(port)}
        spec = ProcessSpec(
            store.ENTRYPOINT,
            env=env,
            setup_process_group=False,
            device=self._device(),
            pass_fds=(listener.fileno(),),
        )
        self._store = self.launcher.start(spec)

    def _store_failure(self) -> str | None:
        """Why the store this agent hosts for the round ended, if it did (the round cannot go on)."""
        hosted = self._store
        if hosted is None or hosted.ending_code() is None:
            return None
        failure = (hosted.last_failure or "").strip().splitlines()
        return f"the agent's TCPStore exited: {failure[-1] if failure else f'code {hosted.poll()}'}"

    def _retire_store(self) -> None:
        """The round is over: its store is ended once the next round trains (`_training_again`),
        not now. Its exit (10 to 14 ms of kernel time for a process forked from the torch
        zygote) would otherwise compete for the CPU with the next round's start; it serves
        nobody meanwhile (the next round has another port). At most one is kept."""
        self._end_retired_store()
        self._retired_store, self._store = self._store, None

    def _end_retired_store(self) -> None:
        retired, self._retired_store = getattr(self, "_retired_store", None), None
        if retired is not None:
            retired.request_stop()  # no need to wait: nothing uses its port

    def _training_again(self) -> None:
        self._end_retired_store()

    def _end_store(self, wait: bool = False) -> None:
        self._end_retired_store()
        hosted = getattr(self, "_store", None)
        self._store = None
        if hosted is not None:
            if wait:
                hosted.terminate(1.0)
            else:
                hosted.request_stop()  # a new round's store uses another port: no need to wait

    def _join_args(self, port: int) -> dict[str, Any]:
        """Join arguments offering `port` (this agent's store, if the round chooses it)."""
        info = self.info
        return {
            "agent_id": info.actor_name,
            "node_id": self.node_id or info.actor_name,
            "local_ranks": 1,
            "host": self.host,
            "free_port": port,
            "node_rank_hint": info.node_rank * info.local_world_size + info.local_rank,
        }

    def _process_spec(self, state: pb.RendezvousState, agent_store: bool = True) -> ProcessSpec:
        info = self.info
        self._restart_count = restart_count(state, self._restart_count)
        env = torchrun_env(
            state,
            restarts=self._restart_count,
            local_rank=info.local_rank,
            local_world_size=info.local_world_size,
            node_rank=info.node_rank,
            role=info.role,
            run_id=f"{info.job}-{info.role}",
            max_restarts=self.role_spec.max_restart,
        )
        env[store.AGENT_STORE_ENV] = str(agent_store and self.elastic.agent_store)
        env[error_file.ENV] = error_file.prepare(
            error_file.error_file(log_root(self.logs), info.job, info.run_id, info.role, state.rank_offset)
        )
        env["DLU_CONFIG_JSON"] = json.dumps(info.config)
        if self._checkpoints is not None:
            env.update(self._checkpoints.env())
        return ProcessSpec(
            info.entrypoint,
            env=env,
            workdir=info.workdir,
            setup_process_group=self.elastic.setup_process_group,
            backend=self.elastic.comm_backend.value,
            device=self._device(),
            output=RankOutput.of(
                self.logs,
                job=info.job,
                run_id=info.run_id,
                role=info.role,
                rank=state.rank_offset,
                attempt=f"round {state.round}, restart {env['TORCHELASTIC_RESTART_COUNT']}",
            ),
        )
