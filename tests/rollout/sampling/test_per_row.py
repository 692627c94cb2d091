"""Per-row sampling on the HF engine (`rollout.sampling.per_row`): inverse-CDF sampling with a
uniform hashed from (row seed, step) draws from the processed softmax; a row's completion depends on its seed
alone (not on its batch, ``max_batch_rows`` chunks or the training micro-batch caps); a prompt
drawn twice with ``seed_per_prompt`` gets two independent groups; the behaviour log-probs carry
no noise (tests/model/test_logprobs.py compares them with the learner's)."""
import functools

import pytest
import torch
from lightning.pytorch.callbacks import Callback

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.model.loading import load_policy, load_tokenizer
from lightning_rlpt.rollout import HFGenerateEngine, SamplingConfig, collect
from lightning_rlpt.rollout.sampling.per_row import RowSampler, inverse_cdf, row_uniform

PROMPTS = ["7+5=", "12+34=", "99+99=", "3+4=", "1+1=", "45+6=", "8="]  # different lengths: left padding


@pytest.fixture(scope="module")
def engine(warm_start_dir):
    tok, policy = load_tokenizer(warm_start_dir, None), load_policy(warm_start_dir)
    return HFGenerateEngine(policy, tok.eos_token_id, tok.pad_token_id, return_logprobs=True), tok


def test_the_sampler_draws_from_the_softmax_of_the_processed_scores():
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")]])
    n = 20_000
    sampler = RowSampler(list(range(n)), prompt_width=3, record=True)
    out = sampler(torch.zeros(n, 3, dtype=torch.long), scores.expand(n, -1))
    picked = out.argmax(-1)
    assert torch.equal((out == 0).sum(-1), torch.ones(n, dtype=torch.long))  # one token left, the others -inf
    freq = torch.bincount(picked, minlength=5).double() / n
    expected = scores.double().softmax(-1)[0]
    assert freq[4] == 0  # a token the warpers removed is never drawn
    assert torch.allclose(freq, expected, atol=4 * (expected * (1 - expected) / n).sqrt().max().item())
    # the behaviour log-prob is the processed distribution's, at the picked token
    assert torch.allclose(sampler.logprobs[0], scores.log_softmax(-1)[0, picked], atol=1e-6)


def test_a_row_draws_each_step_afresh():
    """The step is the completion position (the width past the prompt): under the same scores, a row's
    tokens at two steps agree as often as two independent draws do (sum p^2), not always."""
    scores = torch.tensor([[1.0, 0.5, 0.0, -0.5]])
    n = 20_000
    sampler = RowSampler(list(range(n)), prompt_width=3)
    first, second = (sampler(torch.zeros(n, width, dtype=torch.long), scores.expand(n, -1)).argmax(-1)
                     for width in (3, 4))
    same = (first == second).double().mean().item()
    expected = (scores.softmax(-1) ** 2).sum().item()
    assert abs(same - expected) < 4 * (expected * (1 - expected) / n) ** 0.5


def test_each_step_returns_only_its_own_pick():
    """The returned scores are 0 at this step's token and -inf everywhere else, at every step and
    for batches of any shape."""
    torch.manual_seed(0)
    sampler = RowSampler(list(range(6)), prompt_width=2, record=True)
    for width, rows in ((2, 6), (3, 6), (4, 6), (5, 6), (2, 4)):
        scores = torch.randn(rows, 50)
        sampler.seeds = torch.arange(rows)
        out = sampler(torch.zeros(rows, width, dtype=torch.long), scores)
        token = inverse_cdf(scores.float(), row_uniform(torch.arange(rows), width - 2))[0]
        assert torch.equal(out, torch.full((rows, 50), float("-inf")).scatter_(-1, token, 0.0)), width


def test_the_row_uniform_is_uniform_and_keyed_by_seed_and_step():
    seeds = torch.arange(100_000) * 2**40 + 3
    u = row_uniform(seeds, 0)
    assert 0 < u.min() and u.max() < 1
    counts = torch.histc(u.float(), bins=10, min=0, max=1)  # chi-square over 10 bins, 9 dof: p < 1e-4 above 33.7
    assert ((counts - 10_000) ** 2 / 10_000).sum() < 33.7
    assert len(torch.unique(u)) == len(u)
    low = row_uniform(torch.tensor([3]), 0)
    assert not torch.equal(low, row_uniform(torch.tensor([2**61 + 3]), 0))  # the seed's high bits count
    assert torch.equal(u, row_uniform(seeds, 0))
    following = row_uniform(seeds, 1)
    assert not torch.equal(u, following)  # so does the step
    assert abs(torch.corrcoef(torch.stack([u, following]))[0, 1].item()) < 0.02  # consecutive steps
    bits = u * 2**52 - 0.5  # 52 random bits, not 32: the low 20 are not all zero
    assert torch.equal(bits, bits.round()) and (bits % 2**20 != 0).float().mean() > 0.99


