"""ElasticMaster: the SubMaster of an elastic role.

It serves the role's gRPC rendezvous, runs the node check before training (`check_child`),
starts the ranks, and restarts training in place when a training process fails (tier 1 of the
failover ladder): it opens a new rendezvous round, every rank sees its heartbeat refused as
stale, stops its process and joins again, without any actor restart.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dlu.elastic.v1 import elastic_pb2 as pb
from dlu_api.spec.models import ElasticSettings, NodeCheckSettings
from dlu_api.vocabulary import EventKind, InPlaceDecision, InPlaceVerdict, Tier
from dlu_elastic.blame import BlameWindow, Report, is_peer_failure
from dlu_elastic.inplace_timer import InPlaceTimer
from dlu_elastic.node_check.plan import (
    NodeCheckVerdict,
    NodeResult,
    judge,
    pair_round1,
    pair_round2,
    waves,
)
from dlu_elastic.rendezvous.gc_policy import defer_full_collections
from dlu_elastic.rendezvous.service import ElasticServicer, RunningServer, serve
from dlu_elastic.rendezvous.state import Rendezvous
from dlu_prime.worker.submaster import SubMaster

logger = logging.getLogger(__name__)

PROBE_GRACE_S = 30.0  # on top of the node check timeout: process start and teardown
PRIME_ANSWER_S = 90.0  # a PrimeMaster rebuilt by Ray answers within seconds
METRICS_REFRESH_S = 2.0  # Ray exports a gauge only while it is set: set ours again this often


class ElasticMaster(SubMaster):
    def setup(self) -> None:
        if self.spec is None or self.spec.elastic is None:
            raise RuntimeError(f"role {self.role}: the ElasticMaster needs the role's elastic settings")
        self.elastic: ElasticSettings = self.spec.elastic
        nproc = self.elastic.nproc_per_node
        self.rendezvous = Rendezvous(
            min_nodes=self.elastic.min_nodes * nproc,
            max_nodes=self.elastic.max_nodes * nproc,
            grace_s=self.elastic.rendezvous_grace_s,
        )
        self.token = secrets.token_urlsafe(24)
        self._lock = threading.Lock()
        self.restarts = 0
        self.stopping = False
        self._joined_round = -1  # a round whose failure joined a failover in flight
        self._counted_round = -1  # the last round a fault of its own was counted in (dedup)
        self._halted_round = -1  # a round whose failure is being decided (see _pending_action)
        self._prime: Any = None  # the PrimeMaster's handle, once looked up
        self.last_failure = ""
        self._inplace = InPlaceTimer()
        self._blame = BlameWindow()
        self._blame_lock = threading.Lock()
        self._timer_lock = threading.Lock()
        # Failures are judged here, one at a time, off the gRPC threads: a ReportFailure is
        # answered at once (the agent's deadline is a tiny call's), the decision reaches the
        # ranks through their held beats, and no lock is held across the PrimeMaster's call.
        self._judging = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dlu-judge-{self.role}")
        self._metrics: Any = None  # JobMetrics, created on first use (it imports Ray's metrics)
        self._metrics_refreshed = 0.0
        self._members: list[int] | None = None  # ranks of the role now, once a resize said so
        # A replacement for a role whose ranks all finished: tell them training is over (before
        # the endpoint is published, so no finished rank follows it into a new round).
        training_over = self.role_finished()
        servicer = ElasticServicer(
            self.rendezvous,
            on_heartbeat=self._on_heartbeat,
            on_failure=self._on_failure,
            pending_action=self._pending_action,
            training_over=training_over,
        )
        import ray

        host = ray.util.get_node_ip_address()
        defer_full_collections()  # this actor's process holds every agent's rendezvous call
        self.server: RunningServer = serve(host, 0, token=self.token, servicer=servicer)
        self.publish({"address": self.server.address, "token": self.token})
        logger.info("role %s: elastic rendezvous serving at %s", self.role, self.server.address)
        if training_over:
            logger.info("role %s: every rank had finished; they are told training is over", self.role)

    # node check --------------------------------------------------------------------------------
    def check_child(self) -> None:
        super().check_child()
        settings = self.elastic.node_check
        if not settings.enabled:
            return
        verdict = self._node_check(settings)
        if not verdict.ok:
            # As the seed says: restart the workers of the faulty nodes and check again.
            import ray

            from dlu_prime.naming import NAMESPACE, master_name

            names = self._actors_of_nodes(verdict.faulty)
            master = ray.get_actor(master_name(self.job), namespace=NAMESPACE)
            ray.get(master.restart_actors.remote(names, f"node check: faulty {', '.join(verdict.faulty)}"))
            verdict = self._node_check(settings)
        if not verdict.ok:
            raise RuntimeError(f"node check failed: {verdict.summary()}")

    def check_nodes(self, ranks: list[int]) -> None:
        """A resize adds these ranks: their nodes pass the node check before they join."""
        settings = self.elastic.node_check
        if not settings.enabled:
            return
        nproc = self.elastic.nproc_per_node
        wanted = {f"node-{rank // nproc}" for rank in ranks}
        leaders = {node: handle for node, handle in self._node_leaders(ranks).items() if node in wanted}
        verdict = self._node_check(settings, leaders)
        if not verdict.ok:
            raise RuntimeError(f"node check of the new node(s) failed: {verdict.summary()}")

    def _node_check(
        self, settings: NodeCheckSettings, leaders: dict[str, Any] | None = None
    ) -> NodeCheckVerdict:
        leaders = self._node_leaders() if leaders is None else leaders
        nodes = sorted(leaders)
        round1 = self._check_round(1, pair_round1(nodes), leaders, settings)
        pairs2 = pair_round2(round1, settings)
        round2 = self._check_round(2, pairs2, leaders, settings) if pairs2 else None
        verdict = judge(round1, round2, settings)
        self._job_metrics().node_check_scores({n: s for n, s in verdict.scores.items() if s is not None})
        scores = ", ".join(f"{n} {s:.3f}s" for n, s in sorted(verdict.scores.items()) if s is not None)
        self.record_event(EventKind.NODE_CHECK, f"{verdict.summary()} (scores: {scores})")
        if verdict.stragglers:
            self.record_event(EventKind.STRAGGLER, f"stragglers: {', '.join(verdict.stragglers)}")
        if verdict.faulty:
            self.record_event(EventKind.FAULTY_NODE, f"faulty: {', '.join(verdict.faulty)}")
        return verdict

    def _actors_of_nodes(self, nodes: Sequence[str]) -> list[str]:
        """Every rank's actor on the given nodes ('node-k' is the k-th group of nproc ranks)."""
        from dlu_prime.naming import actor_name

        nproc = self.elastic.nproc_per_node
        ranks = [int(node.split("-")[1]) * nproc + local for node in nodes for local in range(nproc)]
        return [actor_name(self.job, self.role, rank) for rank in ranks]

    def _node_leaders(self, ranks: list[int] | None = None) -> dict[str, Any]:
        """One worker per node (its lowest rank) runs the probe for its node."""
        import ray

        from dlu_prime.naming import NAMESPACE, actor_name

        nproc = self.elastic.nproc_per_node
        leaders: dict[str, int] = {}
        for rank in sorted(self.member_ranks() if ranks is None else ranks):
            leaders.setdefault(f"node-{rank // nproc}", rank)
        return {
            node: ray.get_actor(actor_name(self.job, self.role, rank), namespace=NAMESPACE)
            for node, rank in leaders.items()
        }

    # membership --------------------------------------------------------------------------------
    def member_ranks(self) -> list[int]:
        """The role's ranks now: all of them for a fixed size; for a MIN:MAX range the ones the
        PrimeMaster's state has (it starts with the nodes Ray could place, and resizes)."""
        if self._members is not None:
            return list(self._members)
        if self.elastic.min_nodes == self.elastic.max_nodes:
            return list(range(self.world_size))
        import ray

        from dlu_prime.naming import NAMESPACE, master_name

        master = ray.get_actor(master_name(self.job), namespace=NAMESPACE)
        status: Any = ray.get(master.status.remote(0), timeout=30)
        role = next(r for r in status["roles"] if r["name"] == self.role)
        return sorted(int(a["rank"]) for a in role["actors"] if int(a["rank"]) >= 0)

    @property
    def workers(self) -> list[Any]:
        import ray

        from dlu_prime.naming import NAMESPACE, actor_name

        return [
            ray.get_actor(actor_name(self.job, self.role, r), namespace=NAMESPACE)
            for r in self.member_ranks()
        ]

    def resize_members(self, ranks: list[int], new_ranks: list[int], timeout_s: float) -> int | None:
        """Re-form training around these ranks in place (tier 1's mechanism): a new round that
        expects exactly their agents; running ranks see their heartbeat refused as stale, stop
        their process and join again (no actor restarts); `new_ranks` are started and join.
        Waits for the round; returns its world size, or None when it did not complete in time."""
        import ray

        from dlu_elastic.rendezvous.state import StaleRoundError
        from dlu_prime.naming import NAMESPACE, actor_name

        names = [actor_name(self.job, self.role, r) for r in sorted(ranks)]
        with self._lock:
            self._members = sorted(ranks)
            new_round = self.rendezvous.restart_with(names)
            self._joined_round = -1
        with self._timer_lock:
            self._inplace.cancel()
        logger.info("role %s: resized to ranks %s (round %d)", self.role, sorted(ranks), new_round)
        if new_ranks:
            starting = [
                ray.get_actor(actor_name(self.job, self.role, r), namespace=NAMESPACE) for r in new_ranks
            ]
            ray.get([w.start.remote() for w in starting], timeout=timeout_s)
        try:
            done = self.rendezvous.wait_complete(timeout_s, new_round)
        except StaleRoundError:
            return None  # a failure restarted training again meanwhile: it re-forms by itself
        return None if done is None else done.world_size

    def _check_round(
        self,
        round_no: int,
        groups: list[tuple[str, ...]],
        leaders: dict[str, Any],
        settings: NodeCheckSettings,
    ) -> dict[str, NodeResult]:
        import ray

        results: dict[str, NodeResult] = {}
        for wave in waves(groups):
            calls: dict[str, Any] = {}
            for group in wave:
                host, port = ray.get(leaders[group[0]].rendezvous_address.remote(), timeout=60)
                for index, node in enumerate(group):
                    calls[node] = leaders[node].node_check.remote(
                        node, index, len(group), host, port, settings.model_dump_json()
                    )
            with ThreadPoolExecutor(max_workers=max(1, len(calls))) as pool:
                futures = {
                    node: pool.submit(ray.get, ref, timeout=settings.timeout_s + PROBE_GRACE_S)
                    for node, ref in calls.items()
                }
                for node, future in futures.items():
                    try:
                        found: Any = future.result()
                        results[node] = NodeResult(node, found.get("elapsed_s"), found.get("error"))
                    except Exception as exc:
                        results[node] = NodeResult(node, None, f"{type(exc).__name__}: {exc}")
        logger.info("role %s: node check round %d: %s", self.role, round_no, results)
        return results

    # training ----------------------------------------------------------------------------------
    def start(self) -> None:
        from dlu_prime.naming import actor_name

        # the first round completes once the placed ranks joined (no grace wait below MAX)
        self.rendezvous.expect(actor_name(self.job, self.role, r) for r in self.member_ranks())
        self.call_workers("start")

    def recover_running(self) -> None:
        """After this master was restarted (tier 5): nothing to restore. The ranks' actors keep
        running; their calls to the old master fail, they find this one through the published
        endpoint and join its rendezvous, and training continues from its checkpoint."""

    def failover(self, names: list[str], reason: str) -> None:
        """Role-level failover (tier 2): hold the healthy ranks in a new rendezvous round, have the
        PrimeMaster replace the failed ranks' actors (counted, limited, ready), then start them;
        they complete the round and every rank trains again."""
        import ray

        from dlu_prime.naming import NAMESPACE

        with self._lock:
            new_round = self.rendezvous.new_round()
        with self._timer_lock:
            self._inplace.cancel()
        logger.info("role %s: failover of %s (round %d): %s", self.role, ", ".join(names), new_round, reason)
        self.restart_actors(names, reason)
        ray.get([ray.get_actor(n, namespace=NAMESPACE).start.remote() for n in names], timeout=120)

    def _job_metrics(self) -> Any:
        if self._metrics is None:
            from dlu_prime.master.metrics import JobMetrics

            self._metrics = JobMetrics(self.job)
        return self._metrics

    def _ranks(self) -> list[str]:
        from dlu_prime.naming import actor_name

        return [actor_name(self.job, self.role, rank) for rank in self.member_ranks()]

    def _on_heartbeat(self, request: pb.HeartbeatRequest) -> int:
        now = time.monotonic()
        with self._timer_lock:
            took = self._inplace.beat(request.agent_id, request.round, request.step, now)
            refresh = now - self._metrics_refreshed >= METRICS_REFRESH_S
            if refresh:
                self._metrics_refreshed = now
        if took is not None:
            logger.info(
                "role %s: every rank training again %.2fs after the in-place restart", self.role, took
            )
            self._job_metrics().failover_done("in_place", took)
            self._note_inplace_done(took)
        if refresh and self._metrics is not None:
            self._metrics.refresh()
        return self._pending_action()

    def _pending_action(self) -> int:
        """What a beat is told (a held one once it is): stop (the restart limit was reached), or
        halt while a failure of the current round is being decided. Read on the server's loop:
        plain attributes, no lock."""
        if self.stopping:
            return pb.ACTION_STOP
        return pb.ACTION_HALT if self._halted_round == self.rendezvous.round else pb.ACTION_NONE

    def _on_failure(self, report: pb.FailureReport) -> None:
        """A training process failed: restart every rank in place (tier 1), once per round
        (dedup), blamed on the rank whose own error it is (`blame`). The PrimeMaster judges and
        counts it (so the count survives a restart of this master): a rank whose collective
        failed because a peer's actor died joins that peer's failover, which opens the next
        round itself."""
        seen = Report(report.round, report.agent_id, report.exit_code, report.error, time.monotonic())
        with self._blame_lock:
            blame = self._blame.offer(seen, seen.seen_at)
        if blame.act is not None:
            self._judge_later(blame.act)
        elif blame.recheck_at is not None:
            timer = threading.Timer(max(0.0, blame.recheck_at - time.monotonic()), self._blame_expired)
            timer.daemon = True
            timer.start()

    def _blame_expired(self) -> None:
        """No rank of the round reported an error of its own: blame the peer report held."""
        with self._blame_lock:
            held = self._blame.expire(time.monotonic())
        if held is not None:
            self._judge_later(held)

    def _judge_later(self, report: Report) -> None:
        """Hand the report to the judging thread (reports are judged in the order they came)."""
        self._judging.submit(self._judge_logged, report)

    def _judge_logged(self, report: Report) -> None:
        try:
            self._restart_for(report)
        except Exception:  # the PrimeMaster never answered: the ranks wait, then fail (see agent)
            logger.exception(
                "role %s: judging %s's failure of round %d failed", self.role, report.agent, report.round
            )

    def _restart_for(self, report: Report) -> None:
        """Decide one report (on the judging thread): the round's state is read and changed
        under the lock, the PrimeMaster's judgement is asked without it, so a resize, a
        failover or a heartbeat is served meanwhile; the round is read again after."""
        message = (
            f"round {report.round}: {report.agent} exited {report.exit_code}: {_last_line(report.error)}"
        )
        with self._lock:
            if self.stopping:
                return
            late = report.round != self.rendezvous.round or report.round == self._joined_round
            if late:
                # The round already moved on, or waits for a failover: being handled. A fault of
                # the rank's own found meanwhile (a hang, a crash) is still a fault: counted once
                # on it, recovered by the round under way (causality: never hidden in another).
                if is_peer_failure(report.error) or report.round <= self._counted_round:
                    return
                self._counted_round = report.round
            else:
                self.last_failure = report.error
                # Every decision ends the round's processes (a new round or a stop): the other
                # ranks stop theirs now, while the PrimeMaster judges, not once it has.
                self._halted_round = report.round
                self.server.wake_held()
        # One id for every retry of this report: a PrimeMaster that saved its judgement and died
        # before answering is asked again, and answers from what it saved (counted once).
        report_id = f"inplace-{secrets.token_hex(8)}"
        decision = self._note_inplace_restart(message, report.agent, report.error, late, report_id=report_id)
        with self._lock:
            if decision.verdict is InPlaceVerdict.STOP:
                self.stopping = True  # ranks are told to stop; the PrimeMaster ends the job
                self.server.wake_held()  # the ranks waiting for this decision hear it now
                return
            if late:
                logger.info("role %s: %s", self.role, decision.reason)
                return
            if decision.counted:
                self._counted_round = max(self._counted_round, report.round)
            if decision.verdict is InPlaceVerdict.JOIN:
                self._joined_round = report.round
                logger.info("role %s: %s", self.role, decision.reason)
                return
            if self.rendezvous.round != report.round:
                # A failover or a resize opened a round while this was judged: that round
                # re-forms training; the restart was counted, no round of its own is opened.
                logger.info(
                    "role %s: %s (round %d already re-forms training)",
                    self.role,
                    decision.reason or "restart",
                    self.rendezvous.round,
                )
                return
            self.restarts += 1
            new_round = self.rendezvous.new_round()
        ranks = self._ranks()  # may ask the PrimeMaster: no lock held
        with self._timer_lock:
            self._inplace.restarted(new_round, report.seen_at, ranks)

    def _note_inplace_done(self, took: float) -> None:
        """Put the in-place restart's end on the job's timeline, with its duration, so `dlu run`
        and `dlu status` show how long it took. Not waited for: this runs in a heartbeat."""
        import ray

        from dlu_prime.naming import NAMESPACE, master_name

        if not ray.is_initialized():
            return
        try:
            master = self._prime or ray.get_actor(master_name(self.job), namespace=NAMESPACE)
            self._prime = master
        except ValueError:
            return  # the PrimeMaster is being rebuilt: the metric has the figure
        message = f"every rank training again {took:.2f}s after the in-place restart"
        master.record_event.remote(EventKind.FAILOVER_DONE, message, self.role, Tier.IN_PLACE, took)

    def _note_inplace_restart(
        self, message: str, agent: str, error: str, recovered: bool = False, report_id: str | None = None
    ) -> InPlaceDecision:
        """Ask the PrimeMaster to judge and count the restart. A PrimeMaster being rebuilt by
        Ray (killed mid-failover, tier 6) answers after its recovery: retried until
        `PRIME_ANSWER_S`, so the fault is neither lost nor left to look like a silent rank."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        from dlu_prime.naming import NAMESPACE, master_name

        deadline = time.monotonic() + PRIME_ANSWER_S
        while True:
            try:
                # looked up once: a GCS round trip each time, on the path of every restart
                master = self._prime or ray.get_actor(master_name(self.job), namespace=NAMESPACE)
                self._prime = master
                decision: Any = ray.get(
                    master.note_inplace_restart.remote(
                        self.role, message, agent, error, recovered, report_id
                    ),
                    timeout=30,
                )
                assert isinstance(decision, InPlaceDecision)
                return decision
            except (ActorUnavailableError, RayActorError, GetTimeoutError, ValueError) as exc:
                self._prime = None
                if time.monotonic() >= deadline:
                    raise
                logger.info("role %s: the PrimeMaster did not answer (%s); asking again", self.role, exc)
                time.sleep(0.5)

    def serving(self) -> bool:
        return self.server.serving

    def stop(self) -> None:
        self._judging.shutdown(wait=False, cancel_futures=True)
        self.server.stop(1.0)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no error text)"
