"""The reference LM's text and its encoding: built in one draw at every rank's start, they must
be the same bytes as the sentence-by-sentence definition (runs and checkpoints from before
compare equal, and every rank trains on the same data)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytestmark = pytest.mark.timeout(60)

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "elastic" / "train_lm.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_lm_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_sentence_at_a_time(words: list[str], chars: int, seed: int) -> str:
    """The definition: eight words drawn per sentence until the text is long enough."""
    gen = torch.Generator().manual_seed(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(words[int(i)] for i in torch.randint(len(words), (8,), generator=gen)) + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:chars]


@pytest.mark.parametrize(("chars", "seed"), [(1, 1234), (17, 1234), (20_000, 1234), (50_001, 7)])
def test_the_corpus_is_the_sentence_by_sentence_text(chars: int, seed: int) -> None:
    lm = _load()
    assert lm.corpus(chars, seed) == _one_sentence_at_a_time(lm.WORDS, chars, seed)


def test_the_encoding_indexes_the_sorted_characters() -> None:
    lm = _load()
    text = lm.corpus(5_000)
    vocab, data = lm.encode(text)
    assert vocab == sorted(set(text))
    assert data.dtype == torch.long and len(data) == len(text)
    assert "".join(vocab[i] for i in data.tolist()) == text
