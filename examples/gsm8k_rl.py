"""GSM8K-style math word problems end to end: a file in GSM8K's schema (``question``, and an
``answer`` that is a worked solution ending in ``#### N``), the benchmark's reference
extraction, and ``math_answer_reward`` on a standard ``lightning.Trainer``, with greedy
accuracy measured before and after training.

Each row's reference is what GSM8K's own scoring takes: the text after the last ``####``, commas
removed, stripped (``"... #### 1,200"`` -> ``"1200"``). ``PromptDataModule`` cannot transform
rows (it only renames columns), so the extraction happens here, when the file is read into rows;
a row without ``####`` stops the run naming the row, instead of scoring 0 on every completion.
The prompt asks for the final number as ``<answer>N</answer>``, the block the reward reads.

What the default run can and cannot show: the policy is the tiny, randomly initialised Llama of
``math_rl.py`` (2 layers x 128, one token per character). It cannot solve GSM8K, and cannot
learn to in a few steps: its completions are noise, so its rewards are 0 (a noise completion
whose last number happens to equal the reference can score 1), GRPO's group advantages are 0,
and the gradient is 0 (``grad_norm`` 0 in metrics.csv). Accuracy stays at or near 0 before and
after. The run shows the pipeline (schema, extraction, reward, rollouts, metrics), not learning.

    python examples/gsm8k_rl.py               # 2 steps on examples/data/gsm8k_sample.jsonl
    python examples/gsm8k_rl.py --steps 20 --out /tmp/gsm8k_rl

It prints greedy pass@1 (the mean math reward, one greedy completion per prompt) before and
after training; runs/gsm8k_rl/metrics.csv holds it as ``val/accuracy`` in the first and last
rows, around the training steps' ``rewards/math_answer/mean``. The sample file has 12 rows, so
it is evaluated on its own training rows; ``--eval-data`` names a held-out file.

To learn something, run the same script on a real instruct model on a GPU, with vLLM rollouts
(``VLLMRollout`` from ``lightning_rlpt.callbacks``; ``pip install vllm``) and the real data, e.g.
a local copy of ``openai/gsm8k``'s ``main`` parquet files (same columns):

    python examples/gsm8k_rl.py --model Qwen/Qwen2.5-0.5B-Instruct --vllm \\
        --accelerator gpu --precision bf16-true \\
        --data gsm8k/main/train-00000-of-00001.parquet \\
        --eval-data gsm8k/main/test-00000-of-00001.parquet --eval-rows 256 \\
        --steps 200 --prompts 16 --group-size 8 --max-new-tokens 512 --lr 1e-6 --out runs/gsm8k_qwen

``--model`` takes a hub id or a local directory (model and tokenizer, whose chat template
formats the prompts); ``--vllm`` adds ``VLLMRollout(gpu_memory_utilization=0.3, validate=True)``
so the before/after evaluations sample with vLLM too.
"""
from __future__ import annotations

import argparse
import os
import re
from typing import Any

import lightning as L
from lightning.pytorch.loggers import CSVLogger
# Run as `python examples/gsm8k_rl.py`, Python puts examples/ on sys.path, so the sibling
# example's tiny tokenizer and model are importable as a module.
from math_rl import build_model, build_tokenizer

from lightning_rlpt import PromptDataModule, RLModule, math_answer_reward
from lightning_rlpt.data import load_rows

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gsm8k_sample.jsonl")
# Short on purpose: the tiny model's context is 256 characters, prompt and completion together.
INSTRUCTION = "\nGive the final number as <answer>N</answer>."
TINY_CONTEXT = 256  # build_model's max_position_embeddings
# GSM8K's final answers are numbers: an optional sign, digits, an optional decimal part.
NUMBER = re.compile(r"-?\d+(\.\d+)?")


def extract_reference(answer: str, where: str = "the answer") -> str:
    """The reference answer as GSM8K scores it: after the last ``####``, commas removed, stripped.

    Raises a ValueError naming ``where`` when there is no ``####`` or no number after it: such
    a row would otherwise reach the reward as an unparseable gold and score 0 whatever the model says.

    Examples:
        >>> extract_reference("12 + 60 = <<12+60=72>>72 cookies.\\n#### 72")
        '72'
        >>> extract_reference("#### 1,200")
        '1200'
    """
    if "####" not in answer:
        raise ValueError(f"{where} has no '####' line, so it has no reference answer: {answer[-80:]!r}. "
                         "GSM8K answers end with '#### N'; fix or drop that row")
    reference = answer.rsplit("####", 1)[1].replace(",", "").strip()
    if not NUMBER.fullmatch(reference):
        raise ValueError(f"{where}: the text after its last '####' is {reference!r}, not a number; GSM8K answers "
                         "end with '#### N' (e.g. '#### 72' or '#### 1,200')")
    return reference


