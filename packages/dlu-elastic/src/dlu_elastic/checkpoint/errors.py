"""The checkpoint errors, in a module of their own: the agent's side (slots, replicas, the
persister) raises them without importing torch, which only the training process needs."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint call that cannot do what was asked; the message says why and what to do."""


class LayoutChanged(CheckpointError):
    """The state's tensors changed shape or dtype between two saves of one process."""
