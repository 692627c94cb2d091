"""Which LoRA policies are synced to vLLM servers as adapters (no server needed): the choice of
``lora_sync``, the adapter written (its bytes counted by hand), the server flags, the launch
checkpoint's base weights, and the bad inputs. The served path is tested in test_vllm_server.py."""
import json

import pytest
import torch
from safetensors.torch import load_file

from lightning_rlpt.callbacks import VLLMServerRollout
from lightning_rlpt.model.loading import load_policy
from lightning_rlpt.model.weights import policy_weights
from lightning_rlpt.rollout.vllm.lora_transport import (AdapterTransport, adapter_transport, launch_lora_options,
                                                        lora_sync_mode, server_lora_args, write_adapter)
from lightning_rlpt.rollout.vllm.transport import SnapshotTransport

# Demo: 2 layers; q, k, v, o are 128 → 128, gate/up 128 → 256, down 256 → 128; r numbers per side.
def adapter_numbers(r):
    return 2 * r * (4 * (128 + 128) + 3 * (128 + 256))


def test_auto_serves_plain_lora_as_an_adapter_and_merges_what_vllm_cannot_load(warm_start_dir):
    lora = load_policy(warm_start_dir, lora=dict(r=4))
    assert lora_sync_mode(lora, "auto") == "adapter" and lora_sync_mode(lora, "merged") == "merged"
    assert lora_sync_mode(load_policy(warm_start_dir), "auto") == "full"
    assert lora_sync_mode(load_policy(warm_start_dir, lora=dict(r=4, use_dora=True)), "auto") == "merged"
    qlora = load_policy(warm_start_dir, lora=dict(r=4), quantization="nf4")
    assert lora_sync_mode(qlora, "auto") == "merged"
    with pytest.raises(ValueError, match="lora_sync='adapter' cannot serve .*QLoRA.*bitsandbytes.*Use "
                                         "lora_sync='merged'"):
        lora_sync_mode(qlora, "adapter")
    assert isinstance(adapter_transport(lora, "auto"), AdapterTransport)
    assert adapter_transport(lora, "merged") is None and adapter_transport(qlora, "auto") is None


def test_the_adapter_written_is_peft_s_and_its_bytes_are_its_tensors(warm_start_dir, tmp_path):
    policy = load_policy(warm_start_dir, lora=dict(r=4, lora_alpha=8))
    sent = write_adapter(str(tmp_path), policy)
    assert sent == adapter_numbers(4) * 4 == 69_632  # fp32
    tensors = load_file(tmp_path / "adapter_model.safetensors")
    assert len(tensors) == 2 * 7 * 2 and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in tensors)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in tensors  # the names vLLM loads
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    assert write_adapter(str(tmp_path / "half"), policy, torch.bfloat16) == sent // 2


def test_server_flags_round_the_rank_up_to_one_vllm_allows(warm_start_dir):
    for r, allowed in ((4, "8"), (8, "8"), (16, "16")):
        assert server_lora_args(load_policy(warm_start_dir, lora=dict(r=r))) == [
            "--enable-lora", "--max-lora-rank", allowed, "--max-loras", "1"]


def test_launch_checkpoint_is_the_base_when_adapters_are_served(warm_start_dir):
    policy = load_policy(warm_start_dir, lora=dict(r=4))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)  # a trained adapter: merged weights differ from the base
    base = dict(policy_weights(load_policy(warm_start_dir)))
    args, env, weights = launch_lora_options(policy, AdapterTransport(None, policy))
    assert args[0] == "--enable-lora" and env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    weights = dict(weights)
    assert all(torch.equal(weights[k], base[k]) for k in base) and set(weights) == set(base)
    args, env, merged = launch_lora_options(policy, SnapshotTransport("/nonexistent"))
    merged = dict(merged)
    assert (args, env) == ([], {}) and not torch.equal(merged["model.layers.0.mlp.up_proj.weight"],
                                                       base["model.layers.0.mlp.up_proj.weight"])


def test_bad_lora_inputs_say_what_to_do(warm_start_dir):
    with pytest.raises(ValueError, match=r"lora_sync must be one of \('auto', 'adapter', 'merged'\) \(got 'lora'\)"):
        VLLMServerRollout(urls=["http://127.0.0.1:1"], lora_sync="lora")
    with pytest.raises(ValueError, match="AdapterTransport cannot serve .*no peft LoRA adapter"):
        AdapterTransport(None, load_policy(warm_start_dir))
    with pytest.raises(ValueError, match="modules_to_save=.*not loaded by vLLM.*lora_sync='merged'"):
        lora_sync_mode(load_policy(warm_start_dir, lora=dict(r=4, modules_to_save=["lm_head"])), "adapter")
    with pytest.raises(ValueError, match=r"lora_sync must be one of"):
        lora_sync_mode(load_policy(warm_start_dir, lora=dict(r=4)), "Auto")
