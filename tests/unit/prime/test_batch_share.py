"""batch_share: ranks split a fixed global batch without gap or overlap at every world size, and
with `loss_scale` the DDP-averaged gradient is the full batch's mean gradient, so a resize
changes nothing a step computes."""

from __future__ import annotations

import pytest

from dlu_prime.runtime import BatchShareError, batch_share

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("global_batch", [8, 13, 32])
def test_shares_cover_the_global_batch_once_at_every_world_size(world: int, global_batch: int) -> None:
    if global_batch < world:
        return
    shares = [batch_share(global_batch, 3, world_size=world, rank=r) for r in range(world)]
    covered = [i for s in shares for m in s.micro_batches() for i in range(m.start, m.stop)]
    assert covered == list(range(global_batch))
    assert max(s.samples for s in shares) - min(s.samples for s in shares) <= 1
    for share in shares:
        assert share.accumulation_steps == len(list(share.micro_batches()))
        assert all(m.stop - m.start <= 3 for m in share.micro_batches())


def test_world_and_rank_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    share = batch_share(10)
    assert (share.world_size, share.rank, share.start, share.stop) == (3, 2, 7, 10)
    assert share.accumulation_steps == 1
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert (batch_share(10).start, batch_share(10).stop) == (0, 10)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"global_batch": 0}, ["global_batch=0", ">= 1"]),
        ({"global_batch": 3, "world_size": 4, "rank": 0}, ["global_batch=3", "4 ranks", "global_batch >= 4"]),
        ({"global_batch": 8, "world_size": 2, "rank": 2}, ["rank=2", "0 <= rank < world_size"]),
        ({"global_batch": 8, "micro_batch": 0, "world_size": 1, "rank": 0}, ["micro_batch=0"]),
        ({"global_batch": 8, "world_size": 0, "rank": 0}, ["world_size=0"]),
    ],
)
def test_bad_sizes_name_the_value_and_the_fix(kwargs: dict[str, int], words: list[str]) -> None:
    with pytest.raises(BatchShareError) as raised:
        batch_share(**kwargs)
    assert all(w in str(raised.value) for w in words), raised.value


def test_the_averaged_gradient_is_the_global_batch_mean_at_any_world_size() -> None:
    """What DDP computes, by hand: each rank's gradient of `loss_scale * sum(losses)` over its
    micro-batches, averaged over the ranks, equals the mean gradient of the whole batch."""
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(13, 5, generator=gen), torch.randn(13, generator=gen)
    weight = torch.randn(5, generator=gen)

    def gradient(scale: float, rows: list[slice]) -> object:
        w = weight.clone().requires_grad_(True)
        for part in rows:
            loss = ((x[part] @ w - y[part]) ** 2).sum() * scale
            loss.backward()
        return w.grad

    full = gradient(1 / 13, [slice(0, 13)])
    for world in (1, 2, 3, 4, 6):
        shares = [batch_share(13, 2, world_size=world, rank=r) for r in range(world)]
        grads = [gradient(s.loss_scale, list(s.micro_batches())) for s in shares]
        averaged = torch.stack(grads).mean(dim=0)  # DDP's allreduce-average
        assert torch.allclose(averaged, full, atol=1e-6), (world, averaged, full)
