"""``jobhelpers.run_command`` runs a script as ``__main__`` in the test's process: it must report what
a new interpreter would (exit code, stdout, stderr, a traceback) and put back what the script changed."""

import logging
import os
import signal
import sys

import torch
from jobhelpers import run_command

SCRIPT = """
import logging, os, signal, sys, torch
os.chdir("/")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
logging.getLogger().addHandler(logging.StreamHandler(sys.stderr))
logging.getLogger().setLevel(logging.DEBUG)
torch.set_num_threads(torch.get_num_threads() + 1)
print("args", sys.argv[1:])
logging.getLogger("x").warning("to stderr")
sys.exit(int(sys.argv[1]))
"""


def _process_state() -> tuple:
    root = logging.getLogger()
    return (
        signal.getsignal(signal.SIGTERM),
        list(root.handlers),
        root.level,
        torch.get_num_threads(),
        sys.argv,
        os.getcwd(),
    )


def test_exit_code_output_and_the_process_state_put_back(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    before = _process_state()
    proc = run_command([sys.executable, str(script), "3", "b"])
    assert proc.returncode == 3
    assert proc.stdout == "args ['3', 'b']\n" and "to stderr" in proc.stderr
    assert _process_state() == before


def test_an_uncaught_exception_is_exit_1_with_its_traceback(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("raise RuntimeError('boom')\n")
    proc = run_command([sys.executable, str(script)])
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "RuntimeError: boom" in proc.stderr