def test_inverse_cdf_picks_by_hand():
    """p = (0.2, 0.3, 0.5) after a removed token: the token is where u falls in the cumulative sums."""
    scores = torch.tensor([0.0, 0.2, 0.3, 0.5]).log().expand(6, -1).contiguous()
    u = torch.tensor([1e-12, 0.1, 0.25, 0.49, 0.51, 1 - 2**-53], dtype=torch.float64)
    token, logprob = inverse_cdf(scores, u)
    assert token.flatten().tolist() == [1, 1, 2, 2, 3, 3]
    assert torch.allclose(logprob, scores.log_softmax(-1).gather(-1, token).flatten(), atol=1e-7)
    trailing = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")]])  # u at the top: the last token left
    assert inverse_cdf(trailing, torch.tensor([1 - 2**-53], dtype=torch.float64))[0].item() == 1


def test_the_cumulative_sum_keeps_rare_tokens_weight():
    """One token holds 1 - 4e-7 of the mass, 31,999 share the rest (1.4e-11 each): in float32 the running
    sum would not move past the first token and u in the rare band would all pick the same token."""
    vocab = 32_000
    scores = torch.full((4, vocab), -25.0)
    scores[:, 0] = 0.0
    exact = (scores[0].double() - scores[0].double().max()).exp().cumsum(-1)
    u = torch.tensor([0.9999997, 0.99999985, 0.9999999, 0.99999995], dtype=torch.float64)
    expected = torch.searchsorted(exact, (u * exact[-1])[:, None], right=True)
    token, _ = inverse_cdf(scores, u)
    assert torch.equal(token, expected) and len(set(token.flatten().tolist())) == 4


@pytest.mark.parametrize("rows, vocab", [(9, 32_000), (3, 151_936), (5, 50), (1, 7)])
def test_the_blocked_draw_is_the_whole_batch_definition_bit_for_bit(rows, vocab):
    """`inverse_cdf` works a few rows at a time (2 rows a block at 32,000; 151,936 is wider than the
    block); the tokens and log-probs must be those of one pass over the whole batch, or every HF draw
    would depend on the block size."""
    g = torch.Generator().manual_seed(rows)
    scores = torch.randn(rows, vocab, generator=g) * 4
    scores[0, : min(3, vocab - 1)] = float("-inf")
    u = row_uniform(torch.randint(0, 2**62, (rows,), generator=g), 4)
    top = scores.amax(-1, keepdim=True)
    cdf = (scores - top).exp().double().cumsum(-1)
    expected = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)
    token, logprob = inverse_cdf(scores, u)
    assert torch.equal(token, expected)
    assert torch.equal(logprob, ((scores.gather(-1, expected) - top).double() - cdf[:, -1:].log()).squeeze(-1).float())


@pytest.mark.parametrize("bad", [float("nan"), float("-inf"), float("inf")])
def test_a_row_with_nothing_finite_to_sample_is_refused(bad):
    scores = torch.zeros(3, 5)
    scores[1] = float("-inf")
    scores[1, 2] = bad
    with pytest.raises(ValueError, match=r"rows \[1\] cannot be sampled: their largest score is (nan|-inf|inf)"):
        RowSampler([1, 2, 3], prompt_width=2)(torch.zeros(3, 2, dtype=torch.long), scores)


