"""`export_checkpoint` on checkpoints of real 2-step fits: the exported Hugging Face directory
computes the trained policy's logits (full fine-tune, LoRA and QLoRA merged, LoRA adapter through
peft), vLLM serves it with HF's greedy tokens, and bad input fails before anything is written."""
import glob
import os

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLModule
from lightning_rlpt.model.export import export_checkpoint

# fp32, per unit of the largest logit: merging W + s·BA reorders sums (observed at logits ~8: 0 for
# full, 4e-6 for QLoRA, 8e-6 for LoRA; the last was 1e-6 before the seeds changed the trained adapter)
RTOL = 2e-5
ATOL = 5e-5  # the same merge, where the logits are the warm start's (~10)
PROMPTS = ["12+34=", "55+66=", "90+19=", "47+47="]
MODES = {
    "full": dict(lr=1e-3, kl_coef=0.05),  # kl > 0: the checkpoint also holds a frozen reference copy
    "lora": dict(lr=1e-2, lora=dict(r=4, lora_alpha=8)),
    # exported dense: the 4-bit base dequantised, the adapter added (see export.py)
    "qlora": dict(lr=1e-2, lora=dict(r=4, lora_alpha=8), quantization="nf4"),
}


def fit_checkpoint(root, warm_start_dir, rows, callbacks=(), **kwargs):
    """2 GRPO steps with a ModelCheckpoint; the trained module and its checkpoint file."""
    module = RLModule(warm_start_dir, reward_funcs=["tiny_task:exact_answer"], group_size=4,
                      generation=dict(max_new_tokens=4, max_prompt_length=8), **kwargs)
    trainer = quiet_trainer(max_steps=2, enable_checkpointing=True,
                            callbacks=[ModelCheckpoint(dirpath=root), *callbacks])
    trainer.fit(module, datamodule=PromptDataModule(rows, batch_size=2))
    (ckpt,) = glob.glob(os.path.join(root, "*.ckpt"))
    return module, ckpt


@pytest.fixture(scope="module", params=list(MODES))
def trained(request, tmp_path_factory, warm_start_dir, arithmetic_rows):
    root = str(tmp_path_factory.mktemp(request.param))
    module, ckpt = fit_checkpoint(root, warm_start_dir, arithmetic_rows[:8], **MODES[request.param])
    return request.param, module, ckpt


def input_ids():
    return task.build_tokenizer()(PROMPTS, return_tensors="pt")["input_ids"]  # same length: no padding


@torch.no_grad()
def logits(model):
    model.train()  # QLoRA: bitsandbytes' fp32 path, the one training used (no dropout in these models)
    return model(input_ids=input_ids()).logits


def test_export_computes_the_trained_policys_logits(trained, tmp_path):
    mode, module, ckpt = trained
    out = export_checkpoint(ckpt, str(tmp_path / "out"))
    assert not os.path.exists(os.path.join(out, "adapter_config.json"))  # a plain model, no peft needed
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert type(exported).__name__ == "LlamaForCausalLM"
    trained = logits(module.policy)
    difference = (logits(exported) - trained).abs().max().item()
    tolerance = RTOL * trained.abs().max().item()
    assert difference < tolerance, f"{mode}: {difference} (tolerance {tolerance:.1e})"
    moved = (logits(AutoModelForCausalLM.from_pretrained(module.model_source["model_name_or_path"])) - trained).abs().max()
    assert moved > 100 * tolerance, f"{mode}: training moved the logits by {moved:.1e} only: the test would not see a lost update"
    assert AutoTokenizer.from_pretrained(out)("12+34=")["input_ids"] == module.tokenizer("12+34=")["input_ids"]


@pytest.mark.parametrize("trained", ["lora"], indirect=True)
def test_checkpoints_that_kept_the_base_path_among_the_hyper_parameters_still_export(trained, tmp_path):
    """Before 2026-12-04 RLModule saved ``model_name_or_path`` / ``lora_config`` as hyper-parameters;
    now they sit under ``checkpoint["lightning_rlpt"]["model_source"]``, out of LightningCLI's way."""
    _, module, ckpt = trained
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert "model_name_or_path" not in state["hyper_parameters"]
    source = state["lightning_rlpt"].pop("model_source")
    assert source["lora_config"]["r"] == 4
    state["hyper_parameters"].update(source)
    old = tmp_path / "old.ckpt"
    torch.save(state, old)
    new_logits = logits(AutoModelForCausalLM.from_pretrained(export_checkpoint(ckpt, str(tmp_path / "new"))))
    old_logits = logits(AutoModelForCausalLM.from_pretrained(export_checkpoint(str(old), str(tmp_path / "old"))))
    assert torch.equal(new_logits, old_logits)


