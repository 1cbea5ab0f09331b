# The README's first two commands: `make run` and `make test`. Both create the virtual
# environment on first use, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench validate trace-check clean fuzz kill-check

# pip prints its progress (no -q): the first `make run` installs Ray, Optuna and pandas for a few minutes
$(BIN)/python:
	@echo "== creating the virtual environment $(VENV) (first run only)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --progress-bar on --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "== installing comet and its dependencies into $(VENV) (first run: a few minutes, progress below)"
	$(BIN)/python -m pip install --progress-bar on -e '.[test]'
	@echo "== compiling the replay kernels into numba's cache (first install only, about a minute)"
	$(BIN)/python -m comet.replay.precompile
	touch $(STAMP)
	@echo "== installed: $$($(BIN)/comet --version)"

run: $(STAMP)
	$(BIN)/comet search search_spaces/gpt3_1t.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m pytest -m bench -s -p no:cacheprovider benchmarks

# Robustness checks, not part of `make test` (minutes each): a freshly generated corpus of ~1,000
# malformed inputs of every kind run through the CLI, and kill -9 at 50% of a search then a resume.
fuzz: $(STAMP)
	$(BIN)/python tests/fuzz/corpus.py --per-kind 120

kill-check: $(STAMP)
	$(BIN)/python tests/robust/kill9_check.py

validate: $(STAMP)
	$(BIN)/comet validate

# Real A -> B evidence (not part of `make test`): comet grounded in the recorded CPU trace of configuration A
# predicts the measured step time of configuration B (comet/trace/ab_check.py, docs/traces.md).
trace-check: $(STAMP)
	@$(BIN)/python -m comet.trace.ab_check

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
