"""Per-row sampling: every completion is a function of its own row's seed.

`request_seeds` turns an engine call's ``seed`` (one for the call, or one per row) into one
seed per row; every engine uses it (vLLM passes them as ``SamplingParams.seed``, the HF engine
to `RowSampler`), so on every engine a row's draws depend on its seed alone, in any batch,
chunk or rank.

`RowSampler` is the HF engine's sampler: inverse-CDF sampling, which picks a token with
probability ``softmax(scores)`` exactly as multinomial sampling does, from one uniform per row
and decoding step, a counter-based hash of ``(seed_r, t)`` (`row_uniform`). A torch generator
per row would work too, but costs a kernel launch per row and step; the hash is one vectorised
pass over the rows, needs no RNG state (the global torch RNG is untouched) and is the same on
CPU and GPU. (Gumbel-max, which this replaced, needs a hashed uniform and two logarithms per
token: docs/results.md, "Where the rollout's time goes", has what each cost.)
"""
from __future__ import annotations

import torch
from transformers import LogitsProcessor

_MASK32 = 0xFFFFFFFF
# An improved "lowbias32" integer hash from Chris Wellons' hash prospector
# (https://github.com/skeeto/hash-prospector): both multipliers are below 2**31, so a 32-bit
# value times one stays below 2**63 and int64 arithmetic is exact on every device (no overflow).
_MUL_A, _MUL_B = 0x21F0AAAD, 0x735A2D97


