"""examples/math_rl.py runs as a script: 2 steps, both library rewards logged under their names."""
import csv

from example_process import run_example


def test_math_rl_example_runs(tmp_path):
    proc = run_example("math_rl.py", ["--steps", "2"], tmp_path)
    assert "rewards/math_answer/mean" in proc.stdout
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["0", "1"]
    for name in ["reward", "rewards/math_answer/mean", "rewards/format/mean", "rewards/math_answer/failures"]:
        assert all(r[name] != "" for r in rows), name
    # A random policy writes noise: no reward function failed on it, and no score is out of [0, 1]
    assert all(float(r["rewards/math_answer/failures"]) == 0 and 0 <= float(r["reward"]) <= 1.2 for r in rows)


def test_the_tiny_tokenizer_keeps_every_character():
    """One token per character, blank lines too (HumanEval prompts start with two newlines; a
    pre-tokenizer splitting on "." made them one unknown token)."""
    import sys

    from conftest import ROOT

    sys.path.insert(0, f"{ROOT}/examples")
    try:
        from math_rl import build_tokenizer
    finally:
        sys.path.remove(f"{ROOT}/examples")
    tokenizer, text = build_tokenizer(), "\n\ndef f(x):\n    return x  # ok\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
