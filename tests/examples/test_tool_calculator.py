"""The tool-calculator example: its traces, tokenizer and chat template, its reward, the warm
start's labels, and a short run of both arms end to end."""
import os
import sys

import pytest
from conftest import ROOT
from transformers.utils import get_json_schema

CALCULATOR = os.path.join(ROOT, "examples", "tool_calculator")
sys.path.insert(0, CALCULATOR)  # this test exercises the example itself
import greedy_eval as evaluate  # noqa: E402  (examples/tool_calculator/greedy_eval.py)
import make_traces  # noqa: E402
import calculator as task  # noqa: E402
import calculator_sft as warm_start  # noqa: E402

SCHEMAS = [get_json_schema(task.multiply)]


def factors(trace: dict) -> tuple[int, int]:
    a, b = trace["messages"][0]["content"].rstrip("=").split("*")
    return int(a), int(b)


def test_trace_sets_format_only_calls_mix_is_half_direct_and_no_held_out_product_is_traced():
    fmt, mix = make_traces.make(**make_traces.FORMAT), make_traces.make(**make_traces.MIX)
    assert len(fmt) == 4000 and all(len(t["messages"]) == 4 for t in fmt)
    assert len(mix) == 400 and 0.4 < sum(len(t["messages"]) == 4 for t in mix) / len(mix) < 0.6
    assert make_traces.make(**make_traces.MIX) == mix  # fixed by the seed
    for t in fmt + mix:
        a, b = factors(t)
        assert t["messages"][-1] == {"role": "assistant", "content": str(a * b)}
    train, dev, test = task.split_pairs()
    held = {(min(a, b), max(a, b)) for a, b in dev + test}
    assert not {tuple(sorted(factors(t))) for t in fmt + mix} & held  # no held-out product, in either order
    # the sets and the RL prompts use disjoint slices of the training pairs
    assert [factors(t) for t in fmt + mix] == train[:4400] and make_traces.RL_OFFSET >= 4400


def test_every_traced_tool_call_parses_to_the_prompts_factors():
    from lightning_rlpt.rollout.episodes.parsing import HermesToolParser, ToolCall

    parser = HermesToolParser()
    for t in make_traces.make(**make_traces.FORMAT)[:500] + make_traces.make(**make_traces.MIX):
        if len(t["messages"]) != 4:
            continue
        a, b = factors(t)
        parsed = parser.parse(t["messages"][1]["content"])
        assert parsed.errors == [] and parsed.calls == [ToolCall("multiply", {"a": a, "b": b})]
        assert t["messages"][2] == {"role": "tool", "content": str(a * b)}