def gsm8k_rows(data: Any, limit: int | None = None) -> list[dict[str, str]]:
    """Rows ``{"prompt": question + INSTRUCTION, "answer": reference}`` from a file (.jsonl,
    .parquet, ...) or list in GSM8K's schema; ``answer`` is the keyword math_answer_reward reads."""
    rows = load_rows(data)[:limit]
    name = repr(str(data)) if isinstance(data, (str, os.PathLike)) else "the rows"
    if rows and not {"question", "answer"} <= set(rows[0]):
        raise ValueError(f"{name} has columns {list(rows[0])}; GSM8K's schema is 'question' and 'answer'")
    return [{"prompt": row["question"] + INSTRUCTION,
             "answer": extract_reference(row["answer"], f"row {i} of {name} (counting from 0)")}
            for i, row in enumerate(rows)]


def build(args: argparse.Namespace) -> tuple[RLModule, PromptDataModule]:
    """The module (tiny random Llama, or ``--model``) and the data (training rows, evaluation rows)."""
    if args.model is None:
        tokenizer = build_tokenizer()
        model, prompt_limit = build_model(len(tokenizer), args.seed), TINY_CONTEXT - args.max_new_tokens
    else:  # a hub id or directory: RLModule loads the model and its tokenizer
        tokenizer, model, prompt_limit = None, args.model, 512  # GSM8K questions are well under 512 tokens
    data = PromptDataModule(gsm8k_rows(args.data), val_data=gsm8k_rows(args.eval_data or args.data, args.eval_rows),
                            batch_size=args.prompts, seed=args.seed)
    # One reward, so greedy validation's val/accuracy (score >= 1) is exactly the mean math reward: pass@1.
    module = RLModule(model, tokenizer=tokenizer, reward_funcs=[math_answer_reward], group_size=args.group_size,
                      lr=args.lr, seed=args.seed,
                      # A longer prompt keeps its last tokens (the question and the instruction), with a warning.
                      generation=dict(max_new_tokens=args.max_new_tokens,
                                      max_prompt_length=args.max_prompt_length or prompt_limit))
    return module, data


def make_trainer(args: argparse.Namespace, logger: CSVLogger) -> L.Trainer:
    callbacks = []
    if args.vllm:
        from lightning_rlpt.callbacks import VLLMRollout

        callbacks.append(VLLMRollout(gpu_memory_utilization=0.3, validate=True))
    # No validation inside fit: accuracy is measured by the explicit validate() calls around it.
    return L.Trainer(max_steps=args.steps, logger=logger, log_every_n_steps=1, accelerator=args.accelerator,
                     devices=1, precision=args.precision, callbacks=callbacks, check_val_every_n_epoch=None,
                     val_check_interval=args.steps + 1, num_sanity_val_steps=0, enable_checkpointing=False,
                     enable_model_summary=False, enable_progress_bar=False)


def accuracy(trainer: L.Trainer, module: RLModule, data: PromptDataModule) -> float:
    """Greedy pass@1 on the evaluation rows: the share of prompts whose math reward is 1."""
    trainer.validate(module, datamodule=data, verbose=False)
    return float(trainer.callback_metrics["val/accuracy"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DATA, help="GSM8K-schema rows: .jsonl/.parquet file or save_to_disk dir")
    parser.add_argument("--eval-data", default=None, help="rows for the before/after accuracy (default: --data)")
    parser.add_argument("--eval-rows", type=int, default=64, help="evaluate on the first N rows of --eval-data")
    parser.add_argument("--model", default=None, help="hub id or directory (default: the tiny random Llama)")
    parser.add_argument("--vllm", action="store_true", help="sample rollouts with VLLMRollout (needs vllm)")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (one rollout each)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--max-prompt-length", type=int, default=None,
                        help="keep a prompt's last N tokens (default: 512 with --model, else what fits)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/gsm8k_rl")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    module, data = build(args)
    logger = CSVLogger(args.out, name="", version="")
    trainer = make_trainer(args, logger)
    before = accuracy(trainer, module, data)
    trainer.fit(module, datamodule=data)
    # Read before the next validate(), which replaces logged_metrics with its own.
    last = {k: float(trainer.logged_metrics[k]) for k in ["reward", "rewards/math_answer/mean"]}
    after = accuracy(trainer, module, data)
    metrics = {"accuracy_before": before, "accuracy_after": after, **last}
    print(f"greedy pass@1 (mean math reward) on {len(data.val_set)} prompts: before {before:.3f}  after {after:.3f}")
    print("last step: " + "  ".join(f"{k} {metrics[k]:.3f}" for k in ["reward", "rewards/math_answer/mean"]))
    print(f"metrics: {os.path.join(logger.log_dir, 'metrics.csv')}")
    return metrics


if __name__ == "__main__":
    main()
