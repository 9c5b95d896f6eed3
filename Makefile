# The README's first two commands: `make generate` and `make test`. Each
# bootstraps .venv by itself (torch 2.13.0: the CPU wheel already on disk here).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: generate docs test test-gpu bench check clean-cache

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

generate: $(STAMP)
	$(PY) -m codegen generate
	$(PY) -m codegen docs

# docs/spec-reference.md from the spec models (tests/test_docs.py keeps it current)
docs: $(STAMP)
	$(PY) -m codegen docs

test: $(STAMP)
	$(PY) -m pytest -q

# on a machine with a GPU (the lent H200: scripts/gpu_run.sh sets it up)
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

# on the GPU: ours vs the unfused chain (eager, torch.compile) vs the streaming
# floor, for MiniMax-M3 pre_attn and DeepSeek-V4.1 attn_front; BENCH_ARGS passes
# bench.run's options (e.g. BENCH_ARGS="--kernels deepseek --places 9": ours over 9
# workspace places, 5 by default);
# `python -m bench.run --dry-run` checks the harness on the CPU
BENCH_ARGS ?=
bench: $(STAMP)
	$(PY) -m bench.run $(BENCH_ARGS)

check: $(STAMP)
	$(PY) -m codegen check specs/*/*.yaml
