"""Each ``configs/algorithm/<name>.yaml`` loss module, end to end (advantage -> token loss ->
aggregation), against plain loops on random groups with empty rows."""

import functools
from pathlib import Path

import pytest
import torch
from test_advantages import REFERENCES
from test_aggregation import ref_aggregate
from test_policy_losses import ref_gspo, ref_ppo

from src.algorithms import build_loss_module
from src.config.job import compose_job
from src.config.schema import AlgorithmConfig, AlgorithmGroupConfig
from src.jobs.build import dataclass_from

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
NAMES = ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "ppo"]


@functools.cache
def algorithm_config(name: str, *overrides: str) -> AlgorithmConfig:
    cfg = compose_job([f"algorithm={name}", *overrides])
    return dataclass_from(AlgorithmGroupConfig, cfg.algorithm)


def test_every_documented_name_has_a_yaml():
    assert {p.stem for p in (CONFIGS / "algorithm").glob("*.yaml")} >= set(NAMES)


def test_yamls_pick_what_their_names_say():
    got = {n: algorithm_config(n) for n in NAMES}
    assert got["dr_grpo"].adv_estimator == "dr_grpo"
    assert got["dr_grpo"].loss_agg_mode == "seq-mean-token-sum-norm"
    assert got["rloo"].adv_estimator == "rloo" and got["reinforce_pp"].adv_estimator == "reinforce_pp"
    assert got["gspo"].policy_loss == "gspo" and got["gspo"].clip_ratio_high < 0.01
    assert got["ppo"].ppo_epochs > 1 and got["ppo"].clip_ratio_c > 1 and got["ppo"].log_ratio_clamp > 0


def reference_loss(cfg: AlgorithmConfig, rewards, index, logp, old, mask) -> float:
    adv_ref = REFERENCES[cfg.adv_estimator]
    adv = (
        adv_ref(rewards.tolist(), index)
        if cfg.adv_estimator != "grpo"
        else adv_ref(rewards.tolist(), index, cfg.norm_adv_by_std, cfg.adv_eps)
    )
    adv_tok = torch.tensor(adv)[:, None].expand_as(logp)
    if cfg.policy_loss == "gspo":
        token_loss = ref_gspo(logp, old, adv_tok, mask, cfg.clip_ratio_low, cfg.clip_ratio_high)
    else:
        token_loss = torch.tensor(
            [
                [
                    ref_ppo(
                        float(logp[b, t]),
                        float(old[b, t]),
                        float(adv_tok[b, t]),
                        float(mask[b, t]),
                        cfg.clip_ratio_low,
                        cfg.clip_ratio_high,
                        cfg.clip_ratio_c,
                        cfg.log_ratio_clamp,
                    )[0]
                    for t in range(logp.shape[1])
                ]
                for b in range(logp.shape[0])
            ]
        )
    return ref_aggregate(token_loss, mask, cfg.loss_agg_mode, cfg.loss_agg_norm_len)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(3))
def test_loss_module_matches_plain_loop(name, seed):
    cfg = algorithm_config(name)
    lm = build_loss_module(cfg)
    g = torch.Generator().manual_seed(seed)
    n, t = 12, 6
    rewards = torch.randn(n, generator=g)
    index = [int(i) * 10 for i in torch.randint(0, 4, (n,), generator=g)]
    logp = torch.randn(n, t, generator=g) * 0.01 - 1
    old = logp + torch.randn(n, t, generator=g) * 0.01
    mask = (torch.rand(n, t, generator=g) > 0.3).float()
    mask[[2, 7]] = 0  # rows with no response token
    adv = lm.advantages(rewards, index)[:, None] * mask
    out = lm.policy_loss(logp, old, adv, mask)
    got = lm.aggregate(out.loss, mask, lm.normaliser(mask))
    assert got.item() == pytest.approx(
        reference_loss(cfg, rewards, index, logp, old, mask), rel=1e-4, abs=1e-6
    )


def test_unknown_names_and_params_fail_naming_the_key():
    with pytest.raises(KeyError, match="ppo_clip"):
        build_loss_module(AlgorithmConfig(policy_loss="nope"))
    with pytest.raises(KeyError, match="token-mean"):
        build_loss_module(AlgorithmConfig(loss_agg_mode="nope"))
    with pytest.raises(ValueError, match="algorithm.adv_params.tau"):
        build_loss_module(AlgorithmConfig(adv_estimator="rloo", adv_params={"tau": 1.0}))
    with pytest.raises(ValueError, match="old_log_prob_source"):
        build_loss_module(AlgorithmConfig(old_log_prob_source="cache"))


def test_a_researchers_params_reach_their_function():
    from src.algorithms.loss_module import ADVANTAGES

    name = "test_scaled_rloo"
    if name not in ADVANTAGES.names():

        @ADVANTAGES.register(name)
        def scaled(rewards, index, scale: float = 1.0):
            return rloo_reference(rewards, index) * scale

    lm = build_loss_module(AlgorithmConfig(adv_estimator=name, adv_params={"scale": 3.0}))
    rewards, index = torch.tensor([1.0, 2.0, 4.0]), [0, 0, 0]
    torch.testing.assert_close(lm.advantages(rewards, index), 3 * rloo_reference(rewards, index))


def rloo_reference(rewards, index):
    return torch.tensor(REFERENCES["rloo"](rewards.tolist(), list(index)))
