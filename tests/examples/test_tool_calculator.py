"""The tool-calculator example: its traces, tokenizer and chat template, its reward, the warm
start's labels, and a short run of both arms end to end."""
import json
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


def shipped_traces() -> list[dict]:
    with open(os.path.join(CALCULATOR, "traces.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_shipped_traces_are_what_make_traces_writes_and_mix_tool_calls_with_direct_answers():
    traces = shipped_traces()
    assert traces == make_traces.make()
    with_tool = [t for t in traces if len(t["messages"]) == 4]
    assert 0.3 < len(with_tool) / len(traces) < 0.7
    for t in traces:
        a, b = map(int, t["messages"][0]["content"].rstrip("=").split("*"))
        assert t["messages"][-1] == {"role": "assistant", "content": str(a * b)}
    _, dev, test = task.split_pairs()
    held = {(min(a, b), max(a, b)) for a, b in dev + test}
    asked = {tuple(sorted(map(int, t["messages"][0]["content"].rstrip("=").split("*")))) for t in traces}
    assert not asked & held  # no held-out product (in either order) is in the traces


def test_every_traced_tool_call_parses_to_the_prompts_factors():
    from lightning_rlpt.rollout.episodes.parsing import HermesToolParser, ToolCall

    parser = HermesToolParser()
    for t in shipped_traces():
        if len(t["messages"]) != 4:
            continue
        a, b = map(int, t["messages"][0]["content"].rstrip("=").split("*"))
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
    assert tok.decode(ids) == text and len(ids) == 147  # one token per character or marker
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
