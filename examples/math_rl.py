"""Math word problems end to end: a jsonl file, a column map, a chat template, and the reward
library (``math_answer_reward`` checked by math_verify, ``format_reward`` for
``<think>...</think><answer>...</answer>``) on a standard ``lightning.Trainer``.

The policy is a tiny, randomly initialised Llama with a character-level tokenizer, so its
completions are noise and its rewards stay near 0; the point is the API. Swap in a real
instruct model (``RLModule("Qwen/Qwen2.5-0.5B-Instruct", ...)``) and a real dataset to train.

    python examples/math_rl.py                # 2 steps, metrics in runs/math_rl/metrics.csv
    python examples/math_rl.py --steps 20 --out /tmp/math_rl
"""
from __future__ import annotations

import argparse
import os
import string

import lightning as L
from lightning.pytorch.loggers import CSVLogger
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from lightning_rlpt import PromptDataModule, RLModule, format_reward, math_answer_reward

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "math_word_problems.jsonl")
# A string prompt becomes one user turn; the template writes <s> and the generation prompt itself.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, plus <pad> <s> </s> and a chat template."""
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<s>", "</s>"] + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    # Every character its own token, newlines included ("." would leave "\n\n" one unknown piece)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<pad>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    """2 layers × 128 wide, head_dim 64 (as the tests' tiny models, which vLLM's CPU backend also runs)."""
    L.seed_everything(seed, verbose=False)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(config)


def build(args: argparse.Namespace) -> tuple[RLModule, PromptDataModule]:
    tokenizer = build_tokenizer()
    # The file's columns are question/solution: map them onto the prompt and the `answer`
    # keyword that math_answer_reward reads.
    data = PromptDataModule(args.data, columns={"question": "prompt", "solution": "answer"},
                            batch_size=args.prompts, seed=args.seed)
    module = RLModule(
        build_model(len(tokenizer), args.seed), tokenizer=tokenizer,
        reward_funcs=[math_answer_reward, format_reward], reward_weights=[1.0, 0.2],
        group_size=args.group_size, lr=1e-4, seed=args.seed,
        generation=dict(max_new_tokens=args.max_new_tokens, max_prompt_length=160),
    )
    return module, data


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DATA, help="a .jsonl/.parquet file or a save_to_disk directory")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (one rollout each)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/math_rl")
    args = parser.parse_args(argv)
    module, data = build(args)
    logger = CSVLogger(args.out, name="", version="")
    trainer = L.Trainer(max_steps=args.steps, logger=logger, log_every_n_steps=1, accelerator="cpu", devices=1,
                        limit_val_batches=0, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False)
    trainer.fit(module, datamodule=data)
    names = ["reward", "rewards/math_answer/mean", "rewards/format/mean"]
    metrics = {k: float(trainer.logged_metrics[k]) for k in names}
    print("last step: " + "  ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
    print(f"metrics: {os.path.join(logger.log_dir, 'metrics.csv')}")
    return metrics


if __name__ == "__main__":
    main()
