import math

import pytest
import torch

from src.algorithms.loss_module import get_advantage
from src.algorithms.rlvcr import (
    RlvcrParams,
    StepLevels,
    make_level_scores,
    rlvcr_advantage,
    rlvcr_metrics,
    thinking_advantage,
)
from src.rollout.rlvcr.scoring import score_levels

EPS, TIE = 1e-6, 1e-6


def grpo_loop(rewards, groups, eps=EPS):
    out = [0.0] * len(rewards)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        vals = [rewards[i] for i in idx]
        mu = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 1.0
        for i in idx:
            out[i] = (rewards[i] - mu) / (sd + eps)
    return out


def rlvcr_loop(rewards, groups, step_ep, scores, costs, orig, qual, cost_max, alpha, w):
    traj = grpo_loop(rewards, groups)
    think, adv = [], []
    for s in range(len(step_ep)):
        r = [scores[s][k] + alpha * (0.5 - costs[s][k] / cost_max) for k in range(4)]
        mu = sum(r) / 4
        sd = math.sqrt(sum((x - mu) ** 2 for x in r) / 3)
        t = (r[orig[s]] - mu) / (sd + EPS) if qual[s] and max(r) - min(r) > TIE else 0.0
        think.append(t)
        adv.append(traj[step_ep[s]] + w * t)
    return think, adv


@pytest.mark.parametrize("seed", range(5))
def test_matches_plain_loop_on_random_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    n = 13
    # group sizes 4, 4, 3, 1 (a single-sample group) and 1
    groups = torch.tensor([0] * 4 + [1] * 4 + [2] * 3 + [3] + [4])
    rewards = torch.randint(0, 3, (n,), generator=gen).float()
    rewards[4:8] = 1.0  # a group whose episodes all scored the same
    s = 40
    step_ep = torch.randint(0, n, (s,), generator=gen)
    scores = -3 * torch.rand(s, 4, generator=gen)
    costs = torch.randint(0, 300, (s, 4), generator=gen).float()
    costs[:, 0] = 0  # level 1 never thinks
    scores[:6] = scores[:6, :1]  # equal scores ...
    costs[:6] = 17.0  # ... and equal costs: four identical rewards
    orig = torch.randint(0, 4, (s,), generator=gen)
    qual = torch.rand(s, generator=gen) > 0.3
    kw = {"cost_max": 200.0, "alpha": 0.7, "w": 0.5}
    out = rlvcr_advantage(rewards, groups, StepLevels(step_ep, scores, costs, orig, qual), RlvcrParams(**kw))
    ref_think, ref_adv = rlvcr_loop(
        rewards.tolist(),
        groups.tolist(),
        step_ep.tolist(),
        scores.tolist(),
        costs.tolist(),
        orig.tolist(),
        qual.tolist(),
        **kw,
    )
    torch.testing.assert_close(out.thinking_adv, torch.tensor(ref_think), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.advantage, torch.tensor(ref_adv), atol=1e-4, rtol=1e-4)
    assert torch.isfinite(out.advantage).all() and torch.isfinite(out.thinking_adv).all()
    assert (out.thinking_adv[:6] == 0).all()  # equal rewards -> exactly 0
    assert (out.thinking_adv[~qual] == 0).all()
    assert out.trajectory_adv[11] == 0 and out.trajectory_adv[12] == 0  # groups of one
    assert (out.trajectory_adv[4:8] == 0).all()


def test_w_zero_gives_trajectory_advantage_per_step():
    rewards, groups = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1])
    step_ep = torch.tensor([0, 0, 1, 2])
    scores = torch.randn(4, 4)
    orig, qual = torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool)
    out = rlvcr_advantage(
        rewards,
        groups,
        StepLevels(step_ep, scores, torch.zeros(4, 4), orig, qual),
        RlvcrParams(cost_max=100, alpha=1.0, w=0.0),
    )
    torch.testing.assert_close(out.advantage, out.trajectory_adv[step_ep])


def test_no_steps_is_fine():
    out = rlvcr_advantage(
        torch.tensor([1.0, 0.0]),
        torch.tensor([0, 0]),
        StepLevels(
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, 4),
            torch.zeros(0, 4),
            torch.zeros(0, dtype=torch.long),
            torch.zeros(0, dtype=torch.bool),
        ),
        RlvcrParams(cost_max=10, alpha=1, w=1),
    )
    assert out.advantage.shape == (0,) and out.trajectory_adv.shape == (2,)


def test_cheaper_thinking_wins_when_scores_tie():
    scores = torch.zeros(1, 4)
    costs = torch.tensor([[0.0, 20.0, 80.0, 200.0]])
    adv = [
        thinking_advantage(
            scores,
            costs,
            torch.tensor([k]),
            torch.tensor([True]),
            RlvcrParams(cost_max=200, alpha=1.0, w=1.0),
        )[0].item()
        for k in range(4)
    ]
    assert adv == sorted(adv, reverse=True) and adv[0] > 0 > adv[3]


