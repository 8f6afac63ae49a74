# The README's two commands: `make train` (set up + main job) and `make test` (set up + tests).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: setup train test test-all

setup: $(VENV)/.installed

# torch is installed first and pinned: on CPU machines that resolves to the local CPU wheel, so
# nothing ever pulls the multi-GB CUDA wheels.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

train: setup
	$(PY) scripts/train.py experiment=router_grpo $(ARGS)

test: setup
	$(PY) -m pytest -q $(ARGS)

test-all: setup
	$(PY) -m pytest -q -m "" $(ARGS)
