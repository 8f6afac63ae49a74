"""An SFT fit stopped by a real SIGTERM / SIGINT saves its whole training state and the same
command resumes it: ``experiment=sft`` ends with the weights of an uninterrupted run (bit-equal at
the default ``trainer.threads``), and the SFT warm start of an RL job continues from the step it
stopped at instead of training again."""

from __future__ import annotations

import signal

import pytest
import torch
from jobhelpers import CACHE, run_train
from runoutputs import event_entries
from safetensors.torch import load_file
from test_exit_codes import _Job, fresh_sft_lr

STEPS = 60
SFT = [f"sft.max_steps={STEPS}", "sft.log_every=1", "sft.batch_size=2", "sft.lr_decay=true"]


def _weights(model_dir) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no weights in {model_dir}"
    return out


def test_experiment_sft_resumes_to_the_uninterrupted_weights(tmp_path):
    run_dir = tmp_path / "cut"
    job = _Job("experiment=sft", *SFT, f"run_dir={run_dir}")
    job.wait_for("SFT step 8/", timeout=240)
    assert job.signal(signal.SIGTERM) == 143, job.out[-4000:]
    saved = run_dir / "model.interrupted.ckpt"
    assert saved.is_file() and not (run_dir / "model").exists(), job.out[-3000:]
    stopped_at = torch.load(saved, map_location="cpu", weights_only=False)["global_step"]
    assert 8 <= stopped_at < STEPS and f"after step {stopped_at} of {STEPS}: saved {saved}" in job.out

    resumed = run_train("experiment=sft", *SFT, f"run_dir={run_dir}")
    assert f"resuming SFT from {saved} at step {stopped_at} of {STEPS}" in resumed.stdout + resumed.stderr
    assert not saved.exists()  # the finished model replaces it

    run_train("experiment=sft", *SFT, f"run_dir={tmp_path / 'whole'}")
    cut, whole = _weights(run_dir / "model"), _weights(tmp_path / "whole" / "model")
    assert cut.keys() == whole.keys()
    differ = [k for k in cut if not torch.equal(cut[k], whole[k])]
    assert not differ, f"{len(differ)} tensors differ from the uninterrupted run, e.g. {differ[:3]}"
    # and its TensorBoard: every point once, none the uninterrupted run lacks (the stop's own)
    whole_points = event_entries(tmp_path / "whole", "tensorboard_sft")
    assert event_entries(run_dir, "tensorboard_sft") == whole_points and len(whole_points) >= 2 * STEPS


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["sigint", "sigterm"]
)
def test_warm_start_resumes_where_it_stopped(tmp_path, signum, code):
    sft = [*SFT, "sft.max_steps=200", fresh_sft_lr()]  # trained here, not found in the cache
    cmd = ("experiment=router_grpo", *sft, "trainer.max_steps=1")
    job = _Job(*cmd, f"run_dir={tmp_path / 'a'}")
    job.wait_for("SFT step 4/", timeout=300)
    assert job.signal(signum) == code, job.out[-4000:]
    saved = [p for p in (CACHE / "warm_start").glob("sft-*.interrupted.ckpt") if str(p) in job.out]
    assert len(saved) == 1, job.out[-3000:]
    step = torch.load(saved[0], map_location="cpu", weights_only=False)["global_step"]

    done = run_train(*cmd, f"run_dir={tmp_path / 'b'}")
    assert f"resuming SFT from {saved[0]} at step {step} of 200" in done.stdout + done.stderr
    assert (
        not saved[0].exists() and saved[0].with_name(saved[0].name.removesuffix(".interrupted.ckpt")).is_dir()
    )


def test_data_order_resumes_mid_stream_and_each_epoch_is_a_permutation():
    from src.jobs.sft_resume import EndlessShuffle

    stream = iter(EndlessShuffle(5, seed=3))
    whole = [next(stream) for _ in range(17)]
    for start in (0, 4, 5, 7, 13):
        resumed = iter(EndlessShuffle(5, seed=3, start=start))
        assert [next(resumed) for _ in range(17 - start)] == whole[start:]
    assert all(sorted(whole[e * 5 : e * 5 + 5]) == list(range(5)) for e in range(3))
    assert whole[:5] != whole[5:10] or whole[5:10] != whole[10:15]  # not one order repeated
    other = iter(EndlessShuffle(5, seed=4))
    assert [next(other) for _ in range(17)] != whole


def test_unreadable_or_partial_interrupted_state_trains_from_scratch(tmp_path):
    from src.jobs.sft_resume import interrupted_path, resumable_step

    saved = interrupted_path(tmp_path / "model")
    assert saved == tmp_path / "model.interrupted.ckpt"
    (tmp_path / f".{saved.name}.x1y2.tmp").write_bytes(b"cut short")  # a save killed midway
    assert resumable_step(saved) is None and not list(tmp_path.iterdir())
    saved.write_bytes(b"not a checkpoint")
    assert resumable_step(saved) is None and not saved.exists()
    torch.save({"global_step": 7}, saved)
    assert resumable_step(saved) == 7
