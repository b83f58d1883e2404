"""The corpus and the two splits: the same bytes everywhere, and what each split lets val see."""
import pytest
import torch

from ropetut.training import data


def test_packaged_corpus_matches_its_sha256():
    corpus = data.load_corpus()
    assert corpus.sha256 == data.JARGON_SHA256 and len(corpus.tokens) == 1_418_350
    assert corpus.tokens.dtype == torch.uint8


def test_any_text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_bytes(b"hello, world")
    corpus = data.load_corpus(path)
    assert bytes(corpus.tokens.tolist()) == b"hello, world" and corpus.name == "tiny.txt"


def test_disjoint_split_never_trains_on_a_validation_token():
    split = data.make_split(10_000, 16)
    last_train_target = int(split.train_starts.max()) + 16
    assert last_train_target < int(split.val_starts.min()) + 1      # y of the last train window ends before val's x
    assert split.val_seen_fraction() == 0.0


def test_overlapping_split_is_the_seeds_and_shares_nearly_every_token():
    split = data.make_split(10_000, 16, overlapping=True, seed=3)
    assert split.mode == "overlapping"
    assert len(split.train_starts) + len(split.val_starts) == 10_000 - 16
    assert split.val_seen_fraction() > 0.99
    again = data.make_split(10_000, 16, overlapping=True, seed=3)
    assert torch.equal(split.val_starts, again.val_starts)               # deterministic for a seed


def test_windows_are_next_token_pairs():
    tokens = torch.arange(100, dtype=torch.uint8)
    x, y = data.windows(tokens, torch.tensor([0, 50]), 8)
    assert x.shape == y.shape == (2, 8) and torch.equal(y, x + 1)


def test_too_small_corpus_is_refused():
    with pytest.raises(ValueError, match="^n_tokens"):
        data.make_split(20, 16)
