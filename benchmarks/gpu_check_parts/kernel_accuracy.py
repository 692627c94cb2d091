"""Part ``kernel_accuracy``: every log-prob candidate against an fp64 reference.

For each LM-head shape and input dtype (fp32, bf16), the reference is computed in fp64 from the
*same* (already rounded) inputs, so the errors measure each candidate's arithmetic, not the
rounding of its inputs. Gradients flow through the log-probs and the entropy (fixed random
per-token weights on each); Liger has no entropy and is compared with the log-prob-only gradient.
Error = ``‖x − ref‖₂ / ‖ref‖₂`` over the whole tensor (log-probs, entropy, d hidden, d weight).
"""
from __future__ import annotations

import torch

from .common import Context, Skipped
from .kernel_ops import candidates, make_inputs

SHAPES = [(896, 151936), (4096, 128256)]  # (H, V) of Qwen2.5-0.5B's and Llama-3-8B's LM heads
DRY_SHAPES = [(64, 5000), (128, 1200)]    # tiny, but more than one 4096-wide vocabulary tile
TOKENS, DRY_TOKENS = 2048, 48
DTYPES = (torch.float32, torch.bfloat16)


def reference(hidden, weight, targets, c_logp, c_ent) -> dict[str, torch.Tensor]:
    """fp64 log-probs, entropy and the gradients of both upstream weightings."""
    h, w = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    logp_all = (h @ w.T).log_softmax(-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    full = torch.autograd.grad((logp * c_logp).sum() + (ent * c_ent).sum(), (h, w), retain_graph=True)
    only = torch.autograd.grad((logp * c_logp).sum(), (h, w))
    return dict(logp=logp.detach(), entropy=ent.detach(), d_hidden=full[0], d_weight=full[1],
                d_hidden_logp=only[0], d_weight_logp=only[1])


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def compare(fn, hidden, weight, targets, c_logp, c_ent, ref) -> dict[str, float | str | None]:
    """One candidate's relative errors against ``ref``."""
    logp, ent = fn(hidden, weight, targets)
    loss = (logp.double() * c_logp).sum()
    if ent is not None:
        loss = loss + (ent.double() * c_ent).sum()
    d_h, d_w = torch.autograd.grad(loss, (hidden, weight))
    suffix = "" if ent is not None else "_logp"
    return dict(logp=rel_err(logp, ref["logp"]), entropy=None if ent is None else rel_err(ent, ref["entropy"]),
                d_hidden=rel_err(d_h, ref["d_hidden" + suffix]), d_weight=rel_err(d_w, ref["d_weight" + suffix]),
                grad_through="log-probs" if ent is None else "log-probs and entropy")


def run(ctx: Context) -> None:
    n = DRY_TOKENS if ctx.dry_run else TOKENS
    cands = candidates(ctx.device, train=False)
    for name, fn in cands.items():
        if isinstance(fn, Skipped):
            ctx.emit(case=name, candidate=name, skipped=str(fn))
    for h, v in DRY_SHAPES if ctx.dry_run else SHAPES:
        for dtype in DTYPES:
            hidden, weight, targets, c_logp = make_inputs(n, h, v, dtype, ctx.device)
            c_ent = torch.randn(n, device=ctx.device, generator=torch.Generator(ctx.device).manual_seed(1)) / n
            c_logp, c_ent = c_logp.double(), c_ent.double()
            ref = reference(hidden, weight, targets, c_logp, c_ent)
            for name, fn in cands.items():
                if isinstance(fn, Skipped):
                    continue
                case = dict(case=f"{name} H{h} V{v} {str(dtype)[6:]}", candidate=name, h=h, v=v, n=n,
                            dtype=str(dtype)[6:])
                try:
                    ctx.emit(**case, **compare(fn, hidden, weight, targets, c_logp, c_ent, ref))
                except Exception as exc:  # one candidate failing must not hide the others
                    ctx.emit(**case, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            del ref, hidden, weight
            if ctx.cuda:
                torch.cuda.empty_cache()
