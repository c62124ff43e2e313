"""Runtime statistics as pure accumulators, and the sizing algorithms that read them."""

from dlu_prime.stats.resources import ProcessSampler, backlog_sample
from dlu_prime.stats.scaling import (
    SizeDecision,
    backlog_size,
    best_size,
    explore_scaling,
    linear_fraction,
    marginal_scaling,
    memory_relaunch,
)
from dlu_prime.stats.status import with_statistics
from dlu_prime.stats.throughput import Throughput, ThroughputMeter

__all__ = [
    "ProcessSampler",
    "SizeDecision",
    "Throughput",
    "ThroughputMeter",
    "backlog_sample",
    "backlog_size",
    "best_size",
    "explore_scaling",
    "linear_fraction",
    "marginal_scaling",
    "memory_relaunch",
    "with_statistics",
]
