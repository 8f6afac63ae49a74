"""Exact resume: a run interrupted by SIGKILL / SIGINT / SIGTERM and resumed with the README's
command ends bit-identical to an uninterrupted one (weights, optimizer and scheduler states, λ,
callback states, data position), and its TensorBoard scalars and rollout rows match step for
step, with no gap, shift or duplicate (read by ``src.analysis.load_scalars`` and by a plain
``EventAccumulator``). The signal comes from the run itself (``faults.SignalAtStep``,
configured by Hydra) at a known point, so the comparison is deterministic.

The fast tests below them cover the pieces: the mid-epoch sampler, the log truncation, the
clean-up of interrupted writes, the start-up checks.
"""

from __future__ import annotations

import signal
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from faults import fault_overrides
from jobhelpers import run_train

from src.analysis import load_scalars
from src.callbacks.checkpointing import ManifestWriter, Preempted, StopOnSignal
from src.callbacks.run_logs import (
    remove_interrupted_writes,
    truncate_event_file,
    truncate_rollouts,
    truncate_tensorboard,
)
from src.datamodules.position import DataPosition, EpochSeededSampler
from src.jobs.resume import ResumePoint, check_callback_states, cut_logs_back, prepare_run_dir

SMALL = [
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
    "router.lambda_init=1.0",
    "router.lambda_lr=5.0",  # λ moves every step, so a wrong resume shows in it
    "router.budget=0.01",
    "trainer.max_steps=4",
]
# wall-clock measurements differ between any two runs; everything else must not
UNTIMED = ("timing/", "train/tokens_per_sec")


def _run(run_dir: Path, *overrides: str, expect: int = 0, base: list[str] = SMALL) -> str:
    """A run stopped by the fault injector has its own process; the others in this one."""
    proc = run_train(*base, f"run_dir={run_dir}", *overrides, timeout=900, expect=expect)
    return proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "uninterrupted"
    _run(run_dir, "trainer.save_freq=2")
    return run_dir


# ---------------------------------------------------------------------------- comparisons
def _assert_same(a, b, where: str) -> None:
    """Recursive bit-identity of checkpoint contents (tensors compared with torch.equal)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: max |diff| {(a.double() - b.double()).abs().max()}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {set(a) ^ set(b)}"
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _final_state(run_dir: Path) -> dict:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    # checkpoint callbacks' states hold their own paths and settings (save_freq), not training state
    ckpt["callbacks"] = {k: v for k, v in ckpt["callbacks"].items() if "Checkpoint" not in k}
    ckpt.pop("step_scalars", None)  # includes wall-clock timings
    ckpt.pop("loops", None)  # Lightning's bookkeeping; its training-relevant part is compared below
    return ckpt


def _assert_same_training_state(expected: Path, got: Path, steps: int = 4, router: bool = True) -> dict:
    """Bit-identical final checkpoints; returns the expected one's rollout pipeline state."""
    a, b = _final_state(expected), _final_state(got)
    assert a["global_step"] == b["global_step"] == steps
    datamodules = {k for k in a if k.endswith("DataModule")}  # the curriculum's ticket module has none
    assert datamodules == {k for k in b if k.endswith("DataModule")}
    keys = ("state_dict", "optimizer_states", "lr_schedulers", "callbacks", "rollout_pipeline", "epoch")
    for key in (*keys, *datamodules):
        _assert_same(a[key], b[key], key)
    if router:
        assert float(a["state_dict"]["lagrange.lam"]) != 1.0  # λ moved: the comparison is not vacuous
    return a["rollout_pipeline"]


def _scalars_without_timings(run_dir: Path) -> pd.DataFrame:
    wide = load_scalars(run_dir)
    return wide[[c for c in wide.columns if not c.startswith(UNTIMED)]]


