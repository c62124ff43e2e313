"""`save(step, state)` into the agent's shared memory; `load()` the newest step all ranks have.

Commit rule (the whole protocol): a step is committed when every rank's slot holds it complete.
Each rank has two slots; a save overwrites the slot that does not hold the newest step this
process knows to be committed, so a crash mid-save (or a rank that never finishes its save)
leaves that step whole on every rank. A rank learns that its last save is committed at its
next save, from a counter in the round's TCPStore (each rank adds 1 after its copy; the step
is committed when the counter equals the world size); until then it keeps overwriting the same
in-flight slot. `load()` gathers every rank's complete steps (one all_gather) and restores the
largest step they share, so every rank resumes the same step; with none in memory it reads the
newest step every rank persisted to disk (fallback_load.py, disk.py), and otherwise says so.
After a resize (no step of the new world size anywhere) it restores the old world's newest
committed step when the state is a plain DDP one (resize_load.py, fallback_load.py), and says
why not otherwise.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dlu_elastic.checkpoint import fallback_load, replica_load, resize_load, shm
from dlu_elastic.checkpoint.broadcast import Told, broadcast_state, layout_of, tell
from dlu_elastic.checkpoint.layout import (
    CheckpointError,
    TensorEntry,
    check_same_layout,
    dumps_meta,
    split,
    table,
    unpack,
)
from dlu_elastic.checkpoint.restored import NoCheckpoint, Restored
from dlu_elastic.checkpoint.shm import ADOPTED_FILE, PERSIST_DIR_ENV, REPORT_FILE
from dlu_elastic.checkpoint.slot import PAYLOAD_OFFSET, SLOTS, SlotWriter, read_with, slot_path

__all__ = ["FlashCheckpointer", "NoCheckpoint", "Restored", "default", "load", "save", "wait"]

# Fault injection (tests, benchmarks): "<step>:<rank>": that rank's process SIGKILLs itself
# half-way through copying that step, in the job's first round only.
KILL_MID_SAVE_ENV = "DLU_FAULT_CHECKPOINT_KILL_MID_SAVE"
_KEY = "dlu_ckpt/done/{}"


def _rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK") or 0), int(os.environ.get("WORLD_SIZE") or 1)


def _store() -> Any:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    if not (dist.is_available() and dist.is_initialized()):
        raise CheckpointError(
            "a checkpoint of several ranks needs torch.distributed initialized before save/load "
            "(DLU does it unless the role sets elastic.setup_process_group: false)"
        )
    return distributed_c10d._get_default_store()  # pyright: ignore[reportPrivateUsage]


class FlashCheckpointer:
    """One training process's view of its agent's two slots (see the module docstring)."""

    def __init__(self, folder: Path | None = None, persist_dir: str | None = None) -> None:
        where = folder or (Path(os.environ[shm.FOLDER_ENV]) if os.environ.get(shm.FOLDER_ENV) else None)
        if where is None or not where.is_dir():
            raise CheckpointError(
                f"no checkpoint folder: run under a DLU elastic role (its agent sets {shm.FOLDER_ENV}) "
                "or pass FlashCheckpointer(folder=...)"
            )
        self.folder = where
        persist = persist_dir if persist_dir is not None else os.environ.get(PERSIST_DIR_ENV)
        self.persist_dir = Path(persist) if persist else None
        self._writers = [SlotWriter(slot_path(where, i)) for i in range(SLOTS)]
        self._layout: list[TensorEntry] | None = None
        self._committed: tuple[int, int] | None = None  # (slot, step) known committed by all
        self._inflight: tuple[int, int] | None = None  # (slot, step) saved, not known committed
        self._fresh = True  # no save or load yet in this process
        self._calls = 0  # gathers so far (every rank makes the same ones)
        self._shared: bool | None = None  # every rank but 0 saves None (a DDP job): see save
        self._cuda: Any = None  # a CudaCopier once a save met a CUDA tensor

    # save ---------------------------------------------------------------------------------------
    def save(self, step: int, state: Any) -> None:
        """Copy `state` into shared memory. CPU tensors: copied when it returns (the caller may
        then change them). CUDA tensors: copies queued on a side stream into page-locked slot
        memory; the caller may read them at once but must call `wait()` before modifying one
        in place (see cuda_copy.py). Every rank calls it with the same steps; a DDP job may
        pass its state on rank 0 and None elsewhere (load() hands rank 0's state to all)."""
        self.wait()
        rank, world = _rank_world()
        skeleton, tensors = split(state)
        entries, payload_len = table(tensors)
        if self._layout is not None:
            check_same_layout(self._layout, entries)
        if self._shared is None:  # once per process: the layout cannot change after the first save
            saved_none = self._gather(state is None, world)
            # shared: rank 0's state is the whole state (a DDP job, or a world of one)
            self._shared = not saved_none[0] and all(saved_none[1:])
        meta = dumps_meta(skeleton, entries, {"empty": state is None, "shared": self._shared})
        if self._fresh:
            self._forget_old_slots(rank, world)
        self._learn_commit(world)
        target = self._target()
        writer = self._writers[target]
        other = self._writers[1 - target]
        need = PAYLOAD_OFFSET + payload_len
        if self._cuda is not None and (writer.size < need or other.size < need):
            self._cuda.unpin_all()  # the mappings are about to be replaced
        writer.reserve(payload_len, others=max(0, need - other.size))
        other.reserve(payload_len, others=0)
        end_seq = writer.begin(rank, world, step)
        writer.write_meta(meta)
        self._layout = entries
        self._inflight = (target, step)

        def finish() -> None:
            writer.finish(end_seq, step, len(meta), payload_len, rank, world)
            if world > 1:
                _store().add(_KEY.format(step), 1)

        on_gpu: list[tuple[torch.Tensor, torch.Tensor]] = []
        if payload_len:
            dst = writer.payload(payload_len)
            kill_at = _kill_after(step, rank, len(tensors))
            for index, (entry, (_, tensor)) in enumerate(zip(entries, tensors, strict=True)):
                if index == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if not entry.nbytes:
                    continue
                src = tensor.detach().reshape(-1).view(torch.uint8)
                part = dst[entry.offset : entry.offset + entry.nbytes]
                if src.is_cuda:
                    on_gpu.append((part, src))
                else:
                    part.copy_(src)
            if on_gpu:
                if self._cuda is None:
                    from dlu_elastic.checkpoint.cuda_copy import CudaCopier

                    self._cuda = CudaCopier()
                self._cuda.pin(dst)
                self._cuda.copy(on_gpu, finish)
                return
            del dst
        finish()

    def wait(self) -> None:
        """Until the last save's CUDA copies landed (a no-op after a CPU save)."""
        if self._cuda is not None:
            self._cuda.wait()

    def _forget_old_slots(self, rank: int, world: int) -> None:
        """A process that saves before loading starts afresh: older slots must not win a load."""
        self._fresh = False
        for writer in self._writers:
            if writer.map is not None:
                writer.begin(rank, world)

    def _learn_commit(self, world: int) -> None:
        if self._inflight is None:
            return
        slot, step = self._inflight
        if world == 1 or int(_store().add(_KEY.format(step), 0)) >= world:
            self._committed, self._inflight = (slot, step), None

    def _target(self) -> int:
        if self._committed is not None:
            return 1 - self._committed[0]
        if self._inflight is not None:
            return self._inflight[0]  # nothing known committed: keep rewriting the same slot
        return 0

    # load ---------------------------------------------------------------------------------------
    def own_steps(self) -> dict[int, int]:
        """This rank's complete steps in memory: step -> slot."""
        steps: dict[int, int] = {}
        for index, writer in enumerate(self._writers):
            header = writer.header()
            if header is not None and header.complete:
                steps[header.step] = index
        return steps

    def load(self, missing_ok: bool = False) -> Restored | None:
        """The newest step every rank committed (same step on every rank): from memory, else
        from disk; None (missing_ok) or NoCheckpoint when there is none."""
        self.wait()
        rank, world = _rank_world()
        own = self.own_steps()
        mine = {step: (h.rank, h.world) for step, slot in own.items() if (h := self._writers[slot].header())}
        held = replica_load.held(self.folder)
        told = tell({step: slot_path(self.folder, slot) for step, slot in own.items()}, rank)
        news = (
            rank,
            mine,
            self._reached(),
            held,
            fallback_load.other_worlds(self.folder, rank, world, held),
            self._adopted(),
            told,
        )
        everyone = self._gather(news, world)
        reached = max((e[2] for e in everyone if e[2] is not None), default=None)
        self._fresh = False
        kept = [f"rank {e[0]}" for e in everyone if e[5]]
        note = f"{', '.join(kept)}: slots adopted from the agent it replaced" if kept else ""
        found = replica_load.plan([e[:4] for e in everyone], world)
        if found is not None:
            step, sources = found
            received = replica_load.exchange(self.folder, rank, sources) if sources else None
            overall = "replica" if sources else "memory"
            if received is not None:  # this rank's agent lost its slots: a buddy's copy
                self._void()
                state = self._share_empty(unpack(*received), world)
                where = f"rank {sources[rank].holder}'s agent"
                return self._report(Restored(step, state, "replica", where, why=note), reached, overall)
            slot = own[step]
            read = read_with(
                slot_path(self.folder, slot), lambda h, meta, payload: (h.seq, unpack(meta, payload))
            )
            if read is None:
                raise CheckpointError(f"slot {slot} of step {step} changed while it was read")
            seq, unpacked = read
            shares = [e[6].get(step) for e in everyone]  # what every rank told of this step
            if shares[rank] is not None and shares[rank][0] != seq:
                raise CheckpointError(f"slot {slot} of step {step} was rewritten during load()")
            self._committed, self._inflight = (slot, step), None
            state = self._share_empty(unpacked, world, shares)
            restored = Restored(step, state, "memory", str(slot_path(self.folder, slot)), why=note)
            return self._report(restored, reached, overall)
        resized = resize_load.plan([c for e in everyone for c in e[4]], world)

        def gather(mine: Any) -> list[Any]:
            return self._gather(mine, world)

        if isinstance(resized, resize_load.Plan):
            restored = fallback_load.from_old_world(self.folder, rank, world, resized, gather)
            self._void()  # the old world's slots: this world saves afresh
            return self._report(restored, reached)
        why = resized if isinstance(resized, str) else replica_load.why_none([e[:4] for e in everyone], world)
        restored = fallback_load.from_disk(
            self.persist_dir, rank, world, gather, lambda state: self._share_empty(state, world)
        )
        if restored is not None:
            self._void()  # memory holds nothing all ranks share: start over
            return self._report(replace(restored, why=restored.why or why), reached)
        if reached is not None or resized is not None:  # memory had steps: say why none served
            self._report(Restored(0, None, "nothing", "", why=f"{why}; none on disk"), reached)
        if missing_ok:
            return None
        seen = ", ".join(f"rank {e[0]}: {sorted(e[1]) or 'none'}" for e in everyone)
        raise NoCheckpoint(
            f"no step is committed by all {world} ranks (steps in memory: {seen}; disk: "
            f"{self.persist_dir or 'not configured'}): start from scratch, or load(missing_ok=True)"
        )

    def _void(self) -> None:
        """Both slots hold no step any more (the state came from elsewhere)."""
        rank, world = _rank_world()
        for writer in self._writers:
            if writer.map is not None:
                writer.begin(rank, world)

    def _adopted(self) -> bool:
        """Whether this rank's agent adopted its slots from the agent it replaced (told once)."""
        note = self.folder / ADOPTED_FILE
        if not note.exists():
            return False
        note.unlink(missing_ok=True)
        return True

    def _reached(self) -> int | None:
        """The newest step this rank's slots name (complete, or a save under way when it died)."""
        steps = [h.step for w in self._writers if (h := w.header()) is not None and h.step >= 0]
        return max(steps, default=None)

    def _report(self, restored: Restored, reached: int | None, overall: str | None = None) -> Restored:
        """Fill in the steps lost; rank 0 leaves the news for its agent (see REPORT_FILE), with
        `overall` as the source ("replica" when any rank took a buddy's copy)."""
        lost = None if reached is None else max(0, reached - restored.step)
        restored = replace(restored, lost_steps=lost)
        if _rank_world()[0] == 0:
            source = overall or restored.source
            source = f"{source} ({restored.why})" if restored.why else source
            report = {"step": restored.step, "source": source, "lost_steps": lost}
            tmp = self.folder / f".{REPORT_FILE}.tmp"
            tmp.write_text(json.dumps(report))
            tmp.replace(self.folder / REPORT_FILE)
        return restored

    def _gather(self, mine: Any, world: int) -> list[Any]:
        """Every rank's `mine`, through the round's TCPStore (no numpy: not *_object)."""
        if world == 1:
            return [mine]
        import torch.distributed as dist

        store = _store()
        self._calls += 1
        keys = [f"dlu_ckpt/gather/{self._calls}/{r}" for r in range(world)]
        store.set(keys[dist.get_rank()], pickle.dumps(mine))
        store.wait(keys)
        return [pickle.loads(value) for value in store.multi_get(keys)]  # one round trip, not world

    def _share_empty(self, state: tuple[bool, Any], world: int, told: list[Told | None] | None = None) -> Any:
        """A DDP job saved on rank 0 only: every rank gets rank 0's state (tensors broadcast).
        `told`: what every rank said of its slot of this step (load()'s news), else gathered."""
        empty, value = state
        if world == 1:
            return value
        if told is not None and all(t is not None for t in told):  # the same on every rank
            everyone = [(t[1], t[2]) for t in told if t is not None]
        else:  # one gather for both: who saved None, and rank 0's layout (what the others unpack)
            everyone = self._gather((empty, layout_of(value) if _rank_world()[0] == 0 else None), world)
        if not any(e for e, _ in everyone):
            return value
        shared = broadcast_state(value, 0, lambda mine: self._gather(mine, world), layout=everyone[0][1])
        return shared if empty else value

    def close(self) -> None:
        if self._cuda is not None:
            self._cuda.unpin_all()
        for writer in self._writers:
            writer.close()


def _kill_after(step: int, rank: int, count: int) -> int | None:
    """The tensor index at which the fault injection kills this save, if it does."""
    spec = os.environ.get(KILL_MID_SAVE_ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    at_step, at_rank = (int(x) for x in spec.split(":"))
    return max(1, count // 2) if (at_step, at_rank) == (step, rank) else None


_default: FlashCheckpointer | None = None


def default() -> FlashCheckpointer:
    global _default
    if _default is None:
        _default = FlashCheckpointer()
    return _default


def save(step: int, state: Any) -> None:
    """Save `state` as `step` into this rank's agent memory (see FlashCheckpointer.save)."""
    default().save(step, state)


def wait() -> None:
    """Until the last save's CUDA copies landed: call before modifying a saved CUDA tensor."""
    default().wait()


def load(missing_ok: bool = False) -> Restored | None:
    """The newest step every rank committed (see FlashCheckpointer.load)."""
    return default().load(missing_ok)
