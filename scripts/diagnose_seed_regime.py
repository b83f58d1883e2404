"""Why the seed regime's PyTorch baseline validates far above its training loss (GPU).

    python scripts/diagnose_seed_regime.py [--seed 0] [--name "seed regime: ..."]
        [--dropout P]

In issue 27's seed regime, ``seed regime: pytorch (ch4, ch5)`` trains to a loss of
about 1.01 (its last 50 steps), yet its validation loss, on windows of the same text
(the overlapping split: every validation target is also trained on), zig-zags between
evaluations 25 steps apart and ends at 1.56 to 2.06, 0.44 to 0.82 above its curve's
best point; its Triton rows validate below their training loss, as expected. This
retrains one of its runs exactly as the study did (``train.study_plan``, deterministic
algorithms: the same configuration hash) and keeps the final weights, then:

  1. the run repeats: its final loss against the committed record's, to the bit;
  2. the final weights, evaluated as the study does (eval mode, the regime's autocast)
     on the validation windows; on as many training windows; in train mode (dropout
     on); and without autocast (fp32): which of data, mode or precision moves the loss.

--dropout P retrains the run with dropout P instead (everything else the study's): a
controlled run, with no committed record to repeat. With 0, train and eval mode are the
same model: whether the gap above needs dropout.

About 4 minutes on an H200 alone. Prints; writes nothing.
"""

# ruff: noqa: I001
import argparse
import dataclasses
import tempfile
from pathlib import Path

# ropetut first: on a machine without a GPU it switches Triton to its interpreter
import ropetut
import torch
from ropetut.runtime import NO_GPU, on_gpu
from ropetut.training import data, model, train

STUDY = Path(__file__).resolve().parent.parent / "results/training_h100/study"
BASELINE = "seed regime: pytorch (ch4, ch5)"


def evaluate(net, tokens, starts, seq_len, batch_size, autocast, training):
    """train.evaluate's loss, with the mode and autocast chosen here."""
    net.train(training)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(starts), batch_size):
            x, y = data.windows(tokens, starts[i : i + batch_size], seq_len)
            with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
                logits = net(x)
            total += train.loss_fn(logits, y).item() * y.numel()
            count += y.numel()
    net.train()
    return total / count


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=BASELINE)
    parser.add_argument("--dropout", type=train.dropout_float)  # default: the study's
    args = parser.parse_args()
    if not on_gpu():
        print(NO_GPU)
        return
    plan = train.study_plan("seed_regime", seeds=(args.seed,))
    (model_config, train_config), = [
        (m, t) for name, m, t in plan if name == args.name
    ]  # fmt: skip
    if args.dropout is not None:
        model_config = dataclasses.replace(model_config, dropout=args.dropout)
    stored = train.run_file(STUDY, args.name, model_config, train_config)
    record = train.read_run(stored) if stored.exists() else None
    with tempfile.TemporaryDirectory() as folder, train.deterministic_on_gpu():
        saved = Path(folder) / "run.ckpt"
        run = train.train(
            model_config, train_config, progress=False, name=args.name,
            checkpoint=saved, checkpoint_every=train_config.steps,
        )  # fmt: skip
        weights = torch.load(saved, weights_only=True)["model"]
    final = run["final"]["loss"]
    print(f"{args.name}, seed {args.seed}, dropout {model_config.dropout:g}: "
          f"final validation loss {final!r}")  # fmt: skip
    if record is None:
        print(f"  no committed record at {stored.name}: nothing to repeat")
    else:
        same = final == record["final"]["loss"]
        curve = run["train_loss"] == record["train_loss"]
        print(f"  committed {record['final']['loss']!r}: the same bits: {same}; "
              f"the same training curve: {curve}")  # fmt: skip
    net = model.TinyGPT(model_config).to(ropetut.DEVICE)
    net.load_state_dict(weights)
    corpus = data.load_corpus()
    tokens = corpus.tokens.to(ropetut.DEVICE)
    seq_len = model_config.max_seq_len
    split = data.make_split(
        len(corpus.tokens), seq_len, overlapping=train_config.overlapping_split,
        seed=train_config.seed if train_config.split_seed is None
        else train_config.split_seed,
        val_block=train_config.val_block,
    )  # fmt: skip
    n = train_config.final_eval_windows
    windows = {"validation": split.val_starts[:n], "training": split.train_starts[:n]}
    regime = train.AUTOCAST_DTYPES[train_config.autocast_dtype]
    print(f"the final weights, {n} windows each, mean loss per byte:")
    for data_name, starts in windows.items():
        for mode, training in (("eval mode", False), ("train mode", True)):
            for precision, autocast in ((f"{regime}", regime), ("fp32", None)):
                loss = evaluate(
                    net, tokens, starts, seq_len, train_config.batch_size, autocast,
                    training,
                )  # fmt: skip
                print(f"  {data_name:10} {mode:10} {precision:15} {loss:.4f}")
    last = run["train_loss"][-50:]
    print(f"training loss, the last {len(last)} steps' mean (train mode): "
          f"{sum(last) / len(last):.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