def _event_steps(run_dir: Path) -> dict[str, list[int]]:
    """Steps per tag as plain TensorBoard reads the whole directory (duplicates kept)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {
        tag: [e.step for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
        if not tag.startswith(UNTIMED)
    }


def _assert_same_logs(expected: Path, got: Path, steps: int = 4) -> None:
    a, b = _scalars_without_timings(expected), _scalars_without_timings(got)
    assert list(a.index) == list(b.index) == list(range(steps))
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    steps_a, steps_b = _event_steps(expected), _event_steps(got)
    assert steps_a == steps_b  # no duplicate or shifted point in any tag
    assert all(steps == sorted(set(steps)) for steps in steps_b.values())
    files_a = sorted(p.name for p in (expected / "rollouts").glob("*.parquet"))
    files_b = sorted(p.name for p in (got / "rollouts").glob("*.parquet"))
    assert files_a == files_b == [f"step_{i:08d}.parquet" for i in range(steps)]
    for name in files_a:
        pd.testing.assert_frame_equal(
            pd.read_parquet(expected / "rollouts" / name), pd.read_parquet(got / "rollouts" / name)
        )


# ---------------------------------------------------------------------------- end to end
def test_sigkill_between_checkpoints_resumes_exactly(uninterrupted, tmp_path):
    """Killed after step 3 with a checkpoint at step 2: step 3 was logged (scalars, rollouts) by
    the killed run and is run again; its points appear once, with the resumed run's values."""
    run_dir = tmp_path / "run"
    _run(run_dir, "trainer.save_freq=2", *fault_overrides(3, "SIGKILL", "batch_end"), expect=-signal.SIGKILL)
    assert (run_dir / "rollouts" / "step_00000002.parquet").exists()  # the lost step had logged
    _run(run_dir, "trainer.save_freq=2", "resume=true")
    _assert_same_training_state(uninterrupted, run_dir)
    _assert_same_logs(uninterrupted, run_dir)


