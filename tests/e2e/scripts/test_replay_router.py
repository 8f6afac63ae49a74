"""scripts/replay_router.py and src.jobs.router_replay: the router's learning replayed on a frozen
actor's route table, with the real head, loss and λ controller."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from jobhelpers import REPO, run_command

from src.config.schema import RouterConfig
from src.jobs.router_replay import ReplayTable, budget_gain_shares, probe_routes, replay, route_frame


@pytest.fixture(scope="module")
def run(router_run, tmp_path_factory, one_torch_thread):
    """One copy of the shared router run for the module, its replay tables (``run/replay``) built
    by the first test that reads them; the tests only add files beside them."""
    import shutil

    copy = tmp_path_factory.mktemp("replay") / "run"
    shutil.copytree(router_run, copy)
    return copy


def bandit_table(n: int, seed: int) -> ReplayTable:
    """Prompts with a class-revealing input: 40 % ANSWER (answer pays 1, a tool 0), 30 % SEARCH and
    30 % CALCULATE (answer -3, own family -1, other family -2); a tool route costs 1."""
    g = torch.Generator().manual_seed(seed)
    label = torch.multinomial(torch.tensor([0.4, 0.3, 0.3]), n, replacement=True, generator=g)
    inputs = torch.nn.functional.one_hot(label, 3).float() + 0.3 * torch.randn(n, 3, generator=g)
    reward = torch.zeros(n, 3)
    reward[label == 0] = torch.tensor([1.0, 0.0, 0.0])
    reward[label == 1] = torch.tensor([-3.0, -1.0, -2.0])
    reward[label == 2] = torch.tensor([-3.0, -2.0, -1.0])
    cost = torch.tensor([0.0, 1.0, 1.0]).expand(n, 3).clone()
    return ReplayTable(inputs, reward, cost, label)


@pytest.mark.parametrize(
    "budget, ema_decay", [(0.3, 0.0), pytest.param(0.5, 0.0, marks=pytest.mark.slow), (0.3, 0.99)]
)  # another budget, same behaviour: the slow tier
def test_replay_holds_the_budget_and_routes_by_label(budget, ema_decay):
    """Tools gain 2 over answer on tool prompts, so λ settles near 2 and the budget decides how many
    tool prompts get a tool; ANSWER prompts stay on answer and tool routes take the own family.
    With ``ema_decay`` the held-out figures are the head's Polyak average's, as a run's are."""
    cfg = RouterConfig(
        enable=True, pooling="tail", mlp_hidden=32, lr=3e-3, budget=budget, lambda_init=1.0,
        lambda_lr=0.15, lambda_update="pid", lambda_kp=2.0, lambda_cost_ema=0.8,
        entropy_coef=0.3, entropy_coef_final=0.1, entropy_decay_steps=200, norm_adv_by_std=False,
        ema_decay=ema_decay,
    )  # fmt: skip
    test = bandit_table(256, 1)
    out, probs = replay(bandit_table(2048, 0), test, cfg, seed=0, steps=400)
    assert abs(out["cost_last50"] - budget) <= 0.05, out
    assert out["train_acc_answer"] >= 0.9 and out["train_acc_family"] >= 0.9, out
    assert out["test_acc_answer"] >= 0.9 and out["test_acc_family"] >= 0.9, out
    # under the budget: a threshold calibrated on the 256 test prompts lets floor(B * 256) use a tool
    assert out["test_budgeted_tool_rate"] == pytest.approx(int(budget * 256) / 256, abs=1 / 256), out
    assert out["test_budgeted_acc_answer"] >= 0.9 and out["test_budgeted_acc_family"] >= 0.9, out
    assert 1.0 < out["lambda_min"] <= out["lambda_max"] < 3.5, out
    # every tool prompt gains 2 by its own family: under B the head spends the budget as best does
    shares = budget_gain_shares(route_frame(test, probs), budget)
    assert shares["gain_share"] >= 0.95 and np.isnan(shares["readable_share"]), shares


def _plain_probe_routes(train: ReplayTable, test: ReplayTable, budget: float, ridge: float) -> list[int]:
    """The probe in plain numpy: per route, ridge on standardised inputs with a bias column; then a
    sort of the test prompts by their better family's predicted gain over answer."""
    x, xt = train.inputs.double().numpy(), test.inputs.double().numpy()
    mean, sd = x.mean(0), x.std(0, ddof=1) + 1e-6
    a = np.hstack([(x - mean) / sd, np.ones((len(x), 1))])
    at = np.hstack([(xt - mean) / sd, np.ones((len(xt), 1))])
    predicted = np.zeros((len(xt), 3))
    for route in range(3):
        w = np.linalg.solve(
            a.T @ a + ridge * np.eye(a.shape[1]), a.T @ train.reward[:, route].double().numpy()
        )
        predicted[:, route] = at @ w
    scored = []
    for i, row in enumerate(predicted):
        family = 1 if row[1] >= row[2] else 2
        scored.append((-(row[family] - row[0]), i, family))
    routes = [0] * len(xt)
    for _, i, family in sorted(scored)[: int(budget * len(xt) + 1e-9)]:
        routes[i] = family
    return routes


