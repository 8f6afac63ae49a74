# The README's two commands: `make train` (set up + main job) and `make test` (set up + tests).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: setup sandbox-tool train test test-all

setup: $(VENV)/.installed sandbox-tool

# Agent commands run under bubblewrap (src/envs/sandbox.py). Installed only when missing; where
# apt-get cannot run, the sandbox falls back to util-linux `unshare` and says so at start-up if
# neither works.
sandbox-tool:
	@command -v bwrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq bubblewrap) \
		|| echo "make setup: could not install bubblewrap; the sandbox will try util-linux unshare"

# torch is installed first, pinned to the release whose CPU wheel the dev/CI machines resolve, so
# CPU machines never pull the multi-GB CUDA wheels (the package itself only asks for torch>=2.4).
# A venv that already has torch (e.g. a CUDA build on a GPU machine) keeps it: make setup VENV=...
TORCH ?= torch==2.13.0
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,async,deepspeed]"
	touch $@

train: setup
	$(PY) scripts/train.py experiment=router_grpo $(ARGS)

test: setup
	$(PY) -m pytest -q $(ARGS)

test-all: setup
	$(PY) -m pytest -q -m "" $(ARGS)
