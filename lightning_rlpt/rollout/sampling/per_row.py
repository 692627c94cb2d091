"""Per-row sampling: every completion is a function of its own row's seed.

`request_seeds` turns an engine call's ``seed`` (one for the call, or one per row) into one
seed per row; every engine uses it (vLLM passes them as ``SamplingParams.seed``, the HF engine
to `RowSampler`), so a row draws the same way on every engine, in any batch, chunk or rank.

`RowSampler` is the HF engine's sampler: Gumbel-max, ``argmax(scores + Gumbel noise)``, which
picks a token with probability ``softmax(scores)`` exactly as multinomial sampling does, with
the noise of row ``r`` at decoding step ``t`` for token ``v`` a counter-based hash of
``(seed_r, t, v)`` (`uniform`). A torch generator per row would work too, but costs a kernel
launch per row and step; the hash is one vectorised pass over ``[rows, vocab]``, needs no RNG
state (the global torch RNG is untouched) and is the same on CPU and GPU.
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


def _mix32(x: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """A bijective 32-bit avalanche of ``0 <= x < 2**32`` (int64), in place: every input bit
    flips each output bit with probability close to 1/2. ``scratch`` (``x``'s shape and dtype)
    takes the shifts, so nothing is allocated."""
    for shift, multiplier in ((16, _MUL_A), (15, _MUL_B)):
        x ^= torch.bitwise_right_shift(x, shift, out=scratch) if scratch is not None else x >> shift
        x.mul_(multiplier).bitwise_and_(_MASK32)
    x ^= torch.bitwise_right_shift(x, 15, out=scratch) if scratch is not None else x >> 15
    return x


def row_keys(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """``[rows]`` 32-bit keys of (row seed in [0, 2**62), ``step``): three chained mixes."""
    key = _mix32(seeds & _MASK32)
    key = _mix32(key ^ ((seeds >> 32) & _MASK32))
    return _mix32(key ^ (step & _MASK32))


def token_keys(vocab: int, device: torch.device) -> torch.Tensor:
    """``[vocab]`` 32-bit keys of the token ids (computed once per call, then xor-ed with each row's key)."""
    return _mix32(torch.arange(vocab, device=device, dtype=torch.int64))


def uniform(seeds: torch.Tensor, step: int, vocab: int, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """``[rows, vocab]`` float64 uniforms in (0, 1): a hash of (row seed, ``step``, token id).

    Args:
        seeds: ``[rows]`` int64 seeds in [0, 2**62).
        step: the decoding step (the completion token's index).
        vocab: how many token ids.
        tokens: `token_keys` of ``vocab`` when already computed.
    """
    tokens = token_keys(vocab, seeds.device) if tokens is None else tokens
    return _to_unit_(_pair_bits(row_keys(seeds, step), tokens).double())


def _pair_bits(keys: torch.Tensor, tokens: torch.Tensor, out: torch.Tensor | None = None,
               scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``[rows, vocab]`` 32-bit hashes (int64) of each (row key, token key) pair, into ``out`` when given."""
    return _mix32(torch.bitwise_xor(keys[:, None], tokens[None], out=out), scratch)


def _to_unit_(bits: torch.Tensor) -> torch.Tensor:
    """32-bit hashes held as float64, mapped in place to the open interval (0, 1)."""
    return bits.add_(0.5).div_(2**32)


# Rows of the noise computed at once on CPU: the int64 hash and its float64 uniforms for this many
# bytes stay in cache through the ~15 passes below; over the whole [rows, vocab] at once each pass
# streams through memory (at 128 × 32,000 the noise took 2.2× as long, with the same bits).
CACHE_BYTES = 1 << 20


def gumbel_scores(scores: torch.Tensor, seeds: torch.Tensor, step: int, tokens: torch.Tensor) -> torch.Tensor:
    """``scores + Gumbel(0, 1)`` noise, the noise ``-log(-log(uniform(seeds, step, vocab, tokens)))``
    bit for bit, computed a block of rows at a time in place (`CACHE_BYTES`; one block on a GPU).

    Args:
        scores: ``[rows, vocab]`` float32 (-inf where a warper removed a token: stays -inf).
        seeds / step / tokens: as `uniform`'s.
    """
    rows, vocab = scores.shape
    keys = row_keys(seeds, step)
    block = rows if scores.device.type != "cpu" else max(1, min(rows, CACHE_BYTES // (8 * vocab)))
    bits = torch.empty(block, vocab, dtype=torch.int64, device=scores.device)
    shifted = torch.empty_like(bits)
    noise = torch.empty(block, vocab, dtype=torch.float64, device=scores.device)
    out = torch.empty_like(scores)
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        x, t, u = bits[: stop - start], shifted[: stop - start], noise[: stop - start]
        _to_unit_(u.copy_(_pair_bits(keys[start:stop], tokens, x, t))).log_().neg_().log_().neg_()  # -log(-log u)
        torch.add(scores[start:stop], u.float(), out=out[start:stop])
    return out


class RowSampler(LogitsProcessor):
    """The last logits processor of the HF engine: picks each row's token (Gumbel-max with the
    row's seed, or the argmax when ``seeds`` is None) and returns scores whose argmax is that
    token, so generate must run greedy (``do_sample=False``) with the warpers in front of this.

    The behaviour log-prob of each picked token is that of the processed distribution (the
    temperature, top-k/top-p/min-p and the repetition penalty applied), never of the noise:
    ``log_softmax(scores)[token]``, kept per step in ``logprobs`` when ``record``.

    Args:
        seeds: one seed per row (`request_seeds`), or None for greedy decoding.
        prompt_width: the padded prompt width; the step is ``input_ids.shape[1] - prompt_width``,
            so a row's noise does not depend on the other rows' prompt lengths.
        record: keep the picked tokens' log-probs (``[rows]`` float32 per step) in ``logprobs``.
    """

    def __init__(self, seeds: list[int] | None, prompt_width: int, record: bool = False):
        self.seeds = None if seeds is None else torch.tensor(seeds, dtype=torch.int64)
        self.prompt_width, self.record = prompt_width, record
        self.logprobs: list[torch.Tensor] = []
        self._tokens: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        processed = scores.float()
        picked = processed
        if self.seeds is not None:
            if self._tokens is None or len(self._tokens) != scores.shape[-1]:  # once per call
                self._tokens = token_keys(scores.shape[-1], scores.device)
                self.seeds = self.seeds.to(scores.device)
            picked = gumbel_scores(processed, self.seeds, input_ids.shape[1] - self.prompt_width, self._tokens)
        token = picked.argmax(-1, keepdim=True)
        if self.record:  # the processed distribution's log-prob, never the noise's
            self.logprobs.append(processed.log_softmax(-1).gather(-1, token).squeeze(-1))
        return picked
