"""Trainer-driven RL, mocked with tiny pure-Python "models" so it runs anywhere in seconds.

The trainer is the driver: each iteration it asks rollout workers for experience (scatter),
scores it with the reward role, asks the critic for values, and trains actor and critic
(call on all ranks). Actor and rollout are collocated (they share placement bundles).
"""

from __future__ import annotations

import random

from dlu_prime.runtime import current_worker, heartbeat, role_group, rpc


class Actor:
    """A policy with one parameter: the probability of choosing the 'good' action."""

    def __init__(self) -> None:
        self.p_good = 0.2

    @rpc
    def get_weights(self) -> float:
        return self.p_good

    @rpc
    def train(self, advantages: list[float]) -> float:
        mean = sum(advantages) / max(1, len(advantages))
        self.p_good = min(0.95, max(0.05, self.p_good + 0.5 * mean))
        return self.p_good


class Critic:
    def __init__(self) -> None:
        self.baseline = 0.0

    @rpc
    def values(self, rewards: list[float]) -> list[float]:
        return [self.baseline for _ in rewards]

    @rpc
    def train(self, rewards: list[float]) -> float:
        if rewards:
            self.baseline = 0.8 * self.baseline + 0.2 * (sum(rewards) / len(rewards))
        return self.baseline


class Rollout:
    def __init__(self) -> None:
        self.rng = random.Random(current_worker().rank)

    @rpc
    def generate(self, p_good: float, episodes: int) -> list[int]:
        """1 = the good action was taken."""
        return [1 if self.rng.random() < p_good else 0 for _ in range(episodes)]


class Reward:
    @rpc
    def score(self, actions: list[int]) -> list[float]:
        return [1.0 if a else 0.0 for a in actions]


def trainer() -> None:
    config = current_worker().config
    iterations = int(config.get("iterations", 8))
    actor, critic, rollout, reward = (role_group(r) for r in ("actor", "critic", "rollout", "reward"))
    p_good = actor.rank0("get_weights")
    start = p_good
    for step in range(iterations):
        per_worker = rollout.scatter("generate", [p_good] * rollout.size, [16] * rollout.size)
        actions = [a for batch in per_worker for a in batch]
        rewards = reward.rank0("score", actions)
        values = critic.rank0("values", rewards)
        advantages = [r - v for r, v in zip(rewards, values, strict=True)]
        new_weights = actor.call("train", advantages)
        critic.call("train", rewards)
        p_good = new_weights[0]
        heartbeat(step)
        print(
            f"iteration {step}: mean reward {sum(rewards) / len(rewards):.2f}, p_good {p_good:.2f}",
            flush=True,
        )
    if p_good <= start:
        raise RuntimeError(f"the policy did not improve: {start:.2f} -> {p_good:.2f}")
    print(
        f"trainer: policy improved, p_good {start:.2f} -> {p_good:.2f} in {iterations} iterations", flush=True
    )
