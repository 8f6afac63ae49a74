"""``router.advantage`` through the router's own path: the rollout carries r_task and λ per row,
``RouterPolicy`` picks the advantage by name (the default bit for bit what it computed before the
setting existed), and every router step logs ``train/router_sign_flip_frac``."""

from __future__ import annotations

import copy
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from src.algorithms.lagrange import component_advantage, scalarized_advantage, sign_flip_fraction
from src.algorithms.loss_module import advantage_fn
from src.algorithms.losses import SUPERVISED_TERMS, router_loss
from src.config.schema import AlgorithmGroupConfig, RouterHeadConfig
from src.models.module import ToolRouterModule
from src.models.router_policy import RouterPolicy
from src.rollout.batch import RolloutBatch
from src.rollout.single_turn import RouteDecision, router_rollout

P, G, HIDDEN = 5, 4, 8


def _rollout(lam: float, seed: int = 0):
    """A single-turn router part as the collector builds it: P prompts × G copies, random r_task
    and costs (one prompt's r_task constant, one prompt's cost constant). -> (RouterRollout, uids)."""
    g = torch.Generator().manual_seed(seed)
    n = P * G
    task = (torch.randint(0, 5, (n,), generator=g) / 4.0 + 0.05 * torch.rand(n, generator=g)).tolist()
    cost = torch.randint(0, 3, (n,), generator=g).float().mul(0.5).tolist()
    task[:G] = [0.9] * G
    cost[G : 2 * G] = [0.5] * G
    scored = [
        SimpleNamespace(reward=SimpleNamespace(total=t), cost=c) for t, c in zip(task, cost, strict=True)
    ]
    logits = torch.randn(P, 3, generator=g)
    action = torch.randint(0, 3, (n,), generator=g)
    decision = RouteDecision(
        logits, action, torch.log_softmax(logits, -1).repeat_interleave(G, 0)[range(n), action]
    )
    prompt_ids = [list(range(1, 2 + i)) for i in range(P)]
    router = router_rollout(decision, prompt_ids, 0, G, scored, ["MIXED"] * n, lam)
    return router, [i // G for i in range(n)]


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("lam", [0.0, 0.37, 1.7, 2 / 3])
def test_the_default_is_the_old_advantage_of_r_router_bit_for_bit(lam, norm_by_std):
    router, uids = _rollout(lam)
    cfg = RouterHeadConfig(enable=True, norm_adv_by_std=norm_by_std)
    assert cfg.advantage == "scalarized_reward"
    policy = RouterPolicy(HIDDEN, cfg)
    old = advantage_fn(cfg.adv_estimator, norm_by_std, policy.adv_eps, {}, "router")(router.reward, uids)
    assert torch.equal(policy.advantages(router, uids), old)
    # the rollout keeps r_router as it was, and the r_task and λ it came from
    assert torch.equal(router.reward, router.task_reward - lam * router.cost)
    assert router.lam.dtype == torch.float32 and bool((router.lam == torch.tensor(lam).float()).all())


def test_scalarized_advantage_is_picked_by_name_and_feeds_the_loss():
    router, uids = _rollout(0.8, seed=1)
    policy = RouterPolicy(HIDDEN, RouterHeadConfig(enable=True, advantage="scalarized_advantage"))
    want = scalarized_advantage(router.task_reward, router.cost, router.lam, uids, True, policy.adv_eps)
    got = policy.advantages(router, uids)
    assert torch.equal(got, want)
    assert torch.equal(got[:G], -0.8 * component_advantage(router.cost, uids)[:G])  # constant r_task
    assert torch.equal(got[G : 2 * G], component_advantage(router.task_reward, uids)[G : 2 * G])
    logits = torch.randn(P, 3)
    loss, parts = policy.loss(logits, router, uids, step=0)
    expected, _ = router_loss(logits[router.prompt_index], router.action, want, policy.entropy_coef(0))
    torch.testing.assert_close(loss, expected)
    task_adv = component_advantage(router.task_reward, uids)
    assert float(parts["sign_flip_frac"]) == sign_flip_fraction(want, task_adv)


def test_the_loss_reports_the_share_of_rows_the_cost_term_flips():
    router, uids = _rollout(3.0, seed=2)  # a large λ: the cost term outweighs r_task on some rows
    policy = RouterPolicy(HIDDEN, RouterHeadConfig(enable=True))
    _, parts = policy.loss(torch.randn(P, 3), router, uids, step=0)
    adv = policy.advantages(router, uids)
    task_adv = component_advantage(router.task_reward, uids)
    flips = sum(1 for a, t in zip(adv.tolist(), task_adv.tolist(), strict=True) if a * t < 0) / len(uids)
    assert float(parts["sign_flip_frac"]) == pytest.approx(flips) and flips > 0
    assert set(parts) == {"pg", "entropy", "ce", "sign_flip_frac"}


@pytest.mark.usefixtures("one_torch_thread")
def test_every_router_step_logs_the_sign_flip_fraction(tiny):
    """``ToolRouterModule._router_update``'s scalars (no Trainer: one optimizer, the loss returned)."""
    model = copy.deepcopy(tiny[0]).eval()
    module = ToolRouterModule(model, AlgorithmGroupConfig(use_kl_loss=False), RouterHeadConfig(enable=True))
    actor_opt = torch.optim.SGD(module.actor.parameters(), lr=0.0)
    module._optimizers = lambda: (actor_opt, None)
    router, uids = _rollout(1.2, seed=3)
    empty = torch.zeros(len(uids), 0)
    rb = RolloutBatch(empty.long(), empty.long(), empty, router.task_reward, uids, empty, router=router)
    loss, metrics = module._router_update(rb)
    assert loss is not None and "train/router_sign_flip_frac" in metrics
    want = sign_flip_fraction(
        module.router_head.advantages(router, uids), module.router_head.task_advantages(router, uids)
    )
    assert metrics["train/router_sign_flip_frac"] == want


def test_the_supervised_term_is_picked_by_name_from_the_weak_labels():
    """``router.sup_term`` reaches the loss: the rollout's weak labels, the term by name."""
    router, uids = _rollout(0.5, seed=4)
    labels = torch.tensor([2, 1, 0, -1, 1] * G)[: len(uids)]
    router = replace(router, target=labels)
    logits = torch.randn(P, 3)
    rows = logits[router.prompt_index]
    for term in ("route", "family"):
        policy = RouterPolicy(HIDDEN, RouterHeadConfig(enable=True, sup_coef=0.4, sup_term=term))
        loss, parts = policy.loss(logits, router, uids, step=0)
        adv = policy.advantages(router, uids)
        want, _ = router_loss(rows, router.action, adv, policy.entropy_coef(0), 0.4, labels, term)
        assert torch.equal(loss, want)
        assert torch.equal(parts["ce"], SUPERVISED_TERMS.get(term)(torch.log_softmax(rows, -1), labels))
    assert float(parts["ce"]) > 0
