"""Helpers for tests that run scripts/train.py: the real entry point, in this process or in its own."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "toolrouter"
TESTS = Path(__file__).resolve().parent
# the environment of the training processes the tests start: tests/ on the path, for the fault
# injector (``+callbacks.fault._target_=faults.SignalAtStep``)
TRAIN_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
}
# the short router_grpo run the session fixture trains (tiny SFT warm start)
ROUTER_RUN_OVERRIDES = [
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
    "router.lambda_lr=5.0",
    "trainer.save_freq=2",
    "trainer.val_check_interval=2",  # validation and the route confusion text every 2 steps
    "data.synthetic.n_calib=64",  # the budget's threshold calibrated apart from the held-out split
]


def train_cmd(*overrides: str) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "train.py"), f"cache_dir={CACHE}", *overrides]


# overrides whose command starts processes or devices of its own, or signals its own process (the
# fault injector): such a command runs in a new interpreter
_OWN_PROCESS = ("trainer.devices=", "trainer.strategy=", "trainer.accelerator=", "rollout=vllm", "+callbacks.fault.")


def run_train(
    *overrides: str, timeout: int = 600, own_process: bool = False, expect: int = 0
) -> subprocess.CompletedProcess:
    """``scripts/train.py cache_dir=<tests' cache> *overrides``, asserted to exit ``expect``.

    Runs in this process (``runpy`` of the script as ``__main__`` with its argv: the same preflight,
    Hydra run directory, logging and exit codes; its output captured) unless ``own_process`` or an
    override asks for ranks, devices, an engine or a signal of its own: a run then costs its own
    seconds, not the ~10 s a new interpreter spends importing torch, Lightning and transformers. A
    run the fault injector stops (``faults.fault_overrides``) always has its own process: its
    resume, in this one, is the README's command as a user runs it."""
    proc = run_train_unchecked(*overrides, timeout=timeout, own_process=own_process)
    assert proc.returncode == expect, (
        f"exit {proc.returncode}, expected {expect}:\n" + proc.stdout[-3000:] + proc.stderr[-6000:]
    )
    return proc


def run_train_unchecked(*overrides: str, timeout: int = 600, own_process: bool = False) -> subprocess.CompletedProcess:
    """``run_train`` without the exit code's check: in this process or its own, as ``run_train`` says."""
    own_process = own_process or any(o.startswith(_OWN_PROCESS) for o in overrides)
    return run_command(train_cmd(*overrides), timeout=timeout, own_process=own_process)


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    """``scripts/<script> *args`` in this process (as ``run_train``), asserted to exit 0."""
    proc = run_command([sys.executable, str(REPO / "scripts" / script), *args])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return proc


def run_command(cmd: list[str], timeout: int = 600, own_process: bool = False) -> subprocess.CompletedProcess:
    """``[python, script, *args]``: in a new interpreter (``own_process``; ``timeout`` applies) or
    run as ``__main__`` in this one, from the repo root as the subprocess is; what a script changes
    process-wide there (argv, the working directory, signal handlers, the root logger, warning
    filters, torch's thread count) is put back."""
    if own_process:
        return subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=TRAIN_ENV, check=False
        )
    import torch

    out, err, code = io.StringIO(), io.StringIO(), 0
    root, argv, threads, cwd = logging.getLogger(), sys.argv, torch.get_num_threads(), os.getcwd()
    handlers, level = list(root.handlers), root.level
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.argv = cmd[1:]
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            runpy.run_path(cmd[1], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except Exception:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, exit 1
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.argv = argv
        os.chdir(cwd)
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(cmd, code, out.getvalue(), err.getvalue())


def scalars(run_dir: Path, sub: str = "tensorboard") -> dict[str, list[tuple[int, float]]]:
    """All scalar series of a run's TensorBoard event files: tag -> [(step, value)] by step."""
    from src.analysis import load_scalars

    wide = load_scalars(run_dir, sub)
    return {tag: [(int(step), float(v)) for step, v in wide[tag].dropna().items()] for tag in wide.columns}
