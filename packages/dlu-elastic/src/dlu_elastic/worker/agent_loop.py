"""The rank agent's side of the ElasticMaster's protocol: follow a round, restart or stop.

`ElasticAgentLoop` holds what the agent does between joining a round and leaving it: find the
master (and follow it when it moves, tier 5), watch the training process and relay its beats,
report its failure and wait for the master's decision, and keep a rank whose process exited 0
in its round until training ends or a new round reruns it (see finished.py). The Ray actor
shell (setup, start, the rendezvous loop, the agent's store) is `actor.ElasticWorkerActor`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_api.spec.models import HealthSettings
from dlu_api.vocabulary import ActorStage
from dlu_elastic.rendezvous.client import ElasticClient, HeldBeat, RendezvousError
from dlu_elastic.rendezvous.round_watch import RECHECK_S
from dlu_elastic.worker import error_file
from dlu_elastic.worker.finished import AfterSuccess, after_success
from dlu_elastic.worker.process import ProcessEventKind, TrainingProcess
from dlu_elastic.worker.watchdog import WAITING_STATES, ProcessWatch, process_state
from dlu_prime.naming import NAMESPACE, endpoint_key, master_name
from dlu_prime.worker.actor import WorkerActor
from dlu_prime.worker.entrypoint import Outcome, Result

logger = logging.getLogger(__name__)

# How often a rank beats: what keeps the master's view of its step and metric fresh, against the
# master's load (about 0.5 ms of its CPU per call). Not how soon a rank hears of a restart: its
# beat is held by the master (`_held_beat`), which answers it the moment a round changes or a
# decision is made. 0.5 s for small roles (0.1 s before beats were held: 4 ranks then cost the
# ElasticMaster 4% of a core and left less for a restart), 500 calls/s at most for large roles
# (2 s at 1,000 ranks).
MIN_HEARTBEAT_INTERVAL_S = 0.5
HEARTBEAT_CALLS_PER_S = 500.0


# A heartbeat is a tiny call: one that takes longer means the master is gone or swamped, and
# the rank must not sit in it for the client's 10 s (a restarted ElasticMaster would wait that long).
HEARTBEAT_TIMEOUT_S = 2.0


def heartbeat_interval(world_size: int) -> float:
    return max(MIN_HEARTBEAT_INTERVAL_S, world_size / HEARTBEAT_CALLS_PER_S)


# After a call found the ElasticMaster gone (and no new one published yet), the agent also looks
# up the master's endpoint this often (at most HEARTBEAT_CALLS_PER_S lookups a second for the
# role), beside its beat to the dead address, which waits out its whole deadline: every rank
# finds the replacement within one lookup of its publishing, at about the same time. Lookups
# stop when a beat is answered again (a blip) or after MASTER_GONE_PATIENCE_S; a failure report
# waits that long for the new master before it errs.
MASTER_LOOKUP_INTERVAL_S = 0.1
MASTER_GONE_PATIENCE_S = 30.0


def master_lookup_interval(world_size: int) -> float:
    return max(MASTER_LOOKUP_INTERVAL_S, world_size / HEARTBEAT_CALLS_PER_S)


def _written_error(process: TrainingProcess, code: int) -> str:
    """Why a process that sent no FAILURE (it exited by `os._exit` or a signal) failed: what it
    wrote to its torchrun error file, if anything, else its exit code."""
    path = process.spec.env.get(error_file.ENV)
    written = error_file.read_error(path)
    if written is None:
        return f"training process exited with code {code}"
    return f"training process exited with code {code}\n(from the rank's error file {path})\n{written}"


def _world_size(process: TrainingProcess) -> int:
    return int(process.spec.env.get("WORLD_SIZE") or 1)


# A hung process is reported first and killed after: killing it first fails its peers'
# collectives, and a peer then seen running and silent past its timeout would be blamed too.
HUNG_EXIT_CODE = -9  # reported for it: SIGKILL after the grace (a stopped process ignores SIGTERM)
HUNG_KILL_GRACE_S = 0.5
POLL_INTERVAL_S = 0.02  # the agent loop's tick; a process's exit wakes it at once
# After a failure report the agent's beat is held by the master until it decides (a new round,
# or a stop), so the restart is not left waiting for the agent's next beat; asked again after this.
DECISION_HOLD_S = 1.0
# Codes a call gets when the ElasticMaster died or was replaced (new address or token).
_ACTIONS = {pb.ACTION_RESTART: "restart", pb.ACTION_STOP: "stop", pb.ACTION_HALT: "halt"}
MASTER_GONE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAUTHENTICATED}
)


class ElasticAgentLoop(WorkerActor):
    """The agent loop's steps; `actor.ElasticWorkerActor` sets these attributes up."""

    _health: HealthSettings
    _client: ElasticClient
    _token: str
    _script_beats: bool
    _master_gone_at: float | None = None  # when a call found the master gone (see _watch)
    _master_moves: int = 0  # how often this agent switched to a new ElasticMaster
    training_ended: bool = False  # finished, and the master said training is over: asks no more

    def _store_failure(self) -> str | None:
        """Why the round's store this agent hosts ended, if it did (see actor.py); None here."""
        return None

    def _training_again(self) -> None:
        """This round's process beat its first step (actor.py ends the last round's store)."""

    def _endpoint(self) -> dict[str, str]:
        import ray

        master = ray.get_actor(master_name(self.info.job), namespace=NAMESPACE)
        while not self._stop.is_set():
            found: Any = ray.get(master.lookup.remote(endpoint_key(self.info.role)), timeout=30)
            if found:
                return dict(found)
            time.sleep(0.1)
        raise RuntimeError("stopped before the ElasticMaster published its endpoint")

    def _connect(self) -> ElasticClient:
        endpoint = self._endpoint()
        self._token = endpoint["token"]
        return ElasticClient(endpoint["address"], endpoint["token"], timeout_s=10.0, wait_for_ready=True)

    def _master_moved(self) -> bool:
        """After a failed call: has the ElasticMaster been restarted elsewhere (tier 5)? If so,
        switch to it; training then joins its rendezvous again (the actor is not restarted)."""
        try:
            found = self._endpoint()
        except Exception:
            return False
        if found["address"] == self._client.address and found["token"] == self._token:
            return False
        logger.info("%s: ElasticMaster moved to %s", self.info.actor_name, found["address"])
        self._client.close()
        self._token = found["token"]
        self._client = ElasticClient(found["address"], found["token"], timeout_s=10.0, wait_for_ready=True)
        self._master_moves += 1
        return True

    def _await_new_master(self, patience_s: float, interval: float) -> bool:
        """After a call found the ElasticMaster gone: look up its endpoint every `interval`
        until a new one is published (True, switched to it) or `patience_s` passed (False)."""
        deadline = time.monotonic() + patience_s
        while not self._stop.is_set():
            if self._master_moved():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)
        return False

    def _watch(self, round_: int, process: TrainingProcess) -> Result | None:
        """Follow one training process. None: the master restarted training (run again).

        A process that goes silent or hangs (see `ProcessWatch`) is killed here and reported as
        this rank's failure, like a crash. One heartbeat is always on its way, held by the
        master for about `interval` (`_held_beat`): a new round opened for a peer's failure
        reaches this rank the moment it opens, not at its next beat."""
        world = _world_size(process)
        interval, lookup_every = heartbeat_interval(world), master_lookup_interval(world)
        watch = ProcessWatch(
            self._health.heartbeat_timeout_s,
            self._health.hang_timeout_s,
            started_at=time.monotonic() if self._script_beats else None,
        )
        beat: HeldBeat | None = None
        sent = float("-inf")
        first_beat = True
        looked = float("-inf")
        self._master_gone_at = None
        try:
            while True:
                process.activity.clear()  # before reading: news arriving from now on wakes the wait
                now = time.monotonic()
                for event in process.events():
                    if event.kind is ProcessEventKind.HEARTBEAT:
                        self.health.relay(event.step, event.metric)
                        watch.beat(event.step, now)
                        self._script_beats = True
                        if first_beat:  # training (again): the masters hear of it now, not at their next look
                            first_beat = False
                            if beat is not None:
                                beat.cancel()  # resent now with the new step
                                beat, sent = None, float("-inf")
                            self._wake_master()
                            self._training_again()
                    elif event.kind is ProcessEventKind.ERROR_REPORT and event.message:
                        self.health.report(event.message)
                code = process.ending_code()
                hung = None
                if code is None and watch.suspect(now):
                    hung = watch.judge(now, waiting=process_state(process.pid) in WAITING_STATES)
                if code is None and hung is None:
                    hung = self._store_failure()
                if hung is not None:  # reported before the kill: its peers wake when it dies
                    logger.warning("%s: %s; killing it", self.info.actor_name, hung)
                    return self._failed(round_, process, HUNG_EXIT_CODE, hung, interval)
                if code == 0:
                    return self._finished(round_, interval)
                if code is not None:
                    return self._failed(round_, process, code, hung, interval)
                if beat is not None and beat.done():
                    action = self._beat_action(beat, held=True)
                    beat = None
                    if action == "halt":  # a peer failed: every decision ends this process
                        process.request_stop()
                        action = self._wait_for_decision(round_, interval)
                    if action != "none":
                        process.request_stop()  # it dies while this agent joins the next round
                        if action == "stop":
                            process.terminate(2.0)
                            return Result(
                                Outcome.FAILED, "the ElasticMaster stopped training (restart limit reached)"
                            )
                        return None
                gone_at = self._master_gone_at
                if gone_at is not None and now - looked >= lookup_every:
                    looked = now
                    if self._master_moved():
                        process.request_stop()  # the new master's round reruns it
                        return None
                    if now - gone_at >= MASTER_GONE_PATIENCE_S:
                        self._master_gone_at = None
                if beat is None and now - sent >= interval:
                    beat, sent = self._held_beat(round_, interval), now
                    beat.on_done(process.activity.set)
                if self._stop.is_set():
                    process.terminate(2.0)
                    return Result(Outcome.FAILED, "stopped")
                process.activity.wait(POLL_INTERVAL_S)  # an exit, a failure or the beat's answer ends it
        finally:
            if beat is not None:
                beat.cancel()

    def _finished(self, round_: int, interval: float) -> Result | None:
        """This rank's process exited 0: show FINISH but stay in the round until training ends,
        and run again if a peer's failure opens a new round (`finished.after_success`). None:
        run again. The round's store, if this agent hosts it, stays up for the peers meanwhile."""
        success = Result(Outcome.SUCCESS)
        held = 0.0  # asked at once first: a restart under way shows no FINISH; then held beats
        while not self._stop.is_set():
            asked = time.monotonic()
            moves = self._master_moves
            try:
                action = self._beat(round_, wait_s=held, idle=True)
            except RendezvousError as exc:  # not a refusal the protocol knows: keep the success
                logger.warning(
                    "%s: finished, then the ElasticMaster refused a beat: %s", self.info.actor_name, exc
                )
                return success
            if action == "restart" and self._master_moves != moves:
                # The master was replaced: ask the new one before running again. If every rank
                # had finished, it says training is over; otherwise it refuses our old round.
                held = 0.0
                continue
            step = after_success(action)
            if step is AfterSuccess.RERUN:
                logger.info(
                    "%s: its process exited 0%s, then a new rendezvous round opened: it runs again",
                    self.info.actor_name,
                    " (FINISH shown)" if self.stage is ActorStage.FINISH else "",
                )
                self.result = None
                self.finished_at = None
                self.stage = ActorStage.RUNNING
                return None
            if step is AfterSuccess.DONE:
                self.training_ended = True
                return success
            if self.stage is not ActorStage.FINISH:  # asked once first: a restart under way shows no FINISH
                self.result = success
                self.finished_at = time.time()
                self.stage = ActorStage.FINISH
            held = interval + RECHECK_S  # a peer's failure reruns this rank the moment it is known
            time.sleep(max(0.0, interval - (time.monotonic() - asked)))
        return success

    def _failed(
        self, round_: int, process: TrainingProcess, code: int, hung: str | None, interval: float
    ) -> Result | None:
        """Report this rank's failure and wait for the master's decision; a `hung` process is
        killed once reported. The process may still be in its teardown (its FAILURE event came
        first): the next round's process is forked only once it has exited (`_train` in
        actor.py), so a GPU's memory is free by then."""
        error = hung or process.last_failure or _written_error(process, code)
        try:
            if self._master_gone_at is not None and self._master_moved():
                return None  # it failed as its peers left for the new master's round: join it too
            self._client.report_failure(
                round=round_,
                agent_id=self.info.actor_name,
                local_rank=self.info.local_rank,
                exit_code=code,
                error=error,
                timeout_s=HEARTBEAT_TIMEOUT_S,  # a tiny call: not the client's 10 s on a dead master
            )
        except RendezvousError as exc:
            if exc.code in MASTER_GONE and self._await_new_master(
                MASTER_GONE_PATIENCE_S, master_lookup_interval(_world_size(process))
            ):
                return None  # the new master knows nothing of this round: join again
            if exc.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
        finally:
            if hung is not None:  # a hung process: reported first, killed now (see HUNG_EXIT_CODE)
                process.terminate(HUNG_KILL_GRACE_S)
        action = self._wait_for_decision(round_, interval)
        return None if action == "restart" else Result(Outcome.FAILED, error)

    def _held_beat(self, round_: int, interval: float) -> HeldBeat:
        """A beat the master holds for `interval` at least (a held call is answered up to one
        `RECHECK_S` slot early, hence the slot added) or until it decides something."""
        snapshot = self.health.snapshot()
        return self._client.heartbeat_async(
            round=round_,
            agent_id=self.info.actor_name,
            step=int(snapshot["step"]),
            metric=snapshot["metric"],
            wait_s=interval + RECHECK_S,
            timeout_s=HEARTBEAT_TIMEOUT_S,
        )

    def _beat(self, round_: int, wait_s: float = 0.0, idle: bool = False) -> str:
        """One heartbeat; with `wait_s` the master holds it until it decides (see the proto);
        `idle`: no training process of this rank runs (a halt is no news)."""
        snapshot = self.health.snapshot()
        try:
            action = self._client.heartbeat(
                round=round_,
                agent_id=self.info.actor_name,
                step=int(snapshot["step"]),
                metric=snapshot["metric"],
                wait_s=wait_s,
                timeout_s=HEARTBEAT_TIMEOUT_S,
                idle=idle,
            )
        except RendezvousError as exc:
            return self._beat_refused(exc, held=wait_s > 0)
        return _ACTIONS.get(action, "none")

    def _beat_action(self, beat: HeldBeat, held: bool) -> str:
        try:
            action = beat.action()
        except RendezvousError as exc:
            return self._beat_refused(exc, held)
        self._master_gone_at = None  # answered: the master is there
        return _ACTIONS.get(action, "none")

    def _beat_refused(self, exc: RendezvousError, held: bool) -> str:
        if exc.code == grpc.StatusCode.FAILED_PRECONDITION:
            return "restart"  # the master opened a new round
        if exc.code in MASTER_GONE or (held and exc.code == grpc.StatusCode.CANCELLED):
            # a blip, or a held beat ended by the master's shutdown: training goes on until told
            if self._master_moved():
                return "restart"
            if self._master_gone_at is None:
                self._master_gone_at = time.monotonic()  # look its replacement up (see _watch)
            return "none"
        raise exc

    def _wait_for_decision(self, round_: int, interval: float) -> str:
        """After our process failed: the master either restarts every rank or stops. Held beats
        bring the decision the moment it is made; a master that answers at once (an older one)
        is asked again every `interval`."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not self._stop.is_set():
            asked = time.monotonic()
            action = self._beat(round_, wait_s=DECISION_HOLD_S, idle=True)
            if action in ("restart", "stop"):
                return action
            time.sleep(max(0.0, interval - (time.monotonic() - asked)))
        return "stop"
