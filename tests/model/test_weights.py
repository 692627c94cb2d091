"""Weight gathering for the vLLM engine (no engine needed): HF names, merged LoRA, dequantised
QLoRA, the trained adapter left untouched; plus the engine's seed and sleep bookkeeping."""
import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_rlpt.model.loading import load_policy
from lightning_rlpt.rollout.sampling import SamplingConfig
from lightning_rlpt.rollout.vllm.engine import VLLMEngine, request_seeds
from lightning_rlpt.model.weights import checkpoint_name, policy_weights

PROMPT = torch.tensor([[1, 4, 5, 13, 6, 7, 14]])


def _randomise_lora(policy):
    torch.manual_seed(0)
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)


def _dense_from(path, weights):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.load_state_dict(weights, strict=True)
    return model


def test_full_weights_are_the_checkpoint(warm_start_dir):
    policy = load_policy(warm_start_dir)
    weights = dict(policy_weights(policy))
    ref = AutoModelForCausalLM.from_pretrained(warm_start_dir, dtype=torch.float32).state_dict()
    assert set(weights) == set(ref)
    assert all(torch.equal(weights[k], ref[k]) for k in ref)


def test_lora_weights_are_merged_without_touching_the_adapter(warm_start_dir):
    policy = load_policy(warm_start_dir, lora=dict(r=4))
    _randomise_lora(policy)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    weights = dict(policy_weights(policy))
    # the names vLLM loads: no peft prefixes, no adapter tensors
    ref_names = set(AutoModelForCausalLM.from_pretrained(warm_start_dir).state_dict())
    assert set(weights) == ref_names
    # the same tensors as peft's own merge, and the trained module is unchanged
    merged = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert max((weights[k] - merged[k]).abs().max().item() for k in weights) == 0.0
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())
    assert not any(getattr(m, "merged", False) for m in policy.modules())
    with torch.no_grad():
        diff = (_dense_from(warm_start_dir, weights)(PROMPT).logits - policy(PROMPT).logits).abs().max().item()
    assert diff < 1e-4


def test_qlora_weights_are_dequantised_plus_delta(warm_start_dir):
    policy = load_policy(warm_start_dir, lora=dict(r=4), quantization="nf4")
    _randomise_lora(policy)
    weights = dict(policy_weights(policy))
    policy.train()  # bitsandbytes' fp32 dequantise path (eval + no-grad would repack to its bf16 CPU kernel)
    with torch.no_grad():
        dense = _dense_from(warm_start_dir, weights)(PROMPT).logits.log_softmax(-1)
        quant = policy(PROMPT).logits.log_softmax(-1)
    # one fp32 add of the delta onto exactly dequantised NF4 values: fp32 round-off only
    assert (dense - quant).abs().max().item() < 1e-4


def test_repacked_qlora_base_is_refused(warm_start_dir):
    policy = load_policy(warm_start_dir, lora=dict(r=4), quantization="nf4")
    layer = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    layer.weight.quant_state.packing_format_for_cpu = True  # what bitsandbytes' CPU inference path sets
    with pytest.raises(RuntimeError, match="repacked"):
        dict(policy_weights(policy))


def test_checkpoint_names():
    assert checkpoint_name("base_model.model.model.layers.0.mlp.up_proj.base_layer.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert checkpoint_name("lm_head.modules_to_save.default.weight") == "lm_head.weight"


def test_request_seeds_are_distinct_and_reproducible():
    seeds = request_seeds(123, 16)
    assert len(set(seeds)) == 16 and seeds == request_seeds(123, 16) and seeds != request_seeds(124, 16)
    per_row = request_seeds([7, 7, 9, 9], 4)  # a group's rows share a seed: they still draw apart
    assert len(set(per_row)) == 4 and per_row[:2] == request_seeds([7, 7], 2)  # ... independent of other groups


class _StubLLM:
    """Records the calls the engine makes, to check the sleep/wake order without a GPU."""

    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.calls.append(f"wake{tags or ''}")

    def collective_rpc(self, name, kwargs):
        list(kwargs["weights_iterator"])
        self.calls.append(name)

    def reset_prefix_cache(self):
        self.calls.append("reset")

    def generate(self, prompts, params, use_tqdm):
        self.calls.append("generate")
        return []


def test_sleep_between_phases_orders_sleep_and_wake(monkeypatch):
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.__dict__.update(llm=_StubLLM(), can_sleep=True, asleep=False, phase="training", where="x", syncs=0,
                           overrides={}, max_model_len=32, eos_token_id=2, sync_every=1, policy_version=0, served_head=True)
    monkeypatch.setattr(VLLMEngine, "sampling_params", lambda self, s, stop, seeds: [])
    monkeypatch.setattr("vllm.inputs.TokensPrompt", dict, raising=False)
    cfg = SamplingConfig(max_new_tokens=2)
    engine.generate([[1, 2]], cfg, 0)
    engine.load_weights(iter([("w", torch.zeros(1))]), 1)
    engine.generate([[1, 2]], cfg, 0)
    assert engine.llm.calls == ["generate", "sleep1", "wake['weights']", "reload_weights", "reset", "sleep1",
                                "wake", "generate", "sleep1"]
    assert engine.policy_version == 1


def test_cpu_has_no_sleep_mode():
    from vllm.platforms import current_platform

    # on CPU sleep_between_phases is therefore a no-op
    assert current_platform.is_sleep_mode_available() == torch.cuda.is_available()
