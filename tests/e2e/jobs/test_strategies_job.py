"""The router job under each multi-process strategy on CPU (2 real processes, gloo): DDP, FSDP2,
DeepSpeed ZeRO-2 and ZeRO-3 run the same experiment as one process.

- step 1's prompts, routes, tokens and all-rank reward equal the one-process run's (the seeded
  sampler shards one global order; every row draws from its own stream, keyed by the step, its
  prompt and its copy; the logged scalars are reduced over the ranks);
- λ follows the controller on the mean cost of both ranks' rollouts together;
- killed by SIGKILL at step 2 and resumed (``latest_checkpoint`` finds the sharded checkpoint
  directories), each strategy ends with the weights of an uninterrupted DDP run (within 1e-5)
  after 3 steps with a real gradient, and with the same rollouts at every step (ZeRO-2: run whole
  in the default tier, killed and resumed in the slow one; DDP: killed and resumed in the slow tier only);
- the sharded ones (FSDP2, ZeRO-3) validate after every step with the router head's Polyak average,
  read as plain tensors, through the kill and the resume.

Every run shares its setup with the others (one one-process run, one uninterrupted DDP run, one
killed + resumed run per strategy): the multi-process runs are the slowest part of the test tier.

The kill comes from the run itself (``faults.SignalAtStep``) on every rank at the
same point. One thread per process: the float results then depend on nothing but the strategy.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch
from checkpoint_weights import checkpoint_kind, consolidated_state_dict
from faults import fault_overrides
from jobhelpers import REPO, TRAIN_ENV, scalars, train_cmd

from src.callbacks.checkpointing import latest_checkpoint
from src.rollout.metrics import route_accuracy

BASE = [
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=4",  # over all ranks: 2 each
    "sampling.max_new_tokens=12",
    # the tiny actor's rewards rarely differ inside a group: the entropy bonus gives every actor
    # weight a real gradient at every step
    "algorithm.entropy_coeff=0.01",
    "algorithm.optim.lr=1e-3",
    "router.lambda_init=1.0",
    "router.lambda_lr=1.0",
    "router.budget=0.2",
    "trainer.max_steps=3",
    "trainer.save_freq=1",
]
TWO = ["trainer.devices=2"]
VALIDATE_EVERY_STEP = ["trainer.val_check_interval=1", "trainer.limit_val_batches=1"]
_NO_DEEPSPEED = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed (make setup installs it)"
)
STRATEGIES = [
    "ddp",
    "fsdp",
    pytest.param("deepspeed_stage_2", marks=_NO_DEEPSPEED),
    pytest.param("deepspeed_stage_3", marks=_NO_DEEPSPEED),
]
# columns that say what was rolled out and how it scored (the rank that did it may differ)
ROLLOUT = ["step", "uid", "response", "reward_task", "route", "router_prob", "cost"]


def _run(run_dir: Path, *overrides: str, expect: int = 0) -> None:
    """One training command; every process it starts is gone when this returns (a rank that a
    SIGKILL left waiting on a collective would otherwise hold the pipes open)."""
    log = run_dir.parent / f"{run_dir.name}.log"
    env = {**TRAIN_ENV, "OMP_NUM_THREADS": "1"}
    with open(log, "a") as out:
        proc = subprocess.Popen(
            train_cmd(*BASE, f"run_dir={run_dir}", *overrides),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=600)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert code == expect, f"exit {code}, expected {expect}:\n{log.read_text()[-6000:]}"


def _rollouts(run_dir: Path) -> pd.DataFrame:
    frames = [pd.read_parquet(p) for p in sorted((run_dir / "rollouts").glob("*.parquet"))]
    rows = pd.concat(frames)[ROLLOUT]
    return rows.sort_values(ROLLOUT[:3]).reset_index(drop=True)


def _kill_at_step_2_and_resume(run_dir: Path, strategy: str) -> Path:
    """SIGKILL on every rank at step 2 (after its update, before its checkpoint), then resume. The
    sharded strategies validate after every step (greedy: no draw the training rollouts share)."""
    fault = fault_overrides(2, "SIGKILL")
    validate = VALIDATE_EVERY_STEP if strategy in ("fsdp", "deepspeed_stage_3") else []
    _run(run_dir, *TWO, f"trainer.strategy={strategy}", *validate, *fault, expect=-signal.SIGKILL)
    found = latest_checkpoint(run_dir / "checkpoints")
    assert found is not None and found.name in ("last.ckpt", "step_00000001.ckpt")
    assert checkpoint_kind(found) == ("file" if strategy == "ddp" else strategy.split("_")[0])
    assert consolidated_state_dict(found)["lagrange.lam"].item() != 1.0  # λ moved at step 1
    _run(run_dir, *TWO, f"trainer.strategy={strategy}", *validate, "resume=true")
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("strategies")


@pytest.fixture(scope="module")
def one_process(runs) -> Path:
    _run(runs / "one_process")
    return runs / "one_process"


@pytest.fixture(scope="module")
def uninterrupted_ddp(runs) -> Path:
    _run(runs / "ddp", *TWO, "trainer.strategy=ddp")
    return runs / "ddp"


def test_ddp_sees_the_prompts_and_logs_the_reward_of_one_process(one_process, uninterrupted_ddp):
    one, ddp = _rollouts(one_process), _rollouts(uninterrupted_ddp)
    for step in range(3):
        assert set(one[one.step == step].uid) == set(ddp[ddp.step == step].uid)
    # draws keyed to the prompt and step, not to the rank (rollout.keyed_draws): step 1's routes,
    # tokens, rewards and costs are one process's (router_prob: the same head on other padding)
    first = [frame[frame.step == 0].reset_index(drop=True) for frame in (ddp, one)]
    pd.testing.assert_frame_equal(*first, check_exact=False, atol=1e-6, rtol=0)
    assert first[0].route.nunique() > 1 and first[0].response.nunique() > 1  # real draws compared
    ranks = pd.concat(pd.read_parquet(p) for p in (uninterrupted_ddp / "rollouts").glob("*.parquet"))["rank"]
    assert set(ranks) == {0, 1}  # the log holds every rank's rows, once
    assert len(ranks) == 3 * 4 * 4  # steps x prompts x copies
    # the logged scalars are those of both ranks' rollouts together, as one process logs them;
    # route accuracy with its own denominators, not a mean of the ranks' ratios
    logged = {tag: dict(points) for tag, points in scalars(uninterrupted_ddp).items()}
    rows = pd.concat(pd.read_parquet(p) for p in (uninterrupted_ddp / "rollouts").glob("*.parquet"))
    for step, g in rows.groupby("step"):
        expected = {
            "reward_task_mean": g.reward_task.mean(),
            "cost_mean": g.cost.mean(),
            "route_frac_answer": (g.route == "answer").mean(),
            "route_frac_search": (g.route == "search").mean(),
        }
        acc_answer, acc_family = route_accuracy(list(g.weak_label), list(g.route))
        expected.update(route_acc_answer=acc_answer, route_acc_family=acc_family)
        for name, value in expected.items():
            if value is not None:
                assert logged[f"train/{name}"][step] == pytest.approx(value, abs=1e-6), (step, name)
    one_reward = dict(scalars(one_process)["train/reward_task_mean"])[0]
    assert logged["train/reward_task_mean"][0] == pytest.approx(one_reward, abs=1e-6)


def test_ddp_lambda_follows_the_controller_on_the_global_cost(uninterrupted_ddp):
    """λ after 3 steps is the router_grpo controller's (PID) update on the mean cost of both ranks'
    rollouts, replayed here from the rollout log; rank 0's own half would give another λ."""
    rows = pd.concat(pd.read_parquet(p) for p in (uninterrupted_ddp / "rollouts").glob("*.parquet"))
    assert all(len(step) == 2 * 2 * 4 for _, step in rows.groupby("step"))  # ranks x prompts x copies
    ckpt = torch.load(uninterrupted_ddp / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 3
    lam = float(ckpt["state_dict"]["lagrange.lam"])
    assert lam == pytest.approx(_replayed_lambda(rows), abs=1e-6)
    rank0 = rows[rows["rank"] == 0]
    if rank0.groupby("step").cost.mean().tolist() != rows.groupby("step").cost.mean().tolist():
        assert lam != pytest.approx(_replayed_lambda(rank0), abs=1e-6)


def _replayed_lambda(rows: pd.DataFrame) -> float:
    """λ after feeding each step's [cost sum, reward sum, count] of ``rows`` to the run's controller."""
    from src.algorithms.lagrange import LagrangeMultiplier
    from src.config.job import compose_job
    from src.config.schema import RouterConfig
    from src.jobs.build import dataclass_from

    router = dataclass_from(RouterConfig, compose_job([*BASE, *TWO]).router)
    lagrange = LagrangeMultiplier(router, router.lambda_init)
    for _, step in rows.groupby("step"):
        totals = [step.cost.sum(), step.reward_task.sum(), len(step)]
        lagrange.update(torch.tensor(totals, dtype=torch.float64))
    return lagrange.value


@pytest.fixture(scope="module")
def killed_and_resumed(runs):
    """strategy -> its run killed at step 2 and resumed, trained on first use."""
    done: dict[str, Path] = {}

    def get(strategy: str) -> Path:
        if strategy not in done:
            done[strategy] = _kill_at_step_2_and_resume(runs / f"resumed_{strategy}", strategy)
        return done[strategy]

    return get


# (strategy, killed and resumed?). ZeRO-2 keeps its checkpoints as ZeRO-3 does (DeepSpeed's
# directories, the same resume path): the default tier runs it once, uninterrupted; its kill and
# resume (a minute) is in the slow tier, here and bit for bit in the test below. DDP's kill and
# resume (a minute: its checkpoint is one file, resumed on 2 ranks as FSDP2's and ZeRO-3's are
# here, and as one process resumes a file in tests/e2e/jobs/test_resume_exact.py) is slow too.
STRATEGY_RUNS = [
    pytest.param("ddp", True, id="ddp", marks=pytest.mark.slow),
    pytest.param("fsdp", True, id="fsdp"),
    pytest.param("deepspeed_stage_2", False, id="deepspeed_stage_2-uninterrupted", marks=_NO_DEEPSPEED),
    pytest.param("deepspeed_stage_2", True, id="deepspeed_stage_2", marks=[_NO_DEEPSPEED, pytest.mark.slow]),
    pytest.param("deepspeed_stage_3", True, id="deepspeed_stage_3", marks=_NO_DEEPSPEED),
]


@pytest.mark.parametrize("strategy, killed", STRATEGY_RUNS)
def test_strategy_matches_uninterrupted_ddp(
    strategy, killed, runs, one_process, uninterrupted_ddp, killed_and_resumed
):
    """The strategy's run (killed at step 2 and resumed, or whole) rolls out what DDP rolls out and
    ends within 1e-5 of DDP's weights after 3 steps with a real gradient."""
    if killed:
        run_dir = killed_and_resumed(strategy)
    else:
        run_dir = runs / f"whole_{strategy}"
        _run(run_dir, *TWO, f"trainer.strategy={strategy}")
    got = _rollouts(run_dir)
    one = _rollouts(one_process)
    assert set(got[got.step == 0].uid) == set(one[one.step == 0].uid)
    assert got[got.step == 0].reward_task.mean() == pytest.approx(one[one.step == 0].reward_task.mean())
    pd.testing.assert_frame_equal(got, _rollouts(uninterrupted_ddp), check_exact=False, atol=1e-6, rtol=0)

    expected = consolidated_state_dict(uninterrupted_ddp / "checkpoints" / "last.ckpt")
    final = consolidated_state_dict(latest_checkpoint(run_dir / "checkpoints"))
    first = consolidated_state_dict(uninterrupted_ddp / "checkpoints" / "step_00000001.ckpt")
    assert set(final) == set(expected)
    for name, value in expected.items():
        diff = (final[name].float() - value.float()).abs().max().item()
        assert diff <= 1e-5, f"{strategy}: {name} differs from DDP's by {diff}"
    moved = [n for n in expected if n.startswith("actor.") and not torch.equal(expected[n], first[n])]
    assert moved, "the actor did not move between steps 1 and 3: no real gradient was compared"
    assert any(n.startswith("router_head.") and not torch.equal(expected[n], first[n]) for n in expected)


@pytest.mark.parametrize("strategy", ["fsdp", pytest.param("deepspeed_stage_3", marks=_NO_DEEPSPEED)])
def test_sharded_validation_routes_with_the_heads_average(strategy, killed_and_resumed):
    """Validation after every step on 2 ranks: the router's Polyak average (router.ema_decay, the
    demo's) routes it and the val/routing scalars; its weights are read as plain tensors, not through
    the sharded module, and the checkpoint holds the whole average, one update per step (through
    the kill and the resume)."""
    run_dir = killed_and_resumed(strategy)
    series = scalars(run_dir)
    assert [s for s, _ in series["val/routing_greedy/tool_rate"]] and "val/route_frac_answer" in series
    state = consolidated_state_dict(latest_checkpoint(run_dir / "checkpoints"))
    assert int(state["router_head.ema_updates"]) == 3
    assert state["router_head.ema_1_weight"].shape == state["router_head.mlp.1.weight"].shape
    assert not torch.equal(state["router_head.ema_1_weight"], state["router_head.mlp.1.weight"])


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES[1:])  # DDP's own comparison is the test above
def test_strategy_resumed_equals_its_own_uninterrupted_run_bit_for_bit(strategy, tmp_path):
    """ZeRO-3 differs from DDP by ~1e-7 (its reductions add in another order); against its own
    uninterrupted run every strategy's resume is exact."""
    _run(tmp_path / "whole", *TWO, f"trainer.strategy={strategy}")
    resumed = _kill_at_step_2_and_resume(tmp_path / "resumed", strategy)
    pd.testing.assert_frame_equal(_rollouts(resumed), _rollouts(tmp_path / "whole"), check_exact=True)
    whole = consolidated_state_dict(latest_checkpoint(tmp_path / "whole" / "checkpoints"))
    final = consolidated_state_dict(latest_checkpoint(resumed / "checkpoints"))
    for name, value in whole.items():
        assert torch.equal(final[name], value), f"{strategy}: {name} differs after the resume"