def test_a_row_samples_the_same_alone_in_a_batch_or_chunked(engine):
    hf, tok = engine
    rows = tok(PROMPTS)["input_ids"]
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.5, top_k=20)
    seeds = [11 * i + 5 for i in range(len(rows))]
    whole = hf.generate(rows, sampling, seeds)
    alone = [hf.generate([row], sampling, [s]) for row, s in zip(rows, seeds)]
    assert whole.completion_ids == [a.completion_ids[0] for a in alone]
    for k in (1, 2, 3):
        chunked = hf.generate(rows, SamplingConfig(**{**sampling.to_dict(), "max_batch_rows": k}), seeds)
        assert chunked.completion_ids == whole.completion_ids
        flat = [lp for row in chunked.logprobs for lp in row]
        assert flat == pytest.approx([lp for row in whole.logprobs for lp in row], abs=1e-5)
    # one seed for the call: row i samples with request_seeds' i-th seed, wherever the call is cut
    cut = SamplingConfig(**{**sampling.to_dict(), "max_batch_rows": 2})
    assert hf.generate(rows, sampling, 9).completion_ids == hf.generate(rows, cut, 9).completion_ids
    assert len({tuple(c) for c in hf.generate([rows[0]] * 8, sampling, 9).completion_ids}) > 1  # rows draw apart


def test_a_prompt_drawn_twice_gets_two_independent_groups(engine):
    hf, tok = engine
    batch = dict(prompt=["12+34=", "7+5=", "12+34="], index=[3, 8, 3], answer=["46", "12", "46"])
    sampling = SamplingConfig(max_new_tokens=6, temperature=2.0)
    exp, _ = collect.rollout(hf, tok, batch, 4, sampling, seed=1, device="cpu", seed_per_prompt=True)
    groups = [exp.completions[g * 4:(g + 1) * 4] for g in range(3)]
    assert groups[0] != groups[2]
    # ... and each group is still a function of (seed, index, occurrence): the batch around it does not count
    alone, _ = collect.rollout(hf, tok, dict(prompt=["12+34="], index=[3], answer=["46"]), 4, sampling, seed=1,
                               device="cpu", seed_per_prompt=True)
    assert alone.completions == groups[0]
    seeds = collect.row_seeds(batch, 4, 1, True)
    assert len(set(seeds)) == 12


def test_seed_per_prompt_needs_the_index_column():
    with pytest.raises(ValueError, match="has no 'index' column"):
        collect.row_seeds(dict(prompt=["a"]), 2, 0, True)


@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_bad_max_batch_rows_is_refused(value):
    with pytest.raises(ValueError, match="max_batch_rows must be an int >= 1, or None"):
        SamplingConfig(max_batch_rows=value)


class Record(Callback):
    """The completions of every rollout and the logged loss and grad norm of every step."""

    def __init__(self):
        self.completions, self.metrics = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.metrics.append({k: trainer.callback_metrics[k].item() for k in ("loss", "grad_norm")})


def _fit(model_dir, rows, lr=1e-3, **kwargs):
    module = RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, seed=5, lr=lr,
                      generation=dict(max_new_tokens=6, max_prompt_length=8), **kwargs)
    record = Record()
    rollout = module.rollout_and_score

    def spy(*args, **kw):
        out = rollout(*args, **kw)
        record.completions.append(list(out[0].completions))
        return out

    module.rollout_and_score = spy
    quiet_trainer(max_steps=2, callbacks=[record]).fit(module, datamodule=PromptDataModule(rows, batch_size=4))
    return record


def test_a_micro_batch_cap_does_not_change_the_data(warm_start_dir, arithmetic_rows):
    """Default sampling settings, ``micro_batch_size=3`` < ``group_size=4``: the same completions, loss
    and grad norm at both steps. SGD, so that step 2 compares the first updates themselves: AdamW's
    first update, lr * g / (|g| + eps), turns the summation-order noise of gradient elements near eps
    into changes of up to 2 * lr (seen at 1e-3 relative in step 2's grad norm)."""
    sgd = dict(optimizer=functools.partial(torch.optim.SGD, lr=1e-3), lr=None)
    one_pass = _fit(warm_start_dir, arithmetic_rows, **sgd)
    micro = _fit(warm_start_dir, arithmetic_rows, micro_batch_size=3, **sgd)
    assert len(one_pass.completions) == len(micro.completions) == 2 and len(one_pass.metrics) == 2
    assert one_pass.completions == micro.completions
    for step in (0, 1):
        assert one_pass.metrics[step] == pytest.approx(micro.metrics[step], rel=1e-5, abs=1e-7), step


def test_docstring_examples_hold():
    import doctest

    from lightning_rlpt.rollout.sampling import per_row

    assert doctest.testmod(per_row).attempted > 0 and doctest.testmod(per_row).failed == 0
