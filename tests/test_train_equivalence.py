"""The kernel is not the cause, exactly (issue 17, item 1; llm.c's test_gpt2 in spirit).

One model trained twice in fp32 from the same initial weights on the same batches: once
with the seed's PyTorch rotation (``rope="torch"``: ``LlmRotary``, half-truncated,
turned by -theta) and once with the Triton ``final`` kernel given the same maths. At
step 0 the logits, the loss and every parameter's gradient agree within 1e-5 relative;
then each of 50 optimizer steps' losses agrees within 1e-4 relative. Were the kernel's
forward or backward wrong, the step-0 gradients would say so; were it slightly off, the
losses would drift apart over the steps.
"""

import torch

import ropetut
from ropetut.training import data, train
from ropetut.training.model import GPTConfig, TinyGPT, loss_fn

from conftest import gpu_only

SEED_MATH = dict(preset="half_truncated", negative_angle=True, rope_dtype="float32")
CPU_SIZES = dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, max_seq_len=16)
GPU_SIZES = dict(d_model=384, n_heads=8, n_layers=6, d_ff=1536, max_seq_len=512)


def twin_models(reference_config: GPTConfig, config: GPTConfig):
    """A model of each config, the second with the first's initial weights."""
    torch.manual_seed(0)
    reference = TinyGPT(reference_config).to(ropetut.DEVICE)
    model = TinyGPT(config).to(ropetut.DEVICE)
    theirs = dict(reference.named_parameters())
    mine = dict(model.named_parameters())
    assert mine.keys() == theirs.keys()
    with torch.no_grad():
        for name, parameter in mine.items():
            parameter.copy_(theirs[name])
    return reference, model


def batches(seq_len: int, batch_size: int, n: int):
    corpus = data.load_corpus()
    split = data.make_split(len(corpus.tokens), seq_len)
    stream = data.train_batches(corpus.tokens, split, batch_size, seed=0)
    return [tuple(t.to(ropetut.DEVICE) for t in next(stream)) for _ in range(n)]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))


def check_equivalence(sizes: dict, batch_size: int, steps: int):
    torch_model, triton_model = twin_models(
        GPTConfig(rope="torch", **sizes), GPTConfig(rope="final", **SEED_MATH, **sizes)
    )
    stream = batches(sizes["max_seq_len"], batch_size, steps)
    return trains_alike(torch_model, triton_model, stream)


def trains_alike(reference, model, stream):
    """Step 0's logits, loss and gradients within 1e-5, then each step's loss within
    1e-4 over ``stream``'s batches; returns the last loss."""
    config = train.TrainConfig(steps=len(stream), warmup_steps=5)

    # step 0: logits, loss and every gradient
    x, y = stream[0]
    logits = {m: m(x) for m in (reference, model)}
    losses = {m: loss_fn(logits[m], y) for m in logits}
    for m in losses:
        losses[m].backward()
    assert relative(logits[model], logits[reference]) < 1e-5
    assert relative(losses[model], losses[reference]) < 1e-5
    theirs = dict(reference.named_parameters())
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and theirs[name].grad is not None, name
        assert relative(parameter.grad, theirs[name].grad) < 1e-5, name

    # then the optimizer's steps: each step's loss
    optimizers = {m: optimizer(m) for m in (reference, model)}
    for step, (x, y) in enumerate(stream):
        step_losses = {}
        for m, opt in optimizers.items():
            for group in opt.param_groups:
                group["lr"] = train.lr_at(step, config)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(m(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            step_losses[m] = loss.detach()
        assert relative(step_losses[model], step_losses[reference]) < 1e-4, step
    return step_losses[reference].item()


def test_triton_final_trains_as_the_torch_rotation_does_cpu():
    last = check_equivalence(CPU_SIZES, batch_size=2, steps=50)
    assert last < 5.0  # it trained: the first loss is about ln 256 = 5.55


@gpu_only
def test_triton_final_trains_as_the_torch_rotation_does_gpu():
    # fp32 throughout: no autocast, and no TF32 in the matmuls
    matmul, cudnn = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        last = check_equivalence(GPU_SIZES, batch_size=8, steps=50)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = (
            matmul,
            cudnn,
        )
    assert last < 5.0
