"""The acceptance test of issue 26: the TRL GRPO script in docs/from_trl.md (conversational data,
three reward functions, one returning None, a GRPOConfig with LoRA, loss_type, scale_rewards,
epsilon_high, beta, mask_truncated_completions and a cosine schedule) runs verbatim, extracted
from the doc, on a tiny model saved where the script looks for it; the run it makes is TRL's
configuration, checked knob by knob on the module it built."""
import json
import os
import re
import runpy
import shutil

import torch

import tiny_task as task
from conftest import ROOT
from lightning_rlpt.optim.schedules import WarmupCosineLR

DOC = os.path.join(ROOT, "docs", "from_trl.md")
# A chat template that renders the user's message after <s>, as the warm start was trained on.
TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def doc_script() -> str:
    """The fenced block of docs/from_trl.md whose first line names ``train_grpo.py``."""
    blocks = re.findall(r"```python\n(# train_grpo\.py.*?)```", open(DOC, encoding="utf-8").read(), flags=re.S)
    assert len(blocks) == 1, "docs/from_trl.md must hold exactly one train_grpo.py block"
    return blocks[0]


def _prepare(tmp_path, warm_start_dir):
    """What the script names: a model at checkpoints/sft (the demo's warm start with a chat
    template) and conversational prompts at data/sums.jsonl."""
    model = tmp_path / "checkpoints" / "sft"
    shutil.copytree(warm_start_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    (tmp_path / "data").mkdir()
    train, _ = task.split_pairs()
    with open(tmp_path / "data" / "sums.jsonl", "w") as f:
        for row in task.rows(train[:64]):
            f.write(json.dumps({"prompt": [{"role": "user", "content": row["prompt"]}], "answer": row["answer"]}) + "\n")


def test_the_trl_script_in_the_doc_runs_verbatim(tmp_path, monkeypatch, warm_start_dir):
    _prepare(tmp_path, warm_start_dir)
    (tmp_path / "train_grpo.py").write_text(doc_script())
    monkeypatch.chdir(tmp_path)
    ran = runpy.run_path(str(tmp_path / "train_grpo.py"), run_name="__main__")
    module, trainer = ran["model"], ran["trainer"]

    assert trainer.global_step == 4
    # TRL's configuration, knob by knob: dr_grpo, batch-std advantages with TRL's eps, clip-higher,
    # beta with a reference, masked truncations, the three weights, a cosine schedule over the run
    objective = module.objective
    assert (objective.policy_loss, objective.loss_aggregation, objective.advantage) == (
        "ppo_clip", "seq-mean-token-sum-norm", "grpo_batch_std")
    assert (module.knobs.kl_coef, module.knobs.clip_low, module.knobs.clip_high) == (0.04, 0.2, 0.28)
    assert module.use_reference and module.hparams.mask_truncated_completions  # LoRA: the adapters off
    assert module.advantage_kwargs == {"eps": 1e-4} and module.sampling.max_new_tokens == 8
    assert module.rewards.weights.tolist() == [1.0, 0.5, 1.0]
    scheduler = module.lr_schedulers()
    assert isinstance(scheduler, WarmupCosineLR) and (scheduler.total_steps, scheduler.warmup_steps) == (4, 1)
    # LoRA trained (its B matrices start at 0), the base weights did not
    lora_b = [p for n, p in module.policy.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)
    assert all(not p.requires_grad for n, p in module.policy.named_parameters() if "lora_" not in n)
    # the reward that returns None was scored where it applies, and everything went to output_dir
    assert torch.isfinite(trainer.callback_metrics["rewards/carry_reward/mean"])
    assert list((tmp_path / "runs" / "sums-grpo").rglob("events.out.tfevents.*"))
    assert list((tmp_path / "runs" / "sums-grpo").rglob("*.ckpt"))