@pytest.mark.slow
def test_sigint_saves_at_the_step_boundary_and_resumes_exactly(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    _run(
        run_dir, "trainer.save_freq=2", *fault_overrides(1, "SIGINT", "batch_end"), expect=128 + signal.SIGINT
    )
    saved = torch.load(run_dir / "checkpoints" / "interrupted.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == 1  # the step that was running, not one more
    _run(run_dir, "trainer.save_freq=2", "resume=true")
    _assert_same_training_state(uninterrupted, run_dir)
    _assert_same_logs(uninterrupted, run_dir)


@pytest.mark.slow
def test_sigterm_mid_step_exits_143_and_resumes_exactly(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    _run(
        run_dir,
        "trainer.save_freq=1",
        *fault_overrides(2, "SIGTERM", "batch_start"),
        expect=128 + signal.SIGTERM,
    )
    assert not (run_dir / "checkpoints" / "interrupted.ckpt").exists()  # the periodic save was reused
    _run(run_dir, "trainer.save_freq=1", "resume=true")
    _assert_same_training_state(uninterrupted, run_dir)
    _assert_same_logs(uninterrupted, run_dir)


# ---------------------------------------------------------------------------- curriculum and replay
# Curriculum: lessons evaluated at steps 0, 2 and 4. "hard" unlocks once "easy" has any eval reward
# and "easy" graduates on its second evaluation (a plateau window of 2 that always plateaus), so
# by the checkpoint at step 3 the active set and the reward histories have moved.
CURRICULUM = [
    "experiment=curriculum",
    "sft.max_steps=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
    "curriculum.lessons.hard.sampling.max_new_tokens=16",
    "curriculum.eval_frequency=2",
    "curriculum.eval_prompts=2",
    "curriculum.lessons.hard.dependencies.0.reward_threshold=-100",
    "curriculum.lessons.easy.plateau_window=2",
    "curriculum.lessons.easy.plateau_threshold=1000",
    "trainer.max_steps=6",
    "trainer.save_freq=3",
]
REPLAY = [
    "experiment=grpo",
    "replay.capacity=64",
    "algorithm.old_log_prob_source=rollout",
    "replay.max_samples_per_rollout=2",
    "replay.max_batch_latency=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
    "trainer.max_steps=4",
    "trainer.save_freq=2",
]


def _pipeline_state(path: Path) -> dict:
    """The rollout pipeline's state (prompt source, buffer) a checkpoint holds."""
    return torch.load(path, map_location="cpu", weights_only=False)["rollout_pipeline"]


@pytest.fixture(scope="module")
def uninterrupted_curriculum(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "curriculum"
    _run(run_dir, base=CURRICULUM)
    return run_dir


@pytest.fixture(scope="module")
def uninterrupted_replay(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "replay"
    _run(run_dir, base=REPLAY)
    return run_dir


def _kill_and_resume_curriculum(
    uninterrupted_curriculum: Path, run_dir: Path, sig: str, at: str, expect: int
):
    """Killed after the step-4 evaluation (resumed from step 3, after the step-2 one)."""
    _run(run_dir, *fault_overrides(5 if at == "batch_end" else 4, sig, at), base=CURRICULUM, expect=expect)
    _run(run_dir, "resume=true", base=CURRICULUM)
    states = _assert_same_training_state(uninterrupted_curriculum, run_dir, steps=6, router=False)
    _assert_same_logs(uninterrupted_curriculum, run_dir, steps=6)
    final = states["source"]
    assert final["status"] == {"easy": "graduated", "hard": "active"} and final["evaluated_at"] == 4
    assert [len(final["history"][k]) for k in ("easy", "hard")] == [2, 2]


@pytest.mark.slow  # three training processes: ~100 s
def test_sigkill_mid_curriculum_resumes_exactly(uninterrupted_curriculum, tmp_path):
    run_dir = tmp_path / "run"
    _kill_and_resume_curriculum(uninterrupted_curriculum, run_dir, "SIGKILL", "batch_end", -signal.SIGKILL)
    # the resume started from a moved curriculum: easy graduated, hard active, both measured
    start = _pipeline_state(run_dir / "checkpoints" / "step_00000003.ckpt")["source"]
    assert start["status"] == {"easy": "graduated", "hard": "active"} and start["evaluated_at"] == 2


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "at"), [("SIGINT", "batch_end"), ("SIGTERM", "batch_start")])
def test_sigint_sigterm_mid_curriculum_resume_exactly(uninterrupted_curriculum, tmp_path, sig, at):
    _kill_and_resume_curriculum(
        uninterrupted_curriculum, tmp_path / "run", sig, at, 128 + getattr(signal, sig)
    )


def _kill_and_resume_replay(uninterrupted_replay: Path, run_dir: Path, sig: str, at: str, expect: int):
    _run(run_dir, *fault_overrides(3 if at == "batch_end" else 2, sig, at), base=REPLAY, expect=expect)
    _run(run_dir, "resume=true", base=REPLAY)
    states = _assert_same_training_state(uninterrupted_replay, run_dir, steps=4, router=False)
    _assert_same_logs(uninterrupted_replay, run_dir, steps=4)
    assert states["buffer"]["buffer"]["groups"]  # not vacuous


@pytest.mark.slow  # three training processes: ~100 s
def test_sigkill_with_a_full_replay_buffer_resumes_exactly(uninterrupted_replay, tmp_path):
    run_dir = tmp_path / "run"
    _kill_and_resume_replay(uninterrupted_replay, run_dir, "SIGKILL", "batch_end", -signal.SIGKILL)
    start = _pipeline_state(run_dir / "checkpoints" / "step_00000002.ckpt")["buffer"]
    assert start["buffer"]["groups"]  # the resume started with groups in the buffer


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "at"), [("SIGINT", "batch_end"), ("SIGTERM", "batch_start")])
def test_sigint_sigterm_with_a_replay_buffer_resume_exactly(uninterrupted_replay, tmp_path, sig, at):
    _kill_and_resume_replay(uninterrupted_replay, tmp_path / "run", sig, at, 128 + getattr(signal, sig))


# ---------------------------------------------------------------------------- pieces
def test_sampler_resumes_mid_epoch_and_only_in_that_epoch():
    full = EpochSeededSampler(10, seed=3)
    full.set_epoch(2)
    order = list(full)
    resumed = EpochSeededSampler(10, seed=3)
    resumed.set_epoch(2)
    resumed.resume_at(2, 4)
    assert list(resumed) == order[4:] and list(resumed) == order[4:]  # iterable twice
    assert len(resumed) == 10  # Lightning counts the epoch's batches from the restored counter
    resumed.set_epoch(3)
    full.set_epoch(3)
    assert list(resumed) == list(full)
    with pytest.raises(ValueError, match="outside"):
        resumed.resume_at(3, 11)


def test_data_position_state_names_what_is_missing():
    assert DataPosition.from_state_dict({"seed": 1, "epoch": 2, "position": 6}, "X") == DataPosition(1, 2, 6)
    assert DataPosition.from_state_dict({"seed": 1, "epoch": 2}, "X").position == 0  # older checkpoints
    with pytest.raises(KeyError, match="X.*epoch"):
        DataPosition.from_state_dict({"seed": 1}, "X")


def _write_events(folder: Path, steps: list[int]) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for s in steps:
        writer.add_scalar("train/x", float(s) * 0.5, s)
        writer.add_scalar("train/y", float(s), s)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def test_truncate_event_file_keeps_earlier_steps_and_drops_a_torn_tail(tmp_path):
    path = _write_events(tmp_path / "tb", [0, 1, 2, 3, 4])
    assert truncate_event_file(path, keep_below=3) == 4
    assert truncate_event_file(path, keep_below=3) == 0  # idempotent: the file is left alone
    wide = load_scalars(tmp_path, "tb")
    assert list(wide.index) == [0, 1, 2] and list(wide["train/x"]) == [0.0, 0.5, 1.0]
    with open(path, "ab") as f:  # a record cut short by SIGKILL
        f.write(b"\x30\x00\x00\x00\x00\x00\x00\x00\x01\x02")
    truncate_tensorboard(path.parent, keep_below=10)
    assert list(load_scalars(tmp_path, "tb").index) == [0, 1, 2]
    assert path.stat().st_size > 0 and not list(path.parent.glob("*.tmp"))


def test_truncate_event_file_keeps_the_validation_at_the_resume_step(tmp_path):
    """The validation after the checkpointed step ran from the checkpoint's weights and is not run
    again: its points stay, the step's training points go (they are logged again)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "tb"))
    for s in range(5):
        writer.add_scalar("train/x", float(s), s)
        if s % 2:
            writer.add_scalar("val/y", float(s), s)
    writer.close()
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    assert truncate_event_file(path, keep_below=3) == 2  # train/x at 3 and 4; val/y at 3 stays
    wide = load_scalars(tmp_path, "tb")
    assert wide["train/x"].dropna().index.tolist() == [0, 1, 2]
    assert wide["val/y"].dropna().index.tolist() == [1, 3]


def test_truncate_rollouts_and_remove_interrupted_writes(tmp_path):
    rollouts, ckpts = tmp_path / "rollouts", tmp_path / "checkpoints"
    rollouts.mkdir()
    ckpts.mkdir()
    for s in range(4):
        (rollouts / f"step_{s:08d}.parquet").write_bytes(b"x")
    (rollouts / "step_00000004.parquet.tmp").write_bytes(b"x")
    (ckpts / ".step_00000004.ckpt.abc123.tmp").write_bytes(b"x")
    (ckpts / "manifest.yaml.tmp").write_bytes(b"x")
    (ckpts / "step_00000002.ckpt").write_bytes(b"x")
    assert len(remove_interrupted_writes(tmp_path)) == 3
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000002.ckpt"]
    # validations (rollouts/val/, named by the step they followed): the one after step 1, which the
    # checkpoint of global step 2 was saved just before (same weights), stays
    (rollouts / "val").mkdir()
    for s in (0, 1, 2):
        for kind in ("rollouts", "routes"):
            (rollouts / "val" / f"{kind}_{s:08d}.parquet").write_bytes(b"x")
    (rollouts / "val" / ".routes_00000004.parquet.tmp").write_bytes(b"x")
    (rollouts / "val" / "rollouts_00000004.parquet.tmp").write_bytes(b"x")
    assert len(remove_interrupted_writes(tmp_path)) == 2
    assert truncate_rollouts(rollouts, keep_below=2) == 2 + 2
    assert sorted(p.name for p in rollouts.iterdir()) == [
        "step_00000000.parquet",
        "step_00000001.parquet",
        "val",
    ]
    assert sorted(p.name for p in (rollouts / "val").iterdir()) == [
        "rollouts_00000000.parquet",
        "rollouts_00000001.parquet",
        "routes_00000000.parquet",
        "routes_00000001.parquet",
    ]


def test_fresh_run_refuses_a_used_run_dir_and_resume_without_checkpoint_starts_over(tmp_path):
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "step_00000000.parquet").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="resume=true"):
        prepare_run_dir(tmp_path, resume=False)
    point = prepare_run_dir(tmp_path, resume=True)  # killed before its first checkpoint
    assert point == ResumePoint(None, 0, 0) and list((tmp_path / "rollouts").iterdir())  # not cut yet
    cut_logs_back(tmp_path, point)  # once the resume is accepted
    assert not list((tmp_path / "rollouts").iterdir())


def test_missing_callback_state_is_an_error_naming_it():
    trainer = SimpleNamespace(callbacks=[], checkpoint_callbacks=[])
    point = ResumePoint(Path("x.ckpt"), 3, 2, ("Curriculum{'lessons': 3}",))
    with pytest.raises(ValueError, match="Curriculum"):
        check_callback_states(point, trainer)


def test_preempted_exit_codes():
    assert Preempted(signal.SIGTERM).code == 143 and Preempted(signal.SIGINT).code == 130
    assert isinstance(Preempted(15), SystemExit)
    cb = StopOnSignal("the run", "/nonexistent/interrupted.ckpt", ManifestWriter("/nonexistent", {}, "cmd"))
    assert cb.stopped_by is None
