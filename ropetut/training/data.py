"""Training data with no network: a corpus shipped in the package, byte tokens,
and two splits.

The corpus is the Jargon File 4.4.7 (public domain, see ``corpus/README.md``), stored
gzip-compressed in the package. ``load_corpus`` checks the sha256 of the decompressed
bytes, so a run on any machine trains on exactly the same text.

Tokens are bytes (vocabulary 256): no tokenizer to ship or download,
identical everywhere.

Two ways to split the tokens into training and validation windows of
``seq_len + 1`` tokens:

- ``"disjoint"`` (the default): the last ``val_fraction`` of the corpus is validation
  (or, with ``val_block="middle"``, a block of that size in the middle: the end of the
  file is harder text), tiled by windows that do not overlap; training windows start
  anywhere outside it and never reach into it. No validation token is ever a training
  target.
- ``"overlapping"``: the seed's. Every start ``0, stride, 2*stride, ...`` is a window
  (stride 1 in the seed), and ``torch.utils.data.random_split`` deals the windows out
  90/10. Windows that share all but ``stride`` tokens land on both sides, so nearly
  every validation token is also a training target.
"""

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

JARGON = Path(__file__).resolve().parent / "corpus" / "jargon-4.4.7.txt.gz"
# of the decompressed bytes
JARGON_SHA256 = "6c8118c277d0b00736d406d4941b77b69932d6ab125f7179ff88fe12939cc19e"
SPLITS = ("disjoint", "overlapping")
VAL_BLOCKS = ("end", "middle")  # where the disjoint split's validation block lies


@dataclass(frozen=True)
class Corpus:
    name: str
    tokens: torch.Tensor  # (n,) uint8: one token per byte
    sha256: str  # of the bytes the tokens are

    def describe(self) -> dict:
        return {"name": self.name, "bytes": len(self.tokens), "sha256": self.sha256}


def load_corpus(path: str | Path | None = None) -> Corpus:
    """The packaged Jargon File (checked against its sha256), or any file: text, or gzip
    by name."""
    if path is None:
        raw = gzip.decompress(JARGON.read_bytes())
        sha = hashlib.sha256(raw).hexdigest()
        if sha != JARGON_SHA256:
            raise ValueError(
                f"corpus: {JARGON.name} decompresses to sha256 {sha}, "
                f"expected {JARGON_SHA256}"
            )
        name = "Jargon File 4.4.7"
    else:
        path = Path(path)
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        sha, name = hashlib.sha256(raw).hexdigest(), path.name
    if len(raw) < 2:
        raise ValueError(f"corpus: {name} has {len(raw)} bytes, too few to train on")
    return Corpus(name, torch.frombuffer(bytearray(raw), dtype=torch.uint8), sha)


@dataclass(frozen=True)
class Split:
    """Where training and validation windows start. A window at s is
    x = tokens[s : s + seq_len], y = tokens[s + 1 : s + seq_len + 1] (the next token of
    each x)."""

    mode: str
    seq_len: int
    train_starts: torch.Tensor  # every start a training batch may draw
    val_starts: torch.Tensor  # validation windows, in the order they are evaluated

    def val_seen_fraction(self, n_val_windows: int | None = None) -> float:
        """The fraction of validation targets (y positions of the first
        ``n_val_windows`` validation windows, counted with repetition) that are also the
        target of some training window: tokens the model was trained to predict, from
        much the same context."""
        val = self.val_starts[:n_val_windows]
        end = int(max(self.train_starts.max(), val.max())) + self.seq_len + 2
        # y of the window at s covers positions [s + 1, s + seq_len]: mark them with
        # a difference array
        edges = torch.zeros(end + 1, dtype=torch.int64)
        edges.index_add_(0, self.train_starts + 1, torch.ones_like(self.train_starts))
        edges.index_add_(
            0, self.train_starts + self.seq_len + 1, -torch.ones_like(self.train_starts)
        )
        is_train_target = edges.cumsum(0) > 0
        val_targets = val[:, None] + 1 + torch.arange(self.seq_len)
        return is_train_target[val_targets].float().mean().item()


def make_split(
    n_tokens: int,
    seq_len: int,
    *,
    overlapping: bool = False,
    val_fraction: float = 0.1,
    seed: int = 0,
    stride: int = 1,
    val_block: str = "end",
) -> Split:
    """Disjoint contiguous blocks (the default; validation at the ``val_block``),
    or the seed's random split of overlapping windows. Deterministic: the overlapping
    split draws from a generator seeded with ``seed``."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction: must be in (0, 1), got {val_fraction}")
    if val_block not in VAL_BLOCKS:
        raise ValueError(f"val_block: must be one of {VAL_BLOCKS}, got {val_block!r}")
    if overlapping:
        starts = torch.arange(0, n_tokens - seq_len, stride)
        n_val = round(val_fraction * len(starts))
        if n_val < 1 or n_val == len(starts):
            raise ValueError(
                f"n_tokens: {n_tokens} tokens make too few windows of {seq_len + 1} "
                "to split"
            )
        # what torch.utils.data.random_split does: one permutation, the
        # first part trains
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(starts), generator=g)
        n_train = len(starts) - n_val
        return Split(
            "overlapping", seq_len, starts[order[:n_train]], starts[order[n_train:]]
        )
    n_val_tokens = n_tokens - round((1 - val_fraction) * n_tokens)
    # validation is [first, last): at the end, or with as much text on either side
    first = n_tokens - n_val_tokens
    if val_block == "middle":
        first //= 2
    last = first + n_val_tokens
    before, after = first, n_tokens - last
    if n_val_tokens < seq_len + 1 or max(before, after) < seq_len + 1:
        raise ValueError(
            f"n_tokens: {n_tokens} tokens are too few for two blocks of {seq_len + 1}"
        )
    # a training window's y never reaches into the block
    sides = ((0, first - seq_len), (last, n_tokens - seq_len))
    train = torch.cat([torch.arange(start, max(start, end)) for start, end in sides])
    val = torch.arange(first, last - seq_len, seq_len)
    return Split("disjoint", seq_len, train, val)


def windows(
    tokens: torch.Tensor, starts: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) int64 batches of the windows at ``starts``, on the device of
    ``tokens``."""
    offsets = torch.arange(seq_len + 1, device=tokens.device)
    index = starts.to(tokens.device)[:, None] + offsets
    w = tokens[index].long()
    return w[:, :-1], w[:, 1:]


def train_batches(
    tokens: torch.Tensor,
    split: Split,
    batch_size: int,
    seed: int,
    generator: torch.Generator | None = None,
):
    """An endless, deterministic stream of training batches: windows drawn at random
    (with replacement) from the split's training starts by a generator seeded with
    ``seed``, or by ``generator`` if given (its state is then the stream's place, which
    a checkpoint keeps)."""
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    while True:
        pick = torch.randint(len(split.train_starts), (batch_size,), generator=g)
        yield windows(tokens, split.train_starts[pick], split.seq_len)
