"""Every code reference in the docs resolves: a path in backticks names a file or folder of the
repository, and a dotted name (``lightning_rlpt.hooks.call_hook``, ``collect.rollout``,
``RLModule.refill``, ``module.knobs.kl_coef``) names something the code defines. Docs that name
helpers which do not exist send readers (and callback authors) looking for them."""
import glob
import importlib
import inspect
import os
import re

import pytest
from conftest import ROOT

import lightning_rlpt
import lightning_rlpt.callbacks as rl_callbacks

DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
TOP = {"lightning_rlpt", "callbacks", "kernels", "examples", "benchmarks", "tests", "docs"}
PACKAGE_DIRS = {d for d in os.listdir(os.path.join(ROOT, "lightning_rlpt"))
                if os.path.isdir(os.path.join(ROOT, "lightning_rlpt", d)) and not d.startswith("_")}
# Instance names the docs use for the surface callbacks touch, and the class each stands for.
INSTANCES = {"module": "RLModule", "knobs": "Knobs", "requests": "Requests", "experience": "Experience",
             "exp": "Experience", "minibatch": "Experience", "engine": "RolloutEngine"}
# Words that name a project module and, in the docs, also a Hugging Face model or a LightningCLI
# config section (`model.generate`, `model.lr`, `data.val_data`): checked only as module paths.
CONFIG_WORDS = {"model", "data"}
# Files a doc's worked example asks the reader to create (docs/objectives.md's new loss).
EXAMPLE_FILES = {"lightning_rlpt/algorithms/losses/capped_reinforce.py", "tests/algorithms/test_capped_reinforce.py"}
FILE_SUFFIXES = (".md", ".json", ".jsonl", ".csv", ".png", ".yaml", ".toml", ".ckpt", ".safetensors", ".txt")
SKIP_DIRS = {".git", ".venv", "runs", "__pycache__", "build"}


def repo_files() -> list[str]:
    out = []
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info")]
        rel = os.path.relpath(d, ROOT)
        out += [os.path.normpath(os.path.join(rel, f)) for f in files] + [os.path.normpath(os.path.join(rel, x)) + "/"
                                                                           for x in dirs]
    return out


FILES = repo_files()


def references(path: str) -> list[str]:
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks are examples, not references
    return sorted(set(re.findall(r"`([A-Za-z_][\w./]*)`", text)))


def path_ref(token: str) -> bool:
    """A file path (``rollout/hf.py``) or a project folder (``rollout/vllm/``); metric names
    (``timing/rollout``, ``ess/``) are neither."""
    if "..." in token or "." in token.split("/")[0] and not token.endswith(".py"):
        return False
    if token.endswith(".py"):
        return True
    return token.endswith("/") and token.split("/")[0] in TOP | PACKAGE_DIRS and token.count("/") >= 1 and (
        token.split("/")[0] in TOP or "/" in token[:-1] or token[:-1] in PACKAGE_DIRS)


def path_resolves(token: str) -> bool:
    token = os.path.normpath(token) + ("/" if token.endswith("/") else "")
    return any(f == token or f.endswith("/" + token) for f in FILES) or importable_file(token)


def importable_file(token: str) -> bool:
    """A path inside an installed dependency (``vllm/entrypoints/...py``)."""
    head = token.split("/")[0]
    spec = importlib.util.find_spec(head) if head.isidentifier() and head not in TOP | PACKAGE_DIRS else None
    return bool(spec and spec.submodule_search_locations and
                os.path.exists(os.path.join(os.path.dirname(list(spec.submodule_search_locations)[0]), token)))


def project_modules() -> dict[str, list[str]]:
    """``{last component: [dotted module names]}`` of every project module."""
    out: dict[str, list[str]] = {}
    for package, folder in {"lightning_rlpt": "lightning_rlpt", "lightning_rlpt.callbacks": "callbacks",
                            "lightning_rlpt.kernels": "kernels"}.items():
        for f in glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True):
            rel = os.path.relpath(f, os.path.join(ROOT, folder))[:-3].replace(os.sep, ".").removesuffix(".__init__")
            name = package if rel == "__init__" else f"{package}.{rel}"
            out.setdefault(name.split(".")[-1], []).append(name)
    for sub in PACKAGE_DIRS:  # `algorithms.kl`, `rollout.episodes.Agent`
        out.setdefault(sub, []).append(f"lightning_rlpt.{sub}")
    return out


