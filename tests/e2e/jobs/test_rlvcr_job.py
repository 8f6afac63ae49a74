"""End to end: `python scripts/train.py experiment=rlvcr` runs two RL steps on multi-step episodes, from
a step-format warm start built here on first use and cached. The warm start is smaller than the
experiment's (32 scripted episodes and 250 SFT steps instead of 96 and 800: the whole test ~65 s
from a cold cache instead of ~120 s on 2 CPUs); it still writes well-formed steps at all four
levels (seen: level fractions 0.45 / 0.33 / 0.33 / 0.11, none unparsed), which is what the checks
below need."""

from __future__ import annotations

import math
from pathlib import Path

from jobhelpers import run_train


def scalars(run_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(run_dir.rglob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file under {run_dir}"
    out: dict[str, list[float]] = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return out


def test_rlvcr_experiment_runs_two_steps(tmp_path):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=rlvcr",
        "trainer.max_steps=2",
        "sft.episodes=32",
        "sft.max_steps=250",
        f"run_dir={run_dir}",
    )

    s = scalars(run_dir)
    for k in range(1, 5):
        assert len(s.get(f"rlvcr/level_frac_{k}", [])) == 2, sorted(s)
    # the step-format warm start (model.warm_start: rlvcr_sft) writes steps that parse, at several levels
    fracs = {k: max(s[f"rlvcr/level_frac_{k}"]) for k in range(1, 5)}
    assert sum(f > 0 for f in fracs.values()) >= 2, fracs
    assert max(s["rlvcr/unparsed_frac"]) < 0.5 and min(s["rlvcr/malformed_step_frac"]) < 0.5, s
    # the thinking-advantage path ran: some steps qualified and were scored (well-formed ones only:
    # the experiment sets rlvcr_score_malformed_steps false)
    assert max(s["rlvcr/qualifying_steps"]) > 0
    assert max(s["rlvcr/alt_thinking_tokens"]) > 0
    for tag in ("rlvcr/thinking_adv_mean", "train/pg_loss", "train/reward_task_mean"):
        assert all(math.isfinite(v) for v in s[tag]), (tag, s[tag])
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
