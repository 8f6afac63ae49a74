"""EpisodeCollector -> RolloutBatch layout, the seed DataModule, and the config factory."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from src.config.job import compose_job
from src.datamodules.rlla_datamodule import SeedDataModule, seed_records
from src.envs import LocalGameConfig, LocalGameEnv
from src.models.module import position_ids
from src.rollout.batch import CollectRequest
from src.rollout.engines.hf import HFGenerateEngine
from src.rollout.engines.types import Completions
from src.rollout.episodes.collector import EpisodeCollector, EpisodeSettings
from src.rollout.factory import make_episode_collector

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class ScriptedEngine:
    """Every episode sends ``cat strategy.py`` on turn 1 and ``submit`` afterwards."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompt_ids, sampling):
        outs = []
        for p in prompt_ids:
            text = "cat strategy.py" if p.count(self.tok.eos_token_id) == 2 else "submit"
            outs.append(
                (self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id])[
                    : sampling.max_new_tokens
                ]
            )
        width = max(len(o) for o in outs)
        ids = torch.full((len(outs), width), self.tok.pad_token_id)
        mask = torch.zeros((len(outs), width), dtype=torch.long)
        for i, o in enumerate(outs):
            ids[i, : len(o)], mask[i, : len(o)] = torch.tensor(o), 1
        return Completions(ids, mask, -0.5 * mask.float())

    def update_weights(self, state_dict=None):
        pass


class TrackingFactory:
    def __init__(self):
        self.envs: list[LocalGameEnv] = []

    def __call__(self):
        env = LocalGameEnv(LocalGameConfig(simulations=100, max_steps=5, command_timeout_s=5.0))
        self.envs.append(env)
        return env


def test_collect_packs_episodes_into_a_rollout_batch(tiny):
    tok = tiny[1]
    factory = TrackingFactory()
    collector = EpisodeCollector(
        tok,
        ScriptedEngine(tok),
        factory,
        EpisodeSettings(group_size=2, token_budget=400, turn_cap=16, baseline=1.0),
    )
    records = [{"uid": "a", "seed": 5}, {"uid": "b", "seed": 6}]
    rb = collector.collect(CollectRequest(records, step=3))
    eps = rb.episodes
    assert len(rb) == 4 and rb.uids == ["a", "a", "b", "b"] and [e.seed for e in eps] == [5, 5, 6, 6]
    assert all(env.workspace is None for env in factory.envs) and len(factory.envs) == 4  # closed
    t = rb.response_mask.shape[1]
    assert t == max(len(e.response_ids) for e in eps) and rb.input_ids.shape[1] == rb.prompt_width + t
    for i, e in enumerate(eps):
        k, lp = len(e.response_ids), len(e.prompt_ids)
        assert rb.input_ids[i, rb.prompt_width - lp : rb.prompt_width].tolist() == e.prompt_ids
        assert rb.input_ids[i, rb.prompt_width : rb.prompt_width + k].tolist() == e.response_ids
        assert rb.response_mask[i, :k].tolist() == e.response_mask and rb.response_mask[i, k:].sum() == 0
        # the model attends to observations too; only padding is masked out
        assert rb.attention_mask[i].sum() == lp + k and rb.attention_mask[i, rb.prompt_width :][:k].all()
        assert torch.allclose(rb.rollout_log_probs[i, :k], -0.5 * torch.tensor(e.response_mask).float())
        assert e.exit_status == "submitted" and e.num_steps == 2
        assert rb.rewards[i] == pytest.approx(e.score - 1.0)
    row = rb.rows[0]
    assert row["uid"] == "a" and row["step"] == 3 and row["episode_steps"] == 2
    assert row["exit_status"] == "submitted"
    assert row["reward_task"] == row["episode_return"] == pytest.approx(eps[0].reward)
    assert row["n_action_tokens"] + row["n_observation_tokens"] == row["response_length"]
    assert math.isnan(row["reward_format"]) and math.isnan(row["reward_correctness"])
    assert row["actions"] == ["cat strategy.py", "submit"] and "def row_strategy" in row["response"]
    m = rb.metrics
    n_act = sum(e.n_action_tokens for e in eps)
    assert m["rollout/mask_fraction"] == pytest.approx(n_act / sum(len(e.response_ids) for e in eps))
    assert m["train/episode_return_mean"] == pytest.approx(float(rb.rewards.mean()))
    assert m["train/episode_steps_mean"] == 2.0
    assert {"timing/generation_s", "timing/scoring_s"} <= set(m)


class TemperatureRecordingEngine(ScriptedEngine):
    """The scripted engine that also records the temperature each prompt was sampled at."""

    def __init__(self, tok):
        super().__init__(tok)
        self.seen: list[tuple[int, float]] = []  # (prompt length at turn 1, temperature)

    def generate(self, prompt_ids, sampling):
        self.seen += [(p.count(self.tok.eos_token_id), sampling.temperature) for p in prompt_ids]
        return super().generate(prompt_ids, sampling)


