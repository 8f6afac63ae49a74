"""A non-finite reward is an error naming the rollout's uid, in the pure check and in the collector."""

from __future__ import annotations

import math
import random

import pytest
import torch

from src.config.schema import RouterConfig
from src.rewards.dispatch import NonFiniteRewardError, check_finite_rewards
from src.rewards.rlla import RewardBreakdown, RewardConfig
from src.rollout.batch import CollectRequest
from src.rollout.single_turn import ResponseScorer
from src.router.families import ToolFamilies


def test_finite_rewards_pass():
    check_finite_rewards([0.0, -3.0, 1e30], ["a", "a", "b"])
    check_finite_rewards(torch.tensor([1.0, 2.0]), ["a", "b"])
    check_finite_rewards([], [])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_names_its_uid_and_position(bad):
    with pytest.raises(NonFiniteRewardError) as err:
        check_finite_rewards([1.0, bad, 0.5], ["row-1", "row-7", "row-9"])
    msg = str(err.value)
    assert "'row-7'" in msg and "rollout 1" in msg and str(bad) in msg
    assert "row-1" not in msg and "row-9" not in msg


def test_tensor_input_and_the_what_label():
    with pytest.raises(
        NonFiniteRewardError, match=r"non-finite router reward for 1 of 2 .*'b' \(rollout 1: nan\)"
    ):
        check_finite_rewards(torch.tensor([0.0, float("nan")]), ["a", "b"], what="router reward")


def test_many_bad_rewards_are_counted_not_all_listed():
    uids = [f"u{i}" for i in range(30)]
    with pytest.raises(NonFiniteRewardError, match="30 of 30 .* and 20 more"):
        check_finite_rewards([math.nan] * 30, uids)


def test_matches_a_plain_loop_on_random_inputs():
    rng = random.Random(0)
    for _ in range(200):
        values = [
            rng.choice([0.0, 1.5, -2.0, math.nan, math.inf, -math.inf]) for _ in range(rng.randrange(8))
        ]
        uids = [f"u{i}" for i in range(len(values))]
        expected_bad = [u for u, v in zip(uids, values) if math.isnan(v) or abs(v) == math.inf]
        try:
            check_finite_rewards(values, uids)
            assert not expected_bad
        except NonFiniteRewardError as err:
            assert expected_bad and all(f"'{u}'" in str(err) for u in expected_bad)


def test_length_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="3 rewards for 2 rollout uids"):
        check_finite_rewards([0.0, 1.0, 2.0], ["a", "b"])


class _FixedEngine:
    """Every prompt gets ``n`` copies of one short reply."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompt_ids, sampling, row_keys=None):
        from src.rollout.engines.types import Completions

        reply = self.tok.encode("<think>x</think>\n<response>ok</response>", add_special_tokens=False)
        seqs = [list(reply) for _ in prompt_ids for _ in range(sampling.n)]
        return Completions.from_token_lists(seqs, self.tok.pad_token_id)


def test_single_turn_collector_rejects_a_nan_reward_naming_the_uid(tiny, monkeypatch):
    """The scorer returning NaN for one prompt fails the step instead of poisoning its group."""
    from src.config.sampling import SamplingParams
    from src.rollout import single_turn

    tok = tiny[1]
    real_score = single_turn.score

    def score(data_source, response, ground_truth, step=0, config=None):
        if ground_truth == "poisoned":
            return RewardBreakdown(math.nan, 0.0, math.nan, 0.0)
        return real_score(data_source, response, ground_truth, step=step, config=config)

    monkeypatch.setattr(single_turn, "score", score)
    collector = single_turn.SingleTurnCollector(
        tok,
        _FixedEngine(tok),
        SamplingParams(n_generations_per_prompt=2, max_new_tokens=16),
        ResponseScorer(ToolFamilies(), None, RewardConfig()),
        RouterConfig(enable=False),
    )
    gt = "<think>p</think>\n<response>hi</response>"
    records = [
        {
            "uid": uid,
            "data_source": "rlla",
            "ground_truth": truth,
            "prompt_ids": tok.encode("hello", add_special_tokens=False),
            "messages": [{"role": "system", "content": "no tools"}, {"role": "user", "content": "hello"}],
        }
        for uid, truth in (("clean-row", gt), ("bad-row", "poisoned"))
    ]
    assert collector.collect(CollectRequest(records[:1], step=0)).rewards.isfinite().all()
    with pytest.raises(NonFiniteRewardError, match=r"2 of 4 rollouts: uid 'bad-row' \(rollout 2: nan\)"):
        collector.collect(CollectRequest(records, step=0))


def test_episode_collector_rejects_a_nan_episode_reward_naming_the_uid(monkeypatch):
    """An environment scoring NaN (e.g. a patched simulator) fails the step with the seed's uid."""
    from types import SimpleNamespace

    from src.rollout.episodes import collector as collector_module
    from src.rollout.episodes.collector import EpisodeCollector, EpisodeSettings

    def fake_groups(engine, tokenizer, env_factory, seeds, group_size, *args, **kwargs):
        rewards = {5: [1.0, 0.0], 6: [math.inf, 0.5]}
        return [[SimpleNamespace(reward=r) for r in rewards[seed]] for seed in seeds]

    monkeypatch.setattr(collector_module, "collect_groups", fake_groups)
    collector = EpisodeCollector(None, None, None, EpisodeSettings(group_size=2))
    with pytest.raises(
        NonFiniteRewardError, match=r"episode reward for 1 of 4 rollouts: uid 'seed-6' \(rollout 2: inf\)"
    ):
        collector.collect(
            CollectRequest([{"uid": "seed-5", "seed": 5}, {"uid": "seed-6", "seed": 6}], step=0)
        )