MODULES = project_modules()


def public_class(name: str):
    for space in (lightning_rlpt, rl_callbacks):
        obj = getattr(space, name, None)
        if inspect.isclass(obj):
            return obj
    for dotted in (m for names in MODULES.values() for m in names):
        obj = getattr(importlib.import_module(dotted), name, None)
        if inspect.isclass(obj) and obj.__module__.startswith("lightning_rlpt"):
            return obj
    return None


def has_attribute(cls, attr: str) -> bool:
    """A class attribute, a dataclass field, or one its (project) classes assign as ``self.attr``."""
    if hasattr(cls, attr) or attr in getattr(cls, "__dataclass_fields__", {}):
        return True
    sources = [inspect.getsource(k) for k in cls.__mro__ if k.__module__.startswith("lightning_rlpt")]
    return any(re.search(rf"self\.{attr}\s*(:[^=]*)?=", s) for s in sources)


def resolve_chain(obj, rest: list[str]) -> bool:
    for i, attr in enumerate(rest):
        if inspect.isclass(obj) and not hasattr(obj, attr):
            if not has_attribute(obj, attr):
                return False
            obj = public_class(INSTANCES[attr]) if attr in INSTANCES else None
            if obj is None:
                return True  # an instance attribute of unknown type: its own name resolved
            continue
        if not hasattr(obj, attr):
            if inspect.ismodule(obj):
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{attr}")
                    continue
                except ImportError:
                    return False
            return False
        obj = getattr(obj, attr)
    return True


def dotted_status(token: str) -> bool | None:
    """True/False when ``token`` names project code (resolves or not); None when it is not ours."""
    if token.endswith(FILE_SUFFIXES) or "/" in token:
        return None
    head, *rest = token.split(".")
    candidates = [lightning_rlpt] if head == "lightning_rlpt" else [importlib.import_module(m) for m in MODULES.get(head, [])]
    if head in INSTANCES:
        candidates.append(public_class(INSTANCES[head]))
    if not candidates:
        cls = public_class(head) if head[:1].isupper() else None
        return None if cls is None else resolve_chain(cls, rest)
    found = any(resolve_chain(c, rest) for c in candidates)
    return None if not found and head in CONFIG_WORDS else found


def broken(path: str) -> list[str]:
    bad = []
    for token in references(path):
        if path_ref(token):
            if not path_resolves(token) and token not in EXAMPLE_FILES:
                bad.append(token)
        elif "." in token and dotted_status(token) is False:
            bad.append(token)
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=[os.path.relpath(d, ROOT) for d in DOCS])
def test_every_code_reference_resolves(doc):
    assert broken(doc) == [], f"{os.path.relpath(doc, ROOT)} names code that does not exist"


def test_the_checker_catches_what_it_should(tmp_path):
    """The resolver itself: wrong helpers, paths and attributes are caught; metric names and
    third-party names are left alone."""
    doc = tmp_path / "doc.md"
    doc.write_text("`_common.global_mean` `callbacks/_common.py` `collect.rollout` `lightning_rlpt/logprobs.py` "
                   "`RLModule.refill` `RLModule.no_such` `module.knobs.kl_coef` `module.knobs.beta` "
                   "`module.rollout_engine` `timing/rollout` `torch.no_such` `rollout/vllm/` `rollout/nowhere/` "
                   "`lightning_rlpt.hooks.call_hook` `lightning_rlpt.hooks.nope` `algorithms.kl` `Experience.info` "
                   "`model.lr` `model.weights.policy_weights` `engine.generate` `engine.last_sync` `engine.no_such`\n"
                   "```python\n`_common.global_sum`\n```\n")
    assert broken(str(doc)) == sorted(["_common.global_mean", "lightning_rlpt/logprobs.py", "RLModule.no_such",
                                       "module.knobs.beta", "rollout/nowhere/", "lightning_rlpt.hooks.nope",
                                       "engine.no_such"])
