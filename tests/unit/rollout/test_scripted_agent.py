"""The scripted RLVCR agent: its steps parse at the levels it drew, its recorded ids are exactly what
the real episode loop feeds the model, and its episodes become SFT examples with labels on steps only."""

from __future__ import annotations

import functools
import random
from itertools import pairwise
from pathlib import Path

import pytest

from src.envs import make_env
from src.rollout.engines.types import Completions
from src.rollout.episodes.loop import EpisodeSettings, action_from_text, run_episodes, stop_token_ids
from src.rollout.episodes.scripted_agent import (
    IGNORE_INDEX,
    KIND_LEVELS,
    SUBMIT,
    THINKING,
    action_for,
    level_counts,
    plan_steps,
    scripted_episodes,
    thinking_for,
)
from src.rollout.rlvcr.augment import rlvcr_episode_templates
from src.rollout.rlvcr.steps import LEVELS, parse_step

REPO = Path(__file__).resolve().parents[3]
ENV = functools.partial(
    make_env,
    "local/battle_of_sexes",
    simulations=200,
    max_steps=3,
    command_timeout_s=5.0,
    max_output_chars=300,
)
BUDGET, CAP = 640, 128


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny[1]


@pytest.fixture(scope="module")
def episodes(tok):
    return scripted_episodes(
        ENV,
        tok,
        rlvcr_episode_templates(),
        8,
        seed=3,
        limits=EpisodeSettings(token_budget=BUDGET, turn_cap=CAP, env_workers=2),
    )


def _pad(outs: list[list[int]], pad_id: int) -> Completions:
    return Completions.from_token_lists(outs, pad_id)


class ReplayEngine:
    """Answers a context with the scripted target recorded for exactly that context. A context the
    agent never recorded gets a bare eos and is kept in ``unknown`` (the loop went somewhere else)."""

    def __init__(self, tokenizer, episodes):
        self.tok = tokenizer
        self.targets = {tuple(t.context_ids): t.target_ids for e in episodes for t in e.turns}
        self.seen: list[list[int]] = []
        self.unknown: list[list[int]] = []

    def generate(self, prompt_ids, sampling):
        outs = []
        for p in prompt_ids:
            self.seen.append(list(p))
            target = self.targets.get(tuple(p))
            if target is None:
                self.unknown.append(list(p))
                target = [self.tok.eos_token_id]
            outs.append(target[: sampling.max_new_tokens])
        return _pad(outs, self.tok.pad_token_id)

    def update_weights(self, state_dict=None):
        pass


def _replay(tok, episodes, budget, cap):
    engine = ReplayEngine(tok, episodes)
    envs = [ENV() for _ in episodes]
    try:
        real = run_episodes(
            engine,
            tok,
            envs,
            [e.seed for e in episodes],
            EpisodeSettings(temperatures=1.0, token_budget=budget, turn_cap=cap),
            rlvcr_episode_templates(),
        )
    finally:
        for env in envs:
            env.close()
    return engine, real


def kind_of(action: str) -> str:
    return next(k for k in KIND_LEVELS if action_for(k, 0) == action)


# ------------------------------------------------------------------ plan and texts
def test_plans_fit_max_steps_and_branch_on_what_the_context_shows():
    for max_steps in (1, 2, 3, 4, 8):
        for i in range(30):
            plan = plan_steps(random.Random(i), max_steps)
            assert len(plan) <= max(max_steps, 1) and plan[-1] == SUBMIT
            # validate follows the write exactly when two actions are left after it
            if "write" in plan:
                left = max_steps - plan.index("write") - 1
                assert ("validate" in plan) == (left >= 2), (max_steps, plan)


def test_thinking_grows_with_the_level(tok):
    for kind, texts in THINKING.items():
        lengths = [
            len(tok.encode(thinking_for(kind, k, "battle_of_sexes"), add_special_tokens=False))
            for k in LEVELS
        ]
        assert lengths[0] == 0 and lengths[1] < lengths[2] < lengths[3], (kind, lengths)
        assert set(texts) == {2, 3, 4}
    with pytest.raises(ValueError):
        thinking_for("write", 5, "battle_of_sexes")


# ------------------------------------------------------------------ recorded episodes
def test_steps_parse_at_the_levels_drawn(tok, episodes):
    stops = set(stop_token_ids(tok))
    for ep in episodes:
        assert ep.exit_status == "submitted" and not ep.budget_exhausted
        assert ep.score == pytest.approx(1.44, abs=0.1)  # the always-0 strategy was written and scored
        for turn in ep.turns:
            assert turn.target_ids[-1] == tok.eos_token_id
            text = tok.decode([t for t in turn.target_ids if t not in stops])
            parse = parse_step(text)
            assert not parse.malformed, (text, parse.reasons)
            assert (parse.level, parse.think, parse.action) == (turn.level, turn.think, turn.action)
            assert turn.level == turn.drawn_level  # nothing needed a budget downgrade at this budget
            assert action_from_text(text) == turn.action  # what the env receives
            assert len(turn.target_ids) <= CAP
            assert turn.level in KIND_LEVELS[kind_of(turn.action)]
    assert all(n > 0 for n in level_counts(episodes).values()), level_counts(episodes)  # all four levels


