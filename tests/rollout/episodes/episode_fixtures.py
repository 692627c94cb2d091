"""Fixtures of the episode tests (imported by each test module: a conftest.py here would shadow
tests/conftest.py for `from conftest import ...`). Warm starts: tiny Llamas that replay scripted conversations under
greedy decoding, trained once per test session (no state kept between runs: a changed script or
training recipe can never meet a stale model)."""
from __future__ import annotations

import pytest

import agent_task as at


def cached_model(tmp_path_factory, name: str, conversations):
    path = str(tmp_path_factory.mktemp(f"episodes-{name}"))
    at.memorise(conversations).save_pretrained(path)
    at.build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tok():
    return at.build_tokenizer()


@pytest.fixture(scope="session")
def env_model_dir(tmp_path_factory) -> str:
    """Replays `agent_task.ENV_SCRIPT` (three turns against `CountdownEnv`)."""
    return cached_model(tmp_path_factory, "env", [(at.ENV_SCRIPT, None)])



TOOL_ROWS = [  # (question, turns): each turn (the model's text, the tool results answering it)
    ("What is 6*7?", [(at.call("multiply", a=6, b=7), ["42"]), ("42", [])]),
    ("What is 2+2?", [("4", [])]),
    ("What is 1/2?", [(at.call("divide", a=1, b=2), ["error: unknown tool 'divide'; the tools are ['multiply']"]),
                      ("0.5", [])]),
]


@pytest.fixture(scope="session")
def tool_script():
    """`scripted_model.lay_out` of `TOOL_ROWS` with the tool `agent_task.multiply`:
    ``(tokenizer, prompts, script, expected episodes)``."""
    from episodes_fixtures import build_chat_tokenizer
    from lightning_rlpt.rollout.episodes import ToolBox
    from scripted_model import lay_out

    tok = build_chat_tokenizer()
    return (tok, *lay_out(tok, ToolBox([at.multiply]).schemas, TOOL_ROWS))


@pytest.fixture(scope="session")
def tool_model_dir(tmp_path_factory, tool_script) -> str:
    """A saved `scripted_model.scripted_gpt2` (1024 positions) whose greedy episodes are
    `tool_script`'s: it calls ``multiply(6, 7)``, answers ``42`` after the result; answers
    ``4`` without a call; calls an unknown tool ``divide``, answers ``0.5`` after the error."""
    from scripted_model import scripted_gpt2

    tok, _, script, _ = tool_script
    path = str(tmp_path_factory.mktemp("episodes-tool-model"))
    scripted_gpt2(script, len(tok), tok.eos_token_id, positions=1024).save_pretrained(path)
    tok.save_pretrained(path)
    return path
