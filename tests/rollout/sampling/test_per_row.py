"""Per-row sampling on the HF engine (`rollout.sampling.per_row`): Gumbel-max over a hash of (row
seed, step, token) draws from the processed softmax; a row's completion depends on its seed
alone (not on its batch, ``max_batch_rows`` chunks or the training micro-batch caps); a prompt
drawn twice with ``seed_per_prompt`` gets two independent groups; the behaviour log-probs carry
no noise (tests/model/test_logprobs.py compares them with the learner's)."""
import pytest
import torch
from lightning.pytorch.callbacks import Callback

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.model.loading import load_policy, load_tokenizer
from lightning_rlpt.rollout import HFGenerateEngine, SamplingConfig, collect
from lightning_rlpt.rollout.sampling.per_row import RowSampler, gumbel_scores, token_keys, uniform

PROMPTS = ["7+5=", "12+34=", "99+99=", "3+4=", "1+1=", "45+6=", "8="]  # different lengths: left padding


@pytest.fixture(scope="module")
def engine(warm_start_dir):
    tok, policy = load_tokenizer(warm_start_dir, None), load_policy(warm_start_dir)
    return HFGenerateEngine(policy, tok.eos_token_id, tok.pad_token_id, return_logprobs=True), tok


def test_gumbel_max_draws_from_the_softmax_of_the_processed_scores():
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, float("-inf")]])
    n = 20_000
    sampler = RowSampler(list(range(n)), prompt_width=3)
    picked = sampler(torch.zeros(n, 3, dtype=torch.long), scores.expand(n, -1)).argmax(-1)
    freq = torch.bincount(picked, minlength=5).double() / n
    expected = scores.double().softmax(-1)[0]
    assert freq[4] == 0  # a token the warpers removed is never drawn
    assert torch.allclose(freq, expected, atol=4 * (expected * (1 - expected) / n).sqrt().max().item())


def test_the_hash_is_uniform_and_keyed_by_seed_step_and_token():
    u = uniform(torch.tensor([3, 2**61 + 3]), 0, 50_000)
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert not torch.equal(u[0], u[1])  # the seed's high bits count
    assert not torch.equal(u, uniform(torch.tensor([3, 2**61 + 3]), 1, 50_000))  # so does the step
    assert torch.equal(u, uniform(torch.tensor([3, 2**61 + 3]), 0, 50_000))
    assert abs(torch.corrcoef(torch.stack([u[0, :-1], u[0, 1:]]))[0, 1].item()) < 0.02  # neighbouring tokens


@pytest.mark.parametrize("rows, vocab", [(9, 32_000), (3, 151_936), (5, 50), (1, 7)])
def test_the_blocked_noise_is_the_hash_definition_bit_for_bit(rows, vocab):
    """`gumbel_scores` computes the noise a few rows at a time, in place; its bits must be those of
    ``-log(-log(uniform(...)))`` over the whole batch, or every HF draw would change (9 rows at
    32,000 cross a block boundary: 4 rows a block; 151,936 is wider than the cache block)."""
    g = torch.Generator().manual_seed(rows)
    seeds = torch.randint(0, 2**62, (rows,), generator=g)
    scores = torch.randn(rows, vocab, generator=g)
    scores[0, : min(3, vocab - 1)] = float("-inf")  # removed by a warper: stays -inf
    tokens = token_keys(vocab, scores.device)
    u = uniform(seeds, 4, vocab, tokens)
    expected = scores + u.log_().neg_().log_().neg_().float()
    assert torch.equal(gumbel_scores(scores, seeds, 4, tokens), expected)
    assert not torch.equal(gumbel_scores(scores, seeds, 5, tokens), expected)  # the step counts


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


def _fit(model_dir, rows, **kwargs):
    module = RLModule(model_dir, reward_funcs=[task.exact_answer], group_size=4, seed=5, lr=1e-3,
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
    """Default settings, ``micro_batch_size=3`` < ``group_size=4``: the same completions, loss and grad norm."""
    one_pass = _fit(warm_start_dir, arithmetic_rows)
    micro = _fit(warm_start_dir, arithmetic_rows, micro_batch_size=3)
    assert len(one_pass.completions) == len(micro.completions) == 2 and len(one_pass.metrics) == 2
    assert one_pass.completions == micro.completions
    for a, b in zip(one_pass.metrics, micro.metrics):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7)


def test_docstring_examples_hold():
    import doctest

    from lightning_rlpt.rollout.sampling import per_row

    assert doctest.testmod(per_row).attempted > 0 and doctest.testmod(per_row).failed == 0