def request_seeds(seed: int | list[int], n: int) -> list[int]:
    """One seed per row, so the rows of a call draw differently yet reproducibly.

    ``seed`` is the call's seed (row ``i`` gets the ``i``-th draw of a stream seeded by it), or
    one seed per row: the ``k``-th row carrying seed ``s`` gets the ``k``-th draw of a stream
    seeded by ``s``, independent of the rest of the batch. `collect.row_seeds` gives every row
    its own seed, so each then gets the first draw of its own stream.

    Examples:
        >>> request_seeds([7, 7, 9], 3)[:2] == request_seeds([7, 7], 2)
        True
    """
    if not isinstance(seed, (list, tuple)):
        gen = torch.Generator().manual_seed(int(seed))
        return torch.randint(0, 2**31 - 1, (n,), generator=gen).tolist()
    if len(seed) != n:
        raise ValueError(f"got {len(seed)} seeds for {n} prompt rows")
    counts: dict[int, int] = {}
    for s in seed:
        counts[int(s)] = counts.get(int(s), 0) + 1
    streams = {s: iter(request_seeds(s, c)) for s, c in counts.items()}
    return [next(streams[int(s)]) for s in seed]


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit avalanche of ``0 <= x < 2**32`` (int64), in place: every input bit
    flips each output bit with probability close to 1/2."""
    for shift, multiplier in ((16, _MUL_A), (15, _MUL_B)):
        x ^= x >> shift
        x.mul_(multiplier).bitwise_and_(_MASK32)
    x ^= x >> 15
    return x


def row_keys(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """``[rows]`` 32-bit keys of (row seed in [0, 2**62), ``step``): three chained mixes."""
    key = _mix32(seeds & _MASK32)
    key = _mix32(key ^ ((seeds >> 32) & _MASK32))
    return _mix32(key ^ (step & _MASK32))


# Salt for the second 32-bit word of a row's uniform (any odd constant: it only has to differ from 0).
_SECOND_WORD = 0x5BD1E995


def row_uniform(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """``[rows]`` float64 uniforms in (0, 1) with 52 random bits: a hash of (row seed, ``step``).

    Args:
        seeds: ``[rows]`` int64 seeds in [0, 2**62).
        step: the decoding step (the completion token's index).
    """
    high = row_keys(seeds, step)
    low = _mix32(high ^ _SECOND_WORD)
    bits = torch.bitwise_or(high << 20, low >> 12)  # < 2**52, so bits + 0.5 is exact in float64
    return bits.double().add_(0.5).div_(2**52)


# Rows sampled at once on CPU: their float32 exponentials and float64 cumulative sums (12 bytes a
# token) stay in cache, and nothing of ``[rows, vocab]`` size is allocated per step (at 128 × 32,000,
# fresh whole-batch buffers each step took about twice as long, with the same bits).
CACHE_BYTES = 1 << 20


def inverse_cdf(scores: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token drawn from ``softmax(scores)`` by its uniform ``u``, and its log-prob.

    The token is the first whose cumulative probability exceeds ``u`` times the row's total. The
    cumulative sum runs in float64: in float32 its rounding (about 1e-7 of the running total)
    would misweight every token rarer than that. Computed a block of rows at a time (`CACHE_BYTES`;
    one block on a GPU).

    Args:
        scores: ``[rows, vocab]`` float32 (-inf where a warper removed a token: never drawn).
        u: ``[rows]`` float64 in (0, 1 - 2**-53], `row_uniform`.

    Returns:
        ``[rows, 1]`` token ids, and ``[rows]`` float32 ``log_softmax(scores)`` at them.
    """
    rows, vocab = scores.shape
    top = scores.amax(-1, keepdim=True)
    if not torch.isfinite(top).all():
        bad = (~torch.isfinite(top.squeeze(-1))).nonzero().flatten().tolist()
        raise ValueError(f"RowSampler: rows {bad[:8]} cannot be sampled: their largest score is "
                         f"{top.flatten()[bad[0]].item()} (the model's logits are NaN/inf, or a logits processor "
                         f"removed every token)")
    block = rows if scores.device.type != "cpu" else max(1, min(rows, CACHE_BYTES // (12 * vocab)))
    exps = torch.empty(block, vocab, dtype=torch.float32, device=scores.device)
    sums = torch.empty(block, vocab, dtype=torch.float64, device=scores.device)
    token = torch.empty(rows, 1, dtype=torch.long, device=scores.device)
    totals = torch.empty(rows, 1, dtype=torch.float64, device=scores.device)
    for start in range(0, rows, block):
        n = min(block, rows - start)
        rows_ = slice(start, start + n)
        torch.sub(scores[rows_], top[rows_], out=exps[:n]).exp_()
        cdf = sums[:n].copy_(exps[:n]).cumsum_(-1)
        totals[rows_] = cdf[:, -1:]
        # u <= 1 - 2**-53 rounds u * total below total, so some token's cumulative sum exceeds it: at
        # worst the last one drawable (the removed tokens after it add exactly 0)
        torch.searchsorted(cdf, u[rows_, None] * totals[rows_], right=True, out=token[rows_])
    logprob = (scores.gather(-1, token) - top).double() - totals.log()
    return token, logprob.squeeze(-1).float()


class RowSampler(LogitsProcessor):
    """The last logits processor of the HF engine: picks each row's token (by inverse CDF with
    the row's uniform, or the argmax when ``seeds`` is None) and returns scores whose argmax is
    that token (0 there, -inf elsewhere), so generate must run greedy (``do_sample=False``) with
    the warpers in front of this.

    The behaviour log-prob of each picked token is that of the processed distribution (the
    temperature, top-k/top-p/min-p and the repetition penalty applied): ``log_softmax(scores)
    [token]``, kept per step in ``logprobs`` when ``record``.

    Args:
        seeds: one seed per row (`request_seeds`), or None for greedy decoding.
        prompt_width: the padded prompt width; the step is ``input_ids.shape[1] - prompt_width``,
            so a row's uniform does not depend on the other rows' prompt lengths.
        record: keep the picked tokens' log-probs (``[rows]`` float32 per step) in ``logprobs``.
    """

    def __init__(self, seeds: list[int] | None, prompt_width: int, record: bool = False):
        self.seeds = None if seeds is None else torch.tensor(seeds, dtype=torch.int64)
        self.prompt_width, self.record = prompt_width, record
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        processed = scores.float()
        if self.seeds is None:
            token = processed.argmax(-1, keepdim=True)
            if self.record:
                self.logprobs.append(processed.log_softmax(-1).gather(-1, token).squeeze(-1))
            return processed
        self.seeds = self.seeds.to(scores.device)
        u = row_uniform(self.seeds, input_ids.shape[1] - self.prompt_width)
        token, logprob = inverse_cdf(processed, u)
        if self.record:
            self.logprobs.append(logprob)
        return torch.full_like(processed, float("-inf")).scatter_(-1, token, 0.0)
