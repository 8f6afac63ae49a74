"""Every output of a run directory besides its training state, in a form two runs compare by:
each rollout file under ``rollouts/`` (training steps and ``val/``) and each TensorBoard entry
(scalar point, text, tensor) of every event file, duplicates kept. Wall-clock measurements
(``timing/*``, throughput) are left out: they differ between any two runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

# tags and columns that measure wall-clock time
UNTIMED = ("timing/", "train/tokens_per_sec")


def rollout_frames(run_dir: Path) -> dict[str, pd.DataFrame]:
    """Every parquet under ``run_dir/rollouts``, by its path relative to it."""
    root = Path(run_dir) / "rollouts"
    frames = {}
    for path in sorted(root.rglob("*.parquet")):
        frame = pd.read_parquet(path)
        frames[path.relative_to(root).as_posix()] = frame[
            [c for c in frame.columns if not c.startswith(UNTIMED)]
        ]
    return frames


def event_entries(run_dir: Path, sub: str = "tensorboard") -> list[tuple[str, int, str]]:
    """(tag, step, value) of every summary value in every event file of ``run_dir/sub``, sorted,
    duplicates kept: a point written twice shows twice. Scalars as their float's repr, texts and
    other tensors as their content."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    entries = []
    for path in sorted((Path(run_dir) / sub).glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if not value.tag.startswith(UNTIMED):
                    entries.append((value.tag, int(event.step), _content(value)))
    return sorted(entries)


def _content(value) -> str:
    # EventFileLoader turns legacy simple values into tensors; a scalar's is one float
    tensor = value.tensor
    if tensor.string_val:
        return " | ".join(s.decode("utf-8", "replace") for s in tensor.string_val)
    if tensor.float_val:
        return repr([float(v) for v in tensor.float_val])
    if tensor.double_val:
        return repr([float(v) for v in tensor.double_val])
    if value.HasField("simple_value"):
        return repr(float(value.simple_value))
    return tensor.tensor_content.hex()


def assert_same_outputs(expected: Path, got: Path, subs: tuple[str, ...] = ("tensorboard",)) -> None:
    """The same rollout files with the same frames, and the same TensorBoard entries (each once)."""
    a, b = rollout_frames(expected), rollout_frames(got)
    assert list(a) == list(b), (
        f"rollout files differ: only expected {set(a) - set(b)}, only got {set(b) - set(a)}"
    )
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=True, obj=name)
    for sub in subs:
        ea, eb = event_entries(expected, sub), event_entries(got, sub)
        only_a = _minus(ea, eb)
        only_b = _minus(eb, ea)
        assert not only_a and not only_b, f"{sub}: only expected {only_a[:6]}, only got {only_b[:6]}"


def _minus(a: list, b: list) -> list:
    """Multiset difference: what ``a`` holds more often than ``b``."""
    rest = list(b)
    out = []
    for item in a:
        if item in rest:
            rest.remove(item)
        else:
            out.append(item)
    return out
