"""Warm starts for the episode tests: tiny Llamas that replay scripted conversations under
greedy decoding, trained once and kept in pytest's cache (they are a function of the scripts)."""
from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agent_task as at  # noqa: E402


def cached_model(request, name: str, conversations):
    key = hashlib.sha256(json.dumps([at.TEMPLATE, conversations], sort_keys=True).encode()).hexdigest()[:12]
    path = str(request.config.cache.mkdir(f"episodes-{name}-{key}"))
    if not os.path.exists(os.path.join(path, "config.json")):
        at.memorise(conversations).save_pretrained(path)
        at.build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tok():
    return at.build_tokenizer()


@pytest.fixture(scope="session")
def env_model_dir(request) -> str:
    """Replays `agent_task.ENV_SCRIPT` (three turns against `CountdownEnv`)."""
    return cached_model(request, "env", [(at.ENV_SCRIPT, None)])
