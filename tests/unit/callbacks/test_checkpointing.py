"""Finding the checkpoint to resume from when the manifest beside the checkpoints is broken."""

from __future__ import annotations

import logging
import os

import pytest

from src.callbacks.checkpointing import latest_checkpoint


@pytest.mark.parametrize("broken", ["latest_checkpoint: [unclosed\n", "- a list, not a mapping\n", "\x00\xff"])
def test_a_broken_manifest_is_named_and_the_newest_checkpoint_used(tmp_path, caplog, broken):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for i, name in enumerate(["step_00000004.ckpt", "step_00000002.ckpt"]):
        path = ckpts / name
        path.write_bytes(b"x")
        os.utime(path, (1000 + 10 * (1 - i), 1000 + 10 * (1 - i)))  # step 4 is the newest
    (ckpts / "manifest.yaml").write_text(broken)
    with caplog.at_level(logging.WARNING, logger="src.callbacks.checkpointing"):
        assert latest_checkpoint(ckpts) == ckpts / "step_00000004.ckpt"
    assert str(ckpts / "manifest.yaml") in caplog.text


def test_an_intact_manifest_names_the_checkpoint(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for name in ("step_00000002.ckpt", "step_00000004.ckpt"):
        (ckpts / name).write_bytes(b"x")
    (ckpts / "manifest.yaml").write_text("latest_checkpoint: checkpoints/step_00000002.ckpt\n")
    assert latest_checkpoint(ckpts) == ckpts / "step_00000002.ckpt"