@pytest.mark.parametrize("budget, ridge", [(0.2, 10.0), (0.5, 1.0)])
def test_probe_routes_spend_the_budget_where_tools_gain(budget, ridge):
    """The full-information probe: ⌊B·N⌋ tool routes, none on an ANSWER prompt (its tool route earns
    more, 0 against -1, but gains nothing over answering), nearly all by the prompt's own family (the
    inputs are noisy), the plain reference's routes, and nearly the whole of best's gain."""
    train, test = bandit_table(512, 0), bandit_table(200, 1)
    routes = probe_routes(train, test, budget, ridge)
    assert routes.tolist() == _plain_probe_routes(train, test, budget, ridge)
    tool = routes > 0
    assert int(tool.sum()) == int(budget * 200 + 1e-9)
    assert not (tool & (test.label == 0)).any(), "a tool route on an ANSWER prompt"
    assert (routes[tool] == test.label[tool]).double().mean() >= 0.95
    one_hot = torch.nn.functional.one_hot(routes, 3).double()
    assert budget_gain_shares(route_frame(test, one_hot), budget)["gain_share"] >= 0.95


def test_route_frame_checks_its_inputs():
    test = bandit_table(8, 0)
    with pytest.raises(ValueError, match="8 test prompts, probs"):
        route_frame(test, torch.zeros(7, 3))


def test_replay_table_shapes_are_checked():
    with pytest.raises(ValueError, match="replay table shapes"):
        ReplayTable(torch.zeros(4, 8), torch.zeros(4, 3), torch.zeros(4, 2), torch.zeros(4))