def test_template_supports_tools_and_renders_the_traces_token_for_token():
    tok = task.build_tokenizer()
    trace = make_traces.trace(123, 456, True)["messages"]
    text = tok.apply_chat_template(trace, tools=SCHEMAS, tokenize=False)
    assert text == ('<|im_start|>system\n<tools>multiply</tools><|im_end|><|im_start|>user\n123*456=<|im_end|>'
                    '<|im_start|>assistant\n<tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 456}}'
                    '</tool_call><|im_end|><|im_start|>tool\n<tool_response>56088</tool_response><|im_end|>'
                    '<|im_start|>assistant\n56088<|im_end|>')
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and len(ids) == 133  # 147 characters and markers, less 2 per factor and 3 per product spelled
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens.count("123") == 2 and tokens.count("456") == 2  # each factor is one token, in prompt and call
    assert tok.convert_ids_to_tokens(tok("56088 1000500 7", add_special_tokens=False)["input_ids"]) == \
        ["560", "88", " ", "100", "050", "0", " ", "7"]  # chunks of three from the left, as Llama 3 splits numbers
    assert ids.count(task.EOS_ID) == 5 and "<tool_call>" in tok.decode(ids, skip_special_tokens=True)
    # structured tool_calls (TRL / OpenAI style) render as the same text the model writes
    structured = {"role": "assistant", "content": "",
                  "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 123, "b": 456}}}]}
    assert (tok.apply_chat_template([trace[0], structured], tools=SCHEMAS, tokenize=False)
            == tok.apply_chat_template(trace[:2], tools=SCHEMAS, tokenize=False))
    without = tok.apply_chat_template(trace[:1], add_generation_prompt=True, tokenize=False)
    assert without == "<|im_start|>user\n123*456=<|im_end|><|im_start|>assistant\n"


def test_sft_labels_score_only_the_assistant_turns():
    tok = task.build_tokenizer()
    ids, labels = warm_start.encode(tok, make_traces.trace(123, 456, True)["messages"])
    assert ids == tok(tok.apply_chat_template(make_traces.trace(123, 456, True)["messages"], tools=SCHEMAS,
                                              tokenize=False), add_special_tokens=False)["input_ids"]
    scored = [t for t, y in zip(ids, labels) if y != -100]
    assert scored == [y for y in labels if y != -100]  # labels equal the ids where scored
    expected = task.tool_call_text(123, 456) + "<|im_end|>" + "56088<|im_end|>"
    assert tok.decode(scored) == expected


def test_reward_reads_the_last_assistant_turn_of_messages_or_text():
    episode = [{"role": "assistant", "content": task.tool_call_text(2, 3)}, {"role": "tool", "content": "6"},
               {"role": "assistant", "content": "6"}]
    text = task.tool_call_text(2, 3) + "tool\n<tool_response>6</tool_response>assistant\n6"
    assert task.exact_answer(None, [episode, text, "6", "66", episode[:2]], ["6"] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [task.called_tool(c) for c in (episode, text, "6")] == [True, True, False]


def test_template_passes_the_libraries_tools_check():
    from lightning_rlpt.rollout.episodes import template
    template.check_tools_template(task.build_tokenizer(), SCHEMAS)  # raises when tools= or tool messages are ignored


def test_evaluation_runs_the_tool_on_calls_and_refuses_bad_ones():
    assert evaluate.run_tool(task.tool_call_text(12, 34)) == "408"
    assert evaluate.run_tool('<tool_call>{"name": "multiply", "arguments": {"a": "1", "b": 2}}</tool_call>') \
        == "error: call multiply with integer arguments a and b"
    assert evaluate.run_tool('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>') \
        == "error: call multiply with integer arguments a and b"
    assert evaluate.run_tool("<tool_call>{oops</tool_call>") == "error: malformed tool call"


@pytest.fixture(scope="module")
def fresh_model_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("calculator"))
    task.build_model(seed=0).save_pretrained(path)
    task.build_tokenizer().save_pretrained(path)
    return path


@pytest.mark.slow
def test_no_tool_arm_runs_end_to_end(fresh_model_dir, tmp_path):
    import run_calculator as run  # examples/tool_calculator/run_calculator.py

    results = run.main(["--model", fresh_model_dir, "--arms", "no_tools", "--steps", "2", "--prompts", "2",
                        "--group-size", "2", "--max-new-tokens", "8", "--eval-n", "4", "--out", str(tmp_path)])
    r = results["no_tools"]
    assert r["calls_before"] == r["calls_after"] == 0.0  # without tools= nothing is ever executed
    with open(r["metrics"]) as f:
        assert len([line for line in f if line.strip()]) >= 3  # header + one row per step
    assert os.path.getsize(tmp_path / "comparison.png") > 5_000


@pytest.mark.slow
def test_tool_arm_runs_end_to_end_with_episode_metrics(fresh_model_dir, tmp_path):
    """RLModule(tools=[multiply]) on the example's tokenizer: the template passes the start check, episodes
    run, and tools/call_frequency is logged every step (a fresh model rarely calls, so only its range is known)."""
    import csv

    import run_calculator as run  # examples/tool_calculator/run_calculator.py

    results = run.main(["--model", fresh_model_dir, "--arms", "tools", "--steps", "2", "--prompts", "2",
                        "--group-size", "2", "--max-new-tokens", "8", "--eval-n", "4", "--out", str(tmp_path)])
    with open(results["tools"]["metrics"]) as f:
        freq = [float(r["tools/call_frequency"]) for r in csv.DictReader(f) if r.get("tools/call_frequency")]
    assert len(freq) == 2 and all(0.0 <= x <= 1.0 for x in freq)
    assert os.path.getsize(tmp_path / "comparison.png") > 5_000


def test_shipped_warm_start_calls_the_tool_with_the_prompts_factors():
    """The warm start (calculator_sft.py) greedily calls the tool on every dev product and copies the
    factors on about three quarters of them (the mix phase costs some copying; RL has that to win back),
    read from the episode text (a regression anchor
    for the tokenizer: loaded with the Qwen2 tokenizer class instead, the digits split and this fails)."""
    import re

    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(os.path.join(CALCULATOR, "warm_start"))
    tok = task.build_tokenizer()
    dev = task.split_pairs()[1][:40]
    episodes = evaluate.greedy_episodes(model, tok, task.rows(dev))
    args = [re.search(r'"a": (\d+), "b": (\d+)', e) for e in episodes]
    assert all(args), "every greedy episode starts with a tool call"
    copied = sum((int(m.group(1)), int(m.group(2))) == pair for m, pair in zip(args, dev))
    assert copied >= 26, f"{copied}/40 calls carry the prompt's factors"  # 29 here; a split tokenizer: 0