@pytest.mark.parametrize("trained", ["full"], indirect=True)
def test_adapter_only_of_a_full_fine_tune_fails(trained, tmp_path):
    _, _, ckpt = trained
    with pytest.raises(ValueError, match="full fine-tune: it has no LoRA adapter"):
        export_checkpoint(ckpt, str(tmp_path / "adapter"), merge_lora=False)
    assert not (tmp_path / "adapter").exists()


@pytest.mark.parametrize("trained", ["lora"], indirect=True)
def test_lora_adapter_alone_loads_with_peft(trained, tmp_path, warm_start_dir):
    _, module, ckpt = trained
    from peft import PeftModel

    out = export_checkpoint(ckpt, str(tmp_path / "adapter"), merge_lora=False)
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    restored = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(warm_start_dir), out)
    assert (logits(restored) - logits(module.policy)).abs().max().item() < ATOL


def test_lora_with_a_reference_adapter_exports_the_policy_adapter(tmp_path, warm_start_dir, arithmetic_rows):
    """ReferenceReset adds a second adapter, ``reference``; the export is the trained one."""
    from lightning_rlpt.callbacks import ReferenceReset

    module, ckpt = fit_checkpoint(str(tmp_path / "ckpt"), warm_start_dir, arithmetic_rows[:8],
                                  callbacks=[ReferenceReset(mode="hard", every_n_steps=1)], kl_coef=0.05,
                                  **MODES["lora"])
    assert "reference" in module.policy.peft_config
    merged = AutoModelForCausalLM.from_pretrained(export_checkpoint(ckpt, str(tmp_path / "merged")))
    assert (logits(merged) - logits(module.policy)).abs().max().item() < ATOL
    adapter = export_checkpoint(ckpt, str(tmp_path / "adapter"), merge_lora=False)
    assert "reference" not in os.listdir(adapter)  # peft would save a second adapter in a subdirectory


def test_a_checkpoint_on_the_wrong_base_fails_before_writing(trained, tmp_path, qwen2_dir):
    _, _, ckpt = trained
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="does not fit the base model") as err:
        export_checkpoint(ckpt, str(out), model=qwen2_dir)
    assert "other shapes" in str(err.value) and qwen2_dir in str(err.value)
    assert not out.exists()


def test_missing_checkpoint_and_a_used_out_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        export_checkpoint(str(tmp_path / "missing.ckpt"), str(tmp_path / "out"))
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not an empty directory"):  # checked before any loading
        export_checkpoint(str(tmp_path / "missing.ckpt"), str(tmp_path / "used"))


@pytest.mark.parametrize("trained", ["lora"], indirect=True)  # one vLLM start: the merged LoRA export
def test_vllm_serves_the_export_with_hfs_greedy_tokens(trained, tmp_path):
    _, _, ckpt = trained
    from lightning_rlpt.rollout.vllm.checks import import_vllm
    from lightning_rlpt.rollout.vllm.engine import preserved_global_rng

    import_vllm()  # sets VLLM_ENABLE_V1_MULTIPROCESSING=0 before `import vllm`: in-process engine
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    out = export_checkpoint(ckpt, str(tmp_path / "out"))
    hf = AutoModelForCausalLM.from_pretrained(out)
    ids = input_ids()
    with torch.no_grad():
        hf_tokens = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4,
                                eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID)[:, ids.shape[1]:]
    with preserved_global_rng():  # vLLM seeds the global RNGs and sets torch's thread count
        llm = LLM(model=out, dtype="float32", enforce_eager=True, max_model_len=64, kv_cache_memory_bytes=64 << 20)
        try:
            outs = llm.generate([TokensPrompt(prompt_token_ids=row) for row in ids.tolist()],
                                SamplingParams(temperature=0.0, max_tokens=4, stop_token_ids=[task.EOS_ID]),
                                use_tqdm=False)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
    for row, out_ in zip(hf_tokens.tolist(), outs):
        row = row[:row.index(task.EOS_ID) + 1] if task.EOS_ID in row else row  # HF pads after EOS
        assert list(out_.outputs[0].token_ids) == row
    assert any(len(out_.outputs[0].token_ids) > 1 for out_ in outs)  # not just an immediate EOS
