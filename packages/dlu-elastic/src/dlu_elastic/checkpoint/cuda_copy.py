"""A save's CUDA tensors copied to the slot on a side stream, finished by a helper thread.

The slot's mapping is page-locked with cudaHostRegister (so the copies are DMA, asynchronous
to the host); the side stream first waits for the work queued so far on the caller's stream
(what produced the tensors), then copies. `save` returns once the copies are queued: the
training step after it runs while they proceed. A helper thread waits for the copies' event
and only then marks the slot complete (and tells the other ranks): a process killed before
that leaves a torn slot, never a wrong one. The caller must not modify a saved CUDA tensor in
place until `wait()` returns (the next save and load() wait first); reading it is fine.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)


class CudaCopier:
    def __init__(self) -> None:
        self.stream = torch.cuda.Stream()
        self._pinned: dict[int, int] = {}  # host pointer -> size, registered with CUDA
        self._pending: threading.Thread | None = None
        self._error: BaseException | None = None

    def pin(self, host: torch.Tensor) -> None:
        """Page-lock the slot's mapping once (copies into pageable memory are synchronous)."""
        ptr, size = host.data_ptr(), host.numel()
        if self._pinned.get(ptr) == size:
            return
        cudart = torch.cuda.cudart()
        assert cudart is not None
        code = cudart.cudaHostRegister(ptr, size, 0)
        if int(code) == 0:
            self._pinned[ptr] = size
        else:
            logger.warning("cudaHostRegister of a checkpoint slot failed (%s): copies will block", code)

    def unpin_all(self) -> None:
        """Before the slots are unmapped (a mapping that grows, the process's end)."""
        self.wait()
        cudart = torch.cuda.cudart()
        assert cudart is not None
        for ptr in list(self._pinned):
            cudart.cudaHostUnregister(ptr)
        self._pinned.clear()

    def copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], finish: Callable[[], None]) -> None:
        """Queue `dst.copy_(src)` for each pair on the side stream; `finish` runs once all landed."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
                src.record_stream(self.stream)  # src may be a temporary (a non-contiguous tensor's copy)
            done = torch.cuda.Event()
            done.record(self.stream)

        def land() -> None:
            try:
                done.synchronize()
                finish()
            except BaseException as exc:  # surfaced by wait()
                self._error = exc

        self._pending = threading.Thread(target=land, name="dlu-ckpt-d2h", daemon=True)
        self._pending.start()

    def wait(self) -> None:
        """Until the last save's copies landed and its slot is complete; re-raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()
        error, self._error = self._error, None
        if error is not None:
            raise error
