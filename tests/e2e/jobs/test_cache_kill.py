"""The cache survives a kill at every write: a child process builds the cache (synthetic parquet,
its harmony copy, the tiny model + tokenizer, a warm-start save) and is SIGKILLed at the N-th write
event, for every N; a fresh process then builds the same cache and every artefact must load.

Write events are the library writers (parquet, safetensors, the tokenizer's JSON) - killed with the
file they just wrote cut to half its bytes, as a kill mid-write leaves it - plus every Python open
for writing and every rename under the cache (killed before they happen). Children are forked
from the test process, so each build costs no interpreter start-up; the kill is a real SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

SYNTH = dict(n_train=12, n_test=4, seed=0, p_search=0.35, p_calculate=0.35, p_answer=0.3, data_source="rlla")


def _spec():
    from src.models.tiny import TinyModelSpec

    return TinyModelSpec(vocab_size=400, hidden_size=32, intermediate_size=64, corpus_rows=40)


def _build(cache: Path) -> dict[str, list[str] | Path]:
    """Everything a run caches, built the way a run builds it."""
    from src.datamodules.prepare import resolve_files
    from src.jobs.sft import _cached, _save_atomically
    from src.models.loading import load_causal_lm, load_tokenizer
    from src.models.tiny import ensure_tiny_model

    train, val = resolve_files("synthetic", None, None, "harmony", SYNTH, str(cache))
    tiny = ensure_tiny_model(cache, _spec())
    warm = cache / "warm_start" / "sft-test"
    if not _cached(warm):
        _save_atomically(load_causal_lm(tiny), load_tokenizer(tiny), warm)
    return {"data": train + val, "tiny": tiny, "warm": warm}


def _check(built) -> None:
    import pandas as pd

    from src.models.loading import load_causal_lm, load_tokenizer

    for f in built["data"]:
        assert len(pd.read_parquet(f)) > 0, f
    for d in (built["tiny"], built["warm"]):
        load_tokenizer(d)
        load_causal_lm(d)


class _KillAt:
    """Counts write events under ``root``; SIGKILLs this process at event ``n`` (0 = never)."""

    def __init__(self, root: Path, n: int):
        self.root, self.n, self.count = str(root), n, 0

    def event(self, written: str | None = None) -> None:
        self.count += 1
        if self.count != self.n:
            return
        if written and os.path.isfile(written):  # a kill mid-write leaves a cut file
            os.truncate(written, os.path.getsize(written) // 2)
        os.kill(os.getpid(), signal.SIGKILL)

    def audit(self, name: str, args) -> None:
        if name == "open" and isinstance(args[0], (str, os.PathLike)):
            mode, flags = args[1], args[2]
            writing = (
                ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
                if mode
                else bool(flags & (os.O_WRONLY | os.O_RDWR))
            )
            if writing and os.fspath(args[0]).startswith(self.root):
                self.event()
        elif name == "os.rename" and os.fspath(args[1]).startswith(self.root):
            self.event()

    def install(self) -> None:
        import pyarrow.parquet as pq
        import transformers.modeling_utils as mu
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        def wrap(real, path_of):
            def call(*a, **k):
                out = real(*a, **k)
                where = path_of(a, k, out)
                self.event(os.fspath(where) if isinstance(where, (str, os.PathLike)) else None)
                return out

            return call

        pq.write_table = wrap(pq.write_table, lambda a, k, out: a[1] if len(a) > 1 else k["where"])
        mu.safe_save_file = wrap(mu.safe_save_file, lambda a, k, out: a[1])
        TokenizersBackend._save_pretrained = wrap(
            TokenizersBackend._save_pretrained, lambda a, k, out: out[-1]
        )
        sys.addaudithook(self.audit)


def _in_child(cache: Path, kill_at: int, count_file: Path | None = None) -> int:
    """Fork; the child builds (killed at event ``kill_at``) and checks; returns the wait status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            killer = _KillAt(cache, kill_at)
            killer.install()
            built = _build(cache)
            if count_file is not None:
                count_file.write_text(str(killer.count))
            _check(built)
            code = 0
        except BaseException:  # noqa: BLE001 - the parent only sees the exit code
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def _preload() -> None:
    """Import what a build uses before forking, so each child starts warm (no threads are started)."""
    import pyarrow.parquet  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM  # noqa: F401

    import src.datamodules.gpt_oss  # noqa: F401
    import src.datamodules.prepare  # noqa: F401
    import src.datamodules.synthetic  # noqa: F401
    import src.jobs.sft  # noqa: F401
    import src.models.loading  # noqa: F401


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_kill_at_every_cache_write_then_rebuild(tmp_path):
    _preload()

    count_file = tmp_path / "count"
    status = _in_child(tmp_path / "probe", 0, count_file)
    assert os.waitstatus_to_exitcode(status) == 0
    n_events = int(count_file.read_text())
    assert n_events >= 10, n_events  # parquet x3, safetensors x2, tokenizer files, renames
    for n in range(1, n_events + 1):
        cache = tmp_path / f"kill{n}"
        killed = _in_child(cache, n)
        assert os.WIFSIGNALED(killed) and os.WTERMSIG(killed) == signal.SIGKILL, (n, killed)
        rebuilt = _in_child(cache, 0)
        assert os.waitstatus_to_exitcode(rebuilt) == 0, f"the run after a kill at write {n} failed"


def test_broken_cached_parquet_and_model_are_rebuilt(tmp_path):
    """A cache left broken by an older, non-atomic version is rebuilt, not fatal for every later run."""
    from src.datamodules.prepare import resolve_files

    train, val = resolve_files("synthetic", None, None, "xml", SYNTH, str(tmp_path))
    Path(val[0]).write_bytes(b"")
    tiny = __import__("src.models.tiny", fromlist=["x"]).ensure_tiny_model(tmp_path, _spec())
    (tiny / "config.json").write_text("{not json")
    built = _build(tmp_path)
    _check(built)
