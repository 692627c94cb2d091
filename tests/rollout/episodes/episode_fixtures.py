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