def test_registered_and_shape_errors():
    assert get_advantage("rlvcr") is rlvcr_advantage
    with pytest.raises(ValueError, match=r"level_costs must have shape \(2, 4\)"):
        rlvcr_advantage(
            torch.zeros(1),
            torch.zeros(1, dtype=torch.long),
            StepLevels(
                torch.zeros(2, dtype=torch.long),
                torch.zeros(2, 4),
                torch.zeros(2, 3),
                torch.zeros(2, dtype=torch.long),
                torch.ones(2, dtype=torch.bool),
            ),
            RlvcrParams(cost_max=1, alpha=1, w=1),
        )
    with pytest.raises(ValueError, match="orig_level must be a 0-based"):
        rlvcr_advantage(
            torch.zeros(1),
            torch.zeros(1, dtype=torch.long),
            StepLevels(
                torch.zeros(1, dtype=torch.long),
                torch.zeros(1, 4),
                torch.zeros(1, 4),
                torch.tensor([4]),
                torch.ones(1, dtype=torch.bool),
            ),
            RlvcrParams(cost_max=1, alpha=1, w=1),
        )
    with pytest.raises(ValueError, match="cost_max must be > 0"):
        RlvcrParams(cost_max=0, alpha=1.0, w=1.0)


def test_make_level_scores_modes():
    lp, ent = torch.tensor([[-1.0, -2.0, -0.5, -3.0]]), torch.tensor([[1.0, 0.2, 2.0, 0.5]])
    assert make_level_scores(lp, ent, "logprob").tolist() == lp.tolist()
    assert make_level_scores(lp, ent, "neg_entropy").tolist() == (-ent).tolist()
    with pytest.raises(ValueError, match="unknown RLVCR score mode 'prob'"):
        make_level_scores(lp, ent, "prob")


class CountingLM(torch.nn.Module):
    """Known logits: at each position, logit_j = SCALE * (count of token j so far).

    So the more often a level's thinking mentions the action token, the likelier the action.
    """

    SCALE, VOCAB = 0.5, 16

    def __init__(self):
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None):
        onehot = torch.nn.functional.one_hot(input_ids, self.VOCAB).float()
        return type("Out", (), {"logits": self.SCALE * onehot.cumsum(1)})()


def test_level_whose_context_explains_the_action_gets_largest_advantage():
    tags = [[1, 2], [1, 3], [1, 4], [1, 5]]
    history, action_tag, action = [8, 9], [6], [7]
    # token 7 (the action) appears 0, 1, 4, 2 times in the level 1..4 thinking
    thinking = [tags[0], tags[1] + [7, 10], tags[2] + [7, 7, 7, 7], tags[3] + [7, 11, 7, 12]]
    out = score_levels(CountingLM(), 0, history, thinking, action_tag, action, tags)
    # analytic log-prob of token 7 after each context
    expected = []
    for ctx in thinking:
        counts = torch.bincount(torch.tensor(history + ctx + action_tag), minlength=16).float()
        expected.append(float(torch.log_softmax(CountingLM.SCALE * counts, -1)[7]))
    torch.testing.assert_close(out.action_logprob, torch.tensor(expected), atol=1e-6, rtol=1e-6)
    assert out.thinking_tokens.tolist() == [0, 2, 4, 4]

    scores = make_level_scores(out.action_logprob[None], out.action_entropy[None], "logprob")
    advs = [
        thinking_advantage(
            scores,
            out.thinking_tokens[None],
            torch.tensor([k]),
            torch.tensor([True]),
            RlvcrParams(cost_max=200, alpha=0.0, w=1.0),
        )[0].item()
        for k in range(4)
    ]
    assert max(range(4), key=lambda k: advs[k]) == 2  # level 3: four mentions of the action
    assert advs[0] < 0 and advs[2] > 0


def test_metrics():
    m = rlvcr_metrics(
        levels=[1, 3, 3, None, 4],
        thinking_tokens=torch.tensor([0, 10, 20, 0, 50]),
        thinking_adv=torch.tensor([0.5, -1.0, 1.5, 0.0, 9.0]),
        qualifies=torch.tensor([True, True, True, False, False]),
    )
    assert m["rlvcr/level_frac_1"] == 0.25 and m["rlvcr/level_frac_2"] == 0.0
    assert m["rlvcr/level_frac_3"] == 0.5 and m["rlvcr/level_frac_4"] == 0.25
    assert m["rlvcr/unparsed_frac"] == pytest.approx(0.2)
    assert m["rlvcr/thinking_tokens_mean"] == 16.0
    assert m["rlvcr/qualifying_steps"] == 3.0
    assert m["rlvcr/thinking_adv_mean"] == pytest.approx(1 / 3)
    assert (m["rlvcr/thinking_adv_min"], m["rlvcr/thinking_adv_max"]) == (-1.0, 1.5)
    empty = rlvcr_metrics([], torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.bool))
    assert all(math.isfinite(v) and v == 0.0 for v in empty.values())