def test_replay_script_on_a_real_run(run, tmp_path):
    """The table comes from the run's checkpoint (router inputs equal what its head reads), is cached,
    and one JSON line per seed comes back; ``--frontier`` adds the gain shares under B and lines for
    the run's own head and the linear probe, the run head's share that of its route table."""
    cmd = [sys.executable, str(REPO / "scripts" / "replay_router.py"), "--run", str(run), "--limit", "8"]
    cmd += ["--seeds", "0,1", "--steps", "3", "--frontier", "router.budget=0.5"]
    proc = run_command(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [x.get("head") for x in lines[:2]] == ["run", "linear_probe"]
    heads, lines = lines[:2], lines[2:]
    assert [x["seed"] for x in lines] == [0, 1] and all("cost_last50" in x for x in lines)
    assert all("gain_share_budgeted" in x and "readable_share_budgeted" in x for x in heads + lines)
    for x in lines:  # greedy and budgeted verdicts; a NaN accuracy (no tool route) is a miss
        assert isinstance(x["targets"], bool) and isinstance(x["targets_budgeted"], bool)
        assert 0.0 <= x["test_budgeted_tool_rate"] <= 0.5 + 1e-9, x
    train = torch.load(run / "replay" / "train-8.pt")
    assert train["inputs"].shape[0] == 8 and train["reward"].shape == (8, 3)
    assert set(train["cost"][:, 0].tolist()) == {0.0}  # the answer route calls no tool

    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy

    policy = load_router_policy(run, device="cpu")
    records = read_rlla_parquet(data_files(policy.config)[0][0])[0][:8]
    with torch.no_grad():
        want = policy.route_logits([r.messages for r in records])
        # inference routes with the head's Polyak average (router.ema_decay): the same MLP input
        got = policy.module.router_head.pooled_logits(train["inputs"], averaged=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    # the route frame of the test table is the run's route table (evaluate.py --sweep's), p_* and all
    from src.frontier import frontier_points
    from src.jobs.route_eval import route_table

    test = ReplayTable(**torch.load(run / "replay" / "test-8.pt"))
    test_records = read_rlla_parquet(data_files(policy.config)[1][0])[0][:8]
    table = route_table(policy, test_records, reward_config=policy.reward_config)
    with torch.no_grad():
        probs = torch.softmax(
            policy.module.router_head.pooled_logits(test.inputs, averaged=True).double(), -1
        )
    frame = route_frame(test, probs, test_records)
    table["weak_label"] = table["weak_label"].fillna("MIXED")
    columns = ["uid", "weak_label", "request_class", "named_tool", "learned_route"]
    columns += [f"{k}_{r}" for k in ("reward", "cost") for r in ("answer", "search", "calculate")]
    pd.testing.assert_frame_equal(frame[columns], table[columns], check_dtype=False)
    np.testing.assert_allclose(
        frame[["p_answer", "p_search", "p_calculate"]],
        table[["p_answer", "p_search", "p_calculate"]],
        atol=1e-5,
    )
    want = frontier_points(table, budget=0.5).iloc[0]
    assert heads[0]["gain_share_budgeted"] == pytest.approx(round(want["gain_share"], 3), nan_ok=True)


def test_replay_on_the_warm_starts_inputs(run, tmp_path):
    """--inputs-from warm_start: the inputs are what the run's head reads from its SFT warm start
    (not the final actor), the rewards and costs stay the run's; a missing model is a clear error."""
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy
    from src.jobs.router_replay import router_inputs
    from src.jobs.warm_start import base_model_dir, model_dir
    from src.models.loading import load_causal_lm

    sys.path.insert(0, str(REPO / "scripts"))
    from replay_router import tables, with_inputs_from

    train, test = tables(run, 8)
    warm_train, warm_test = with_inputs_from(run, "warm_start", train, test, 8)
    assert torch.equal(warm_train.reward, train.reward) and torch.equal(warm_test.cost, test.cost)

    policy = load_router_policy(run, device="cpu")
    policy.module.actor.load_state_dict(load_causal_lm(model_dir(policy.config)).state_dict())
    records = read_rlla_parquet(data_files(policy.config)[0][0])[0][:8]
    torch.testing.assert_close(warm_train.inputs, router_inputs(policy, records))
    # another backbone (the untrained base model the warm start was fitted from) reads differently
    base_train, _ = with_inputs_from(run, str(base_model_dir(policy.config)), train, test, 8)
    assert not torch.allclose(base_train.inputs, warm_train.inputs, atol=1e-3)

    with pytest.raises(SystemExit, match="no model at"):
        with_inputs_from(run, str(tmp_path / "nowhere"), train, test, 8)


def test_pooling_overrides_re_pool_the_run_inputs(run, tmp_path):
    """router.pooling / sif_a overrides re-pool the inputs from the run's final backbone: `tail` is the
    plain mean of the last tail_tokens states; `sif` with another a weighs the same tokens otherwise."""
    import dataclasses

    from src.config.schema import RouterConfig as Cfg
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy
    from src.rollout.engines.types import left_pad
    from src.router.head import prompt_representation

    sys.path.insert(0, str(REPO / "scripts"))
    from replay_router import tables, with_pooling

    train, test = tables(run, 8)
    policy = load_router_policy(run, device="cpu")
    assert policy.config.router.pooling == "sif"  # the demo's: re-pooled below as a plain tail mean
    router = dataclasses.replace(Cfg(**policy.config.router), pooling="tail")
    tail_train, tail_test = with_pooling(run, router, train, test, 8)
    assert torch.equal(tail_train.reward, train.reward) and torch.equal(tail_test.cost, test.cost)
    records = read_rlla_parquet(data_files(policy.config)[0][0])[0][:8]
    ids, mask = left_pad([policy.prompt_ids(r.messages) for r in records], policy.tokenizer.pad_token_id)
    with torch.no_grad():
        hidden = policy.module.router_hidden(ids, mask)
    want = prompt_representation(hidden, mask, "tail", router.tail_tokens)
    torch.testing.assert_close(tail_train.inputs, want)
    other_a, _ = with_pooling(run, dataclasses.replace(router, pooling="sif", sif_a=1.0), train, test, 8)
    assert not torch.allclose(other_a.inputs, train.inputs, atol=1e-4)


def test_input_override_re_pools_from_the_base_models_embeddings(run, tmp_path):
    """router.input=base_embeddings re-pools the inputs from the base model's embedding table (the
    model before the warm start), SIF refitted on it; --inputs-from cannot be combined with it."""
    import dataclasses

    from src.config.schema import RouterConfig as Cfg
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy
    from src.jobs.router_pooling import base_input_embeddings, fit_sif_pooling
    from src.jobs.warm_start import base_model_dir
    from src.rollout.engines.types import left_pad

    sys.path.insert(0, str(REPO / "scripts"))
    from replay_router import tables, with_pooling

    train, test = tables(run, 8)
    policy = load_router_policy(run, device="cpu")
    router = dataclasses.replace(Cfg(**policy.config.router), input="base_embeddings", hidden_layer=0)
    base_train, _ = with_pooling(run, router, train, test, 8)
    assert not torch.allclose(base_train.inputs, train.inputs, atol=1e-4)

    # what a run with router.input=base_embeddings reads: SIF over the base table's rows
    table = base_input_embeddings(base_model_dir(policy.config))
    # the base table's rows looked up by hand (not through the head's own table), without the
    # actor's 2,048-prompt forward that its layer-0 states would cost
    policy.module.router_hidden = lambda ids, mask, track=False: table[ids]
    records = read_rlla_parquet(data_files(policy.config)[0][0])[0]
    ids_all = [policy.prompt_ids(r.messages) for r in records]
    fit_sif_pooling(policy.module, ids_all, policy.tokenizer)
    ids, mask = left_pad(ids_all[:8], policy.tokenizer.pad_token_id)
    with torch.no_grad():
        want = policy.module.router_head.represent(policy.module.router_hidden(ids, mask), mask, ids)
    torch.testing.assert_close(base_train.inputs, want, atol=1e-5, rtol=1e-5)

    cmd = [sys.executable, str(REPO / "scripts" / "replay_router.py"), "--run", str(run), "--limit", "8"]
    cmd += ["--inputs-from", "warm_start", "router.input=base_embeddings"]
    proc = run_command(cmd)
    assert proc.returncode != 0 and "--inputs-from with router.pooling" in proc.stderr
