"""The conformance matrix: every engine samples from the policy the trainer holds, for every
architecture in `architectures.ARCHITECTURES` and every sync mode, at step 0 and after one update
(mean |Δ log p| ≤ 1e-3 in fp32; measured ~1e-6), or the cell is refused by name at construction.

One colocated vLLM engine and one ``vllm serve`` process per architecture serve all its cells.
The table users read (docs/support.md, README) is rendered from ``benchmarks/results/zoo_matrix.json``
(`make zoo` writes it); `test_the_committed_matrix_has_every_cell` keeps it complete and its
statuses equal to what the suite measures.
"""
from __future__ import annotations

import pytest

from architectures import ARCHITECTURES, BY_NAME
from conformance import ENGINES, RESULTS, SYNCS, TOLERANCE, Cell, committed, make_module, record, run_cell
from lightning_rlpt.callbacks import VLLMRollout, VLLMServerRollout
from lightning_rlpt.rollout.vllm.engine import VLLMEngine
from lightning_rlpt.rollout.vllm.server import VLLMServer

pytestmark = pytest.mark.slow
SERVE = dict(max_model_len=64, kv_cache_memory_bytes=64 << 20, startup_timeout=240,
             extra_args=["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"],
             env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})


@pytest.fixture(scope="module", params=[a.name for a in ARCHITECTURES])
def arch(request, tmp_path_factory):
    """(name, saved model directory); the engines below are started once per architecture."""
    name = request.param
    return name, BY_NAME[name].save(str(tmp_path_factory.mktemp(name.replace(".", "_"))))


@pytest.fixture(scope="module")
def colocated(arch):
    engine = VLLMEngine.from_module(make_module(arch[1], "full"), max_model_len=16)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(arch, tmp_path_factory):
    with VLLMServer.launch(arch[1], log_dir=str(tmp_path_factory.mktemp("logs")), **SERVE) as started:
        yield started


def callbacks_for(engine: str, request) -> list:
    if engine == "hf":
        return []
    if engine == "vllm":
        return [VLLMRollout(engine=request.getfixturevalue("colocated"))]
    return [VLLMServerRollout(urls=[request.getfixturevalue("server").url])]


def refused(cell: Cell, path: str, reason: str, rows) -> None:
    """A layout the engine cannot serve: its callback refuses it at setup, before any engine starts."""
    callback = VLLMRollout() if cell.engine == "vllm" else VLLMServerRollout(launch=dict(num_servers=1))
    with pytest.raises(ValueError, match=reason) as err:
        run_cell(cell, make_module(path, cell.sync), [callback], rows)
    cell.status = f"refused: {str(err.value).split(':')[0]}"
    record(cell)
    if not RESULTS:
        assert committed()[cell.key]["status"] == cell.status, f"{cell.key}: the committed matrix differs: run `make zoo`"


@pytest.mark.parametrize("sync", list(SYNCS))
@pytest.mark.parametrize("engine", ENGINES)
def test_engine_samples_from_the_trainers_policy(arch, engine, sync, request, arithmetic_rows):
    name, path = arch
    cell = Cell(name, engine, sync)
    reason = BY_NAME[name].refused.get(engine)
    if reason:
        return refused(cell, path, reason, arithmetic_rows)
    run_cell(cell, make_module(path, sync), callbacks_for(engine, request), arithmetic_rows)
    record(cell)
    assert [g["step"] for g in cell.gaps] == [0, 1]
    for gap in cell.gaps:
        assert gap["mean"] <= TOLERANCE, f"{cell.key} step {gap['step']}: mean |Δ log p| {gap['mean']:.3g}"
    if not RESULTS:  # collecting for `make zoo`: the committed matrix is being rewritten
        expected = committed().get(cell.key, {}).get("status")
        assert expected == "ok", f"{cell.key} passes here but the committed matrix says {expected!r}: run `make zoo`"


def test_the_committed_matrix_has_every_cell():
    cells = committed()
    expected = {f"{a.name}/{e}/{s}" for a in ARCHITECTURES for e in ENGINES for s in SYNCS}
    assert set(cells) == expected, "benchmarks/results/zoo_matrix.json is stale: run `make zoo`"
