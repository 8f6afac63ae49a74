"""An SFT fit stopped by SIGINT / SIGTERM continues where it stopped, not from scratch.

On the signal the running step finishes and the whole training state (weights, optimizer, LR
schedule, loop counters, RNG) is saved atomically to ``<out_dir>.interrupted.ckpt`` beside where
the finished model would go (the run's ``model`` for ``experiment=sft``, the cache entry for a
warm start, whose name is its config's digest: the same command finds it again). The next run of
the same command resumes from it, and deletes it once the finished model is saved.

The data order is part of the state: :class:`EndlessShuffle` draws epoch ``e``'s permutation from
``seed`` and ``e`` alone, so the batch at any step is known without replaying the steps before it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import Sampler

log = logging.getLogger(__name__)


class EndlessShuffle(Sampler[int]):
    """Indices of a ``size``-row dataset, one fresh permutation per epoch, epochs back to back,
    starting at position ``start`` of that stream. Epoch ``e``'s permutation is drawn from
    ``seed`` and ``e`` only, so a resumed fit (``start`` = steps done × batch size) sees the
    batches an uninterrupted one would. No ``__len__``: the fit ends at ``max_steps``."""

    def __init__(self, size: int, seed: int, start: int = 0):
        if size <= 0:
            raise ValueError(f"EndlessShuffle: size={size}; need at least one row")
        self.size, self.seed, self.start = size, int(seed), int(start)

    def permutation(self, epoch: int) -> list[int]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        epoch, offset = divmod(self.start, self.size)
        while True:
            yield from self.permutation(epoch)[offset:]
            epoch, offset = epoch + 1, 0


def interrupted_path(out_dir: Path) -> Path:
    """Where an interrupted fit that would save to ``out_dir`` keeps its resumable state."""
    return out_dir.with_name(f"{out_dir.name}.interrupted.ckpt")


def resumable_step(ckpt: Path) -> int | None:
    """Steps done by the interrupted fit saved at ``ckpt``; None when there is none. A file that
    cannot be read (damaged by hand: saves are atomic) is named, removed, and the fit starts over."""
    for partial in ckpt.parent.glob(f".{ckpt.name}.*.tmp"):  # a save cut short by a kill
        partial.unlink(missing_ok=True)
    if not ckpt.exists():
        return None
    try:
        state = torch.load(ckpt, map_location="cpu", mmap=True, weights_only=False)
        return int(state["global_step"])
    except Exception as err:  # noqa: BLE001 - any unreadable file: train from scratch, say so
        log.warning(
            "interrupted SFT checkpoint %s is not readable (%s: %s); training from step 0",
            ckpt,
            type(err).__name__,
            str(err)[:200],
        )
        ckpt.unlink(missing_ok=True)
        return None
