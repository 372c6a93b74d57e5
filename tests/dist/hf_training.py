"""Training parity with Hugging Face, for the *_hf_dump tests: every
parameter's gradient and a few AdamW steps, in float64 on the Hugging Face
side against what a dump program wrote (tests/dist/hf_dump_init.h,
DumpTraining): grad.<name> after one backward, step_loss.<k> before each of
the steps and after the last."""
import torch

from harness import check

GRADIENT_TOLERANCE = 1e-5  # per parameter, relative to its largest gradient
GRADIENT_FLOOR = 1e-2  # ... or to this share of the largest gradient of all, where that is more
STEP_TOLERANCE = 1e-4  # per loss, relative to max(1, |loss|)
LR, WEIGHT_DECAY, STEPS = 1e-3, 0.1, 5  # as DumpTraining takes them


def tessel_gradients(tensors):
    """The dump's gradients keyed as its parameters are ("param.<name>"), so
    the test's own name mapping (hf_state) turns them into Hugging Face's."""
    return {"param." + k[len("grad."):]: v for k, v in tensors.items() if k.startswith("grad.")}


def compare_gradients(label, model, loss_fn, hf_grads):
    """Backward of loss_fn() through `model` (float64, its parameters loaded),
    then every parameter's gradient against hf_grads (Hugging Face names).
    Each error is relative to the parameter's largest gradient, or to
    FLOOR x the largest of all where that is smaller: a gradient that is 0 in
    exact arithmetic (a key bias: softmax ignores a shift shared by all keys)
    is round-off on both sides."""
    model.zero_grad()
    loss_fn().backward()
    params = dict(model.named_parameters())
    largest = max(p.grad.abs().max().item() for p in params.values() if p.grad is not None)
    worst = 0.0
    for name, param in params.items():
        if name not in hf_grads:
            check(f"{label}: tessel gave {name} a gradient", False,
                  f"  Hugging Face's is max |g| {param.grad.abs().max().item():.3g}"
                  if param.grad is not None else "  (and Hugging Face gave none)")
            continue
        ours = hf_grads[name].to(torch.float64).reshape(param.shape)
        theirs = param.grad if param.grad is not None else torch.zeros_like(param)
        scale = max(theirs.abs().max().item(), GRADIENT_FLOOR * largest)
        err = (ours - theirs).abs().max().item() / scale
        worst = max(worst, err)
        if err > GRADIENT_TOLERANCE:
            check(f"{label}: gradient of {name} (max |g| {theirs.abs().max().item():.3g}, relative error "
                  f"{err:.2e})", False)
    check(f"{label}: every parameter's gradient equals Hugging Face's (worst relative error {worst:.2e})",
          worst <= GRADIENT_TOLERANCE)


def compare_steps(label, model, loss_fn, tensors, no_decay=()):
    """STEPS AdamW steps of `model` as DumpTraining takes them (weight decay
    on parameters of two or more dimensions, as tessel decides; `no_decay`
    names those Hugging Face stores with more dimensions than tessel does),
    the loss before each and after the last against the dump's."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        (decay if param.dim() >= 2 and not name.endswith(tuple(no_decay)) else plain).append(param)
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                               {"params": plain, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.999), eps=1e-8)
    worst, lines = 0.0, []
    for k in range(STEPS + 1):
        adamw.zero_grad()
        loss = loss_fn()
        ours = tensors[f"step_loss.{k}"].item()
        err = abs(ours - loss.item()) / max(1.0, abs(loss.item()))
        worst = max(worst, err)
        lines.append(f"  step {k}: tessel {ours:.8f} Hugging Face {loss.item():.8f}")
        if k < STEPS:
            loss.backward()
            adamw.step()
    check(f"{label}: {STEPS} AdamW steps give Hugging Face's losses (worst error {worst:.2e})",
          worst <= STEP_TOLERANCE, "\n".join(lines))