def test_deterministic_by_seed(tok, episodes):
    again = scripted_episodes(
        ENV,
        tok,
        rlvcr_episode_templates(),
        3,
        seed=3,
        limits=EpisodeSettings(token_budget=BUDGET, turn_cap=CAP),
    )
    for a, b in zip(again, episodes):
        assert (a.seed, a.prompt_ids, a.response_ids, a.response_mask) == (
            b.seed,
            b.prompt_ids,
            b.response_ids,
            b.response_mask,
        )
    other = scripted_episodes(
        ENV,
        tok,
        rlvcr_episode_templates(),
        3,
        seed=4,
        limits=EpisodeSettings(token_budget=BUDGET, turn_cap=CAP),
    )
    assert [e.seed for e in other] != [e.seed for e in again]
    with pytest.raises(ValueError):
        scripted_episodes(
            ENV,
            tok,
            rlvcr_episode_templates(),
            0,
            seed=3,
            limits=EpisodeSettings(token_budget=BUDGET, turn_cap=CAP),
        )


def test_contexts_equal_what_the_episode_loop_feeds_the_model(tok, episodes):
    engine, real = _replay(tok, episodes, BUDGET, CAP)
    assert engine.unknown == []
    recorded = [t.context_ids for e in episodes for t in e.turns]
    assert sorted(map(tuple, engine.seen)) == sorted(map(tuple, recorded))
    for ours, theirs in zip(episodes, real):
        assert ours.prompt_ids == theirs.prompt_ids
        assert ours.response_ids == theirs.response_ids and ours.response_mask == theirs.response_mask
        assert [t.action for t in ours.turns] == [s.action_text for s in theirs.steps]
        assert (ours.score, ours.exit_status, ours.budget_exhausted) == (
            theirs.score,
            theirs.exit_status,
            theirs.budget_exhausted,
        )


def test_tight_budget_cuts_observations_like_the_episode_loop(tok):
    # 330 tokens: the `cat strategy.py` output is cut to the room left and later steps are shortened
    # or dropped; every recorded turn is one the loop shows the model, with the same ids
    budget = 330
    eps = scripted_episodes(
        ENV,
        tok,
        rlvcr_episode_templates(),
        6,
        seed=11,
        limits=EpisodeSettings(token_budget=budget, turn_cap=CAP),
    )
    assert any(e.budget_exhausted for e in eps) and all(len(e.response_ids) <= budget for e in eps)
    assert any(t.level < t.drawn_level for e in eps for t in e.turns)  # a step rewritten shorter to fit
    engine, real = _replay(tok, eps, budget, CAP)
    assert {tuple(t.context_ids) for e in eps for t in e.turns} <= set(map(tuple, engine.seen))
    for ours, theirs in zip(eps, real):
        assert theirs.response_ids[: len(ours.response_ids)] == ours.response_ids
        # where no step fitted, the loop still asks the model (and gets a bare eos here): it goes on alone
        strayed = any(u[: len(ours.prompt_ids)] == ours.prompt_ids for u in engine.unknown)
        if not strayed:
            assert (theirs.response_ids, theirs.score, theirs.budget_exhausted) == (
                ours.response_ids,
                ours.score,
                ours.budget_exhausted,
            )


def test_sft_example_labels_only_the_steps(episodes):
    for ep in episodes:
        ids, labels = ep.sft_example()
        assert len(ids) == len(labels) == len(ep.prompt_ids) + len(ep.response_ids)
        labelled = [i for i, y in enumerate(labels) if y != IGNORE_INDEX]
        spans = []
        for turn in ep.turns:
            start = len(turn.context_ids)
            assert ids[:start] == turn.context_ids  # each context is a prefix of the sequence
            assert ids[start : start + len(turn.target_ids)] == turn.target_ids
            spans += range(start, start + len(turn.target_ids))
        assert labelled == spans
        assert all(labels[i] == ids[i] for i in labelled)


# ------------------------------------------------------------------ the warm start's data and schedule
def test_episode_sft_examples_from_the_rlvcr_experiment(tok, tmp_path):
    from src.config.job import compose_job
    from src.jobs.sft import episode_sft_examples

    cfg = compose_job(
        ["experiment=rlvcr", "sft.episodes=3", f"run_dir={tmp_path}", f"cache_dir={tmp_path}"],
        REPO / "configs",
    )
    assert cfg.model.warm_start == "rlvcr_sft" and cfg.algorithm.rlvcr_score_malformed_steps is False
    examples = episode_sft_examples(cfg, tok)
    assert len(examples) == 3
    for ex in examples:
        assert len(ex["input_ids"]) <= cfg.sft.max_length
        n_target = sum(y != IGNORE_INDEX for y in ex["labels"])
        assert 0 < n_target < len(ex["input_ids"]) // 2


def test_warmup_cosine_schedule():
    from src.jobs.sft import warmup_cosine

    total = 200
    m = [warmup_cosine(s, total) for s in range(total + 5)]
    warm = total // 20
    assert m[warm - 1] == pytest.approx(1.0) and m[0] == pytest.approx(1 / warm)
    assert all(a <= b for a, b in pairwise(m[:warm]))  # rising during the warm-up
    assert all(a >= b for a, b in pairwise(m[warm - 1 :]))  # then falling
    assert m[total] == pytest.approx(0.0, abs=1e-9) and m[-1] == pytest.approx(0.0, abs=1e-9)
