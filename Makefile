# Set-up-and-go targets for a fresh machine: `make demo` and `make test` create .venv, install what they need
# (torch==2.13.0 resolves to the local CPU wheel), and run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Plugin distributions that live in this repository (installed editable for tests and simulation). The test-only
# plugins (tests/plugins/xccl-testplugins, examples/plugin-template) are not installed: conftest.py makes them
# visible to the test run alone, so .venv (which `make demo` uses too) lists the real plugins only.
PLUGINS := $(wildcard plugins/*/pyproject.toml)
# Two pytest workers, each taking whole files (--dist loadfile: a file's module-scoped rank pools and runs are made
# once, in one worker). One worker kept about 1.2 of 2 cores busy (CPU time / wall time of a clean run): tests wait
# on rendezvous, provoked timeouts and sleeping ranks. docs/performance.md, "The test suite's wall time".
PYTEST_ARGS ?= -m "not slow and not gpu and not frameworks" --durations=30 -n 2 --dist loadfile
# Two tiers. `make test` runs the first, in at most 10 minutes on 2 cores; `make test-more` (CI runs it after
# `make test`) runs the second: the tests marked `slow` (long-running, or breadth that a first-tier test covers:
# more vendors, more world sizes, the docs' multi-rank blocks, the benchmarks' smoke runs, multi-host faults), then
# the frameworks. docs/performance.md, "The test suite's wall time".
SLOW_ARGS ?= -m "slow and not gpu and not frameworks" --durations=30 -n 2 --dist loadfile
TESTS := tests $(wildcard plugins/*/tests) $(wildcard examples/plugin-template/tests)
# Every rank a test spawns imports xccl; without bytecode (PYTHONDONTWRITEBYTECODE set, as on some machines) each
# recompiles its ~100 modules, 0.3-1 s of CPU per process. The caches go to the gitignored __pycache__ folders.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest

# The compatibility tier on another torch xccl supports (2.7 to 2.14): `make test-torch TORCH=2.8.0` installs that
# torch's standard wheel (a CUDA build, about 6 GB; it runs on the CPU) with xccl and its plugins into
# .venv-torch-<version>, then runs what users run first (the demo, the Sophgo example on 4 ranks, the Ascend example
# compiled into a graph on 2 ranks) and the tests marked `compat`. `make venv-torch TORCH=...` installs only (CI
# does that for every version while the first tier runs).
TORCH ?= 2.8.0
TVENV := .venv-torch-$(TORCH)
TPY   := $(TVENV)/bin/python
COMPAT_ARGS ?= -m "compat and not gpu and not frameworks" --durations=15 -n 2 --dist loadfile

.PHONY: demo test test-more test-slow test-frameworks test-torch venv-torch bench lint clean

$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.test: $(VENV)/.core $(PLUGINS)
	$(PIP) install --quiet -e ".[test]" $(foreach p,$(dir $(PLUGINS)),-e $(p))
	$(PIP) uninstall --quiet --yes xccl-testplugins xccl-template 2>/dev/null || true
	$(PIP) install --quiet --no-build-isolation "deepspeed==0.19.8"
	touch $@

## Run the demo: a tensor-parallel MLP trained on 2 local CPU ranks through xccl.
demo: $(VENV)/.core
	$(VENV)/bin/xccl demo

## Run the tests (core, plugins in simulation, conformance): the first tier, without the slow and GPU-only ones.
test: $(VENV)/.test
	$(PYTEST) $(PYTEST_ARGS) $(TESTS)

## The second tier, which .ci/run runs after `make test`: the slow tests, then the frameworks.
test-more: test-slow test-frameworks

## The tests marked slow (GPU-only ones excepted).
test-slow: $(VENV)/.test
	$(PYTEST) $(SLOW_ARGS) $(TESTS)

$(VENV)/.frameworks: $(VENV)/.test
	$(PIP) install --quiet -e ".[frameworks]"
	touch $@

## The training frameworks on xccl (Lightning, Ray Train, DeepSpeed, Accelerate, torchtitan; tests/frameworks):
## cpu and simulated Sophgo and Ascend. Installs the `frameworks` extra first. Part of `make test-more`.
test-frameworks: $(VENV)/.frameworks
	$(PYTEST) -m frameworks --durations=15 tests/frameworks tests/test_benchmarks.py

$(TVENV)/.torch:
	$(PYTHON) -m venv $(TVENV)
	$(TPY) -m pip install --quiet --no-cache-dir "torch==$(TORCH)"
	touch $@

$(TVENV)/.test: $(TVENV)/.torch pyproject.toml $(PLUGINS)
	$(TPY) -m pip install --quiet -e ".[test]" $(foreach p,$(dir $(PLUGINS)),-e $(p))
	$(TPY) -m pip uninstall --quiet --yes xccl-testplugins xccl-template 2>/dev/null || true
	touch $@

## Install torch $(TORCH) into its own venv (no xccl yet: safe beside a running `make test`).
venv-torch: $(TVENV)/.torch

## The compatibility tier on torch $(TORCH): the demo, both examples, the tests marked `compat`.
test-torch: $(TVENV)/.test
	$(TVENV)/bin/xccl demo
	XCCL_SIMULATE=sophgo $(TVENV)/bin/torchrun --standalone --nproc-per-node 4 examples/sophgo_all_reduce.py
	XCCL_SIMULATE=ascend $(TVENV)/bin/torchrun --standalone --nproc-per-node 2 examples/ascend_all_reduce_single_group.py
	env -u PYTHONDONTWRITEBYTECODE $(TPY) -m pytest $(COMPAT_ARGS) $(TESTS)

## Lint (also run by the tests): ruff over the tree, mypy --strict over the package, the import-layer contract.
lint: $(VENV)/.test
	$(PY) -m ruff check xccl xccl_cli.py plugins examples tests benchmarks scripts
	$(PY) -m mypy xccl
	$(VENV)/bin/lint-imports

## Benchmarks (not part of the tests): print tables and write JSON under benchmarks/results/.
bench: $(VENV)/.test
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) .venv-torch-* build *.egg-info .pytest_cache benchmarks/results