def test_each_episode_row_carries_its_own_sampling_temperature(tiny):
    """Seed 001: a list of temperatures is cycled over each group; row i's temperature is the one its
    episode was sampled at (the module computes log-probs at it)."""
    tok = tiny[1]
    engine = TemperatureRecordingEngine(tok)
    settings = EpisodeSettings(group_size=3, temperatures=[0.7, 1.3], token_budget=400, turn_cap=16)
    rb = EpisodeCollector(tok, engine, TrackingFactory(), settings).collect(
        CollectRequest([{"uid": "a", "seed": 1}, {"uid": "b", "seed": 2}], step=0)
    )
    expected = [0.7, 1.3, 0.7] * 2
    assert rb.temperatures is not None and rb.temperatures.dtype == torch.float32
    torch.testing.assert_close(rb.temperatures, torch.tensor(expected))
    assert [e.temperature for e in rb.episodes] == pytest.approx(expected)
    # the engine really sampled every first turn at those temperatures (one call per temperature)
    firsts = sorted(t for n_eos, t in engine.seen if n_eos == 2)
    assert firsts == pytest.approx(sorted(expected))


def test_assembled_batch_reproduces_the_sampling_log_probs(tiny):
    """Teacher forcing the packed sequences (observations attended) gives the engine's log-probs."""
    model, tok = tiny
    engine = HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id])
    collector = EpisodeCollector(
        tok,
        engine,
        TrackingFactory(),
        EpisodeSettings(group_size=2, token_budget=80, turn_cap=16, env_workers=2),
    )
    torch.manual_seed(1)
    rb = collector.collect(CollectRequest([{"uid": 0, "seed": 9}], step=0))
    width = rb.response_mask.shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=rb.input_ids,
            attention_mask=rb.attention_mask,
            position_ids=position_ids(rb.attention_mask),
        ).logits[:, -width - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, rb.input_ids[:, -width:, None]).squeeze(-1)
    on = rb.response_mask.bool()
    assert on.any() and (~on & rb.attention_mask[:, -width:].bool()).any()  # observations present
    assert torch.allclose(logp[on], rb.rollout_log_probs[on], atol=2e-3)


def test_seed_datamodule_is_deterministic_list_batches():
    a, b = SeedDataModule(10, 4, seed=3), SeedDataModule(10, 4, seed=3)
    batches = list(a.train_dataloader())
    assert batches == list(b.train_dataloader())
    assert [len(x) for x in batches] == [4, 4, 2]
    flat = [r for x in batches for r in x]
    assert sorted(r["uid"] for r in flat) == list(range(10))
    assert all(isinstance(r["seed"], int) for r in flat) and len({r["seed"] for r in flat}) == 10
    assert seed_records(10, 3) != seed_records(10, 4)
    a.load_state_dict({"seed": 3, "epoch": 1})
    assert list(a.train_dataloader()) != batches  # a new epoch, a new order
    with pytest.raises(ValueError):
        SeedDataModule(0, 4)


def _compose(*overrides):
    return compose_job(["experiment=mlgym_grpo", *overrides], CONFIGS)


def test_factory_builds_the_local_collector_from_config(tiny):
    cfg = _compose("env.temperatures=[0.5,1.0]", "env.baseline=1.02")
    collector = make_episode_collector(cfg, tiny[1], ScriptedEngine(tiny[1]), module=None)
    s = collector.settings
    assert (s.group_size, s.token_budget, s.turn_cap, s.temperatures, s.baseline) == (
        cfg.sampling.n_generations_per_prompt,
        cfg.env.token_budget,
        cfg.env.turn_cap,
        [0.5, 1.0],
        1.02,
    )
    env = collector.env_factory()
    try:
        assert isinstance(env, LocalGameEnv) and env.config.simulations == cfg.env.simulations
        assert env.config.max_steps == cfg.env.max_steps
    finally:
        env.close()
    assert _compose("env=local_pd").env.id == "local/prisoners_dilemma"


def test_factory_rejects_unknown_env_keys(tiny):
    cfg = _compose("+env.bogus=1")
    with pytest.raises(KeyError, match="bogus"):
        make_episode_collector(cfg, tiny[1], ScriptedEngine(tiny[1]), module=None)


def test_env_mlgym_selects_the_real_adapter(tiny):
    cfg = _compose("env=mlgym")
    assert cfg.env.id == "mlgym/battleOfSexes"
    collector = make_episode_collector(cfg, tiny[1], ScriptedEngine(tiny[1]), module=None)
    try:
        import mlgym  # noqa: F401
    except ImportError:
        with pytest.raises((ImportError, RuntimeError), match="MLGymAdapter"):
            collector.env_factory()
    else:
        pytest.skip("mlgym is installed; building a container env is out of scope for a unit test")
