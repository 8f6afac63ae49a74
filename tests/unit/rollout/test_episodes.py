"""Multi-step episodes: action parsing, observation cutting, masks on real episodes, scripted rewards,
lockstep batching."""

from __future__ import annotations

import pytest
import torch

from src.config.sampling import SamplingParams
from src.envs import LocalGameConfig, LocalGameEnv
from src.rollout.engines.hf import HFGenerateEngine
from src.rollout.engines.types import Completions
from src.rollout.episodes.loop import (
    EpisodeSettings,
    EpisodeTemplates,
    action_from_text,
    collect_groups,
    group_temperatures,
    observation_tokens,
    run_episodes,
    stop_token_ids,
)

ALWAYS_ZERO = "cat > strategy.py << 'EOF'\ndef row_strategy(history):\n    return 0\nEOF"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _pad(outs: list[list[int]], pad_id: int) -> Completions:
    return Completions.from_token_lists(outs, pad_id)


class ScriptedEngine:
    """Answers turn k of every episode with ``script[k]`` (+ eos unless ``eos=False``) as token ids."""

    def __init__(self, tokenizer, script: list[str], eos: bool = True):
        self.tok, self.script, self.eos = tokenizer, script, eos
        self.calls: list[tuple[int, SamplingParams]] = []

    def turn_of(self, prompt: list[int]) -> int:
        # the prompt closes 2 turns (system, user); each action + observation closes 2 more
        return (prompt.count(self.tok.eos_token_id) - 2) // 2

    def generate(self, prompt_ids, sampling):
        self.calls.append((len(prompt_ids), sampling))
        outs = []
        for p in prompt_ids:
            text = self.script[min(self.turn_of(p), len(self.script) - 1)]
            eos = [self.tok.eos_token_id] if self.eos else []
            ids = self.tok.encode(text, add_special_tokens=False) + eos
            outs.append(ids[: sampling.max_new_tokens])
        return _pad(outs, self.tok.pad_token_id)

    def update_weights(self, state_dict=None):
        pass


class RecordingEngine:
    """Wraps a real engine and keeps every (context, generated ids) pair it produced."""

    def __init__(self, inner):
        self.inner = inner
        self.record: list[tuple[list[int], list[int]]] = []
        self.calls = 0

    def generate(self, prompt_ids, sampling):
        out = self.inner.generate(prompt_ids, sampling)
        self.calls += 1
        self.record += list(zip([list(p) for p in prompt_ids], out.token_lists()))
        return out

    def update_weights(self, state_dict=None):
        pass


def _env_factory(**overrides):
    cfg = LocalGameConfig(game="battle_of_sexes", simulations=200, max_steps=6, command_timeout_s=5.0)
    return lambda: LocalGameEnv(cfg, **overrides)


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny[1]


# ------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    "text, expected",
    [
        ("cat strategy.py\nsome junk after", "cat strategy.py"),
        ("\n\n   validate  \n", "validate"),
        ("I will look.\n```bash\nls -la\n```\ntrailing", "ls -la"),
        ("```\npython -c 'print(1)'", "python -c 'print(1)'"),
        ("<level>2</level><think>check file</think><action>cat strategy.py</action>junk", "cat strategy.py"),
        ("<level>1</level><action>submit", "submit"),
        (ALWAYS_ZERO + "\nmore junk", ALWAYS_ZERO),
        ("cat > f.py << EOF\nx = 1", "cat > f.py << EOF\nx = 1"),
        ("", ""),
        ("  \n \n", ""),
    ],
)
def test_action_from_text(text, expected):
    assert action_from_text(text) == expected


def test_observation_tokens_fit_the_room_and_keep_the_turn_boundaries(tok):
    t = EpisodeTemplates()
    full = observation_tokens(tok, t, "x " * 300, 10_000, close_turn=False)
    assert tok.decode(full).startswith("\n<|im_start|>user\nOBSERVATION:\n")
    assert tok.decode(full).endswith("<|im_end|>\n<|im_start|>assistant\n")
    for room in (0, 3, 25, 60, len(full) - 1):
        ids = observation_tokens(tok, t, "x " * 300, room, close_turn=True)
        assert len(ids) == min(room, len(full) + 1)
        if room >= 60:  # body cut, boundaries kept, the unfinished assistant turn closed first
            assert ids[0] == tok.eos_token_id
            assert tok.decode(ids).endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_group_temperatures_cycle():
    assert group_temperatures(0.7, 3) == [0.7, 0.7, 0.7]
    assert group_temperatures([0.5, 1.0], 5) == [0.5, 1.0, 0.5, 1.0, 0.5]
    with pytest.raises(ValueError):
        group_temperatures([], 2)


# ------------------------------------------------------------------ scripted episodes
def test_scripted_always_zero_then_submit_scores_about_1_44(tok):
    engine = ScriptedEngine(tok, [ALWAYS_ZERO, "submit"])
    env = LocalGameEnv(LocalGameConfig(game="battle_of_sexes", simulations=2000, max_steps=6))
    try:
        [ep] = run_episodes(
            engine, tok, [env], [7], EpisodeSettings(temperatures=1.0, token_budget=400, turn_cap=64)
        )
        [ep_b] = run_episodes(
            engine,
            tok,
            [env],
            [7],
            EpisodeSettings(temperatures=1.0, token_budget=400, turn_cap=64, baseline=1.0),
        )
    finally:
        env.close()
    assert ep.exit_status == "submitted" and not ep.budget_exhausted
    assert ep.num_steps == 2 and [s.action_text for s in ep.steps] == [ALWAYS_ZERO, "submit"]
    assert ep.score == pytest.approx(1.44, abs=0.05) and ep.reward == ep.score
    assert ep_b.reward == pytest.approx(ep_b.score - 1.0)
    # mask 1 exactly on the scripted ids (eos included), 0 on everything the env produced
    scripted = [tok.encode(s, add_special_tokens=False) + [tok.eos_token_id] for s in (ALWAYS_ZERO, "submit")]
    for step, ids in zip(ep.steps, scripted):
        assert ep.response_ids[step.action_start : step.action_end] == ids
    on = [i for i, m in enumerate(ep.response_mask) if m]
    assert on == [i for s in ep.steps for i in range(s.action_start, s.action_end)]
    assert "Final score" in ep.final_observation


def test_budget_ends_the_episode_without_running_a_cut_action(tok):
    # a long command with no eos: cut by turn_cap (40) it runs; cut by the budget it does not
    engine = ScriptedEngine(tok, ["echo " + "a b c d " * 40], eos=False)
    groups = collect_groups(
        engine,
        tok,
        _env_factory(),
        [3, 4],
        EpisodeSettings(group_size=1, temperatures=1.0, token_budget=150, turn_cap=40),
    )
    for ep in (g[0] for g in groups):
        assert ep.budget_exhausted and ep.exit_status == "submitted"
        assert ep.score > 0  # the starter strategy was submitted
        assert len(ep.response_ids) == 150 == len(ep.response_mask) == len(ep.rollout_log_probs)
        first = ep.steps[0]
        assert first.executed and first.action_end - first.action_start == 40
        # the cut action's turn is closed by an env-side eos (mask 0)
        assert ep.response_ids[40] == tok.eos_token_id and ep.response_mask[40] == 0
        assert ep.num_steps == sum(s.executed for s in ep.steps)
        last = ep.steps[-1]
        assert last.executed == (last.action_end < 150)

    [[ep]] = collect_groups(
        engine,
        tok,
        _env_factory(),
        [3],
        EpisodeSettings(group_size=1, temperatures=1.0, token_budget=30, turn_cap=64),
    )
    assert ep.budget_exhausted and ep.num_steps == 0 and len(ep.response_ids) == 30
    assert ep.response_mask == [1] * 30 and not ep.steps[0].executed and ep.exit_status == "submitted"


def test_same_seed_same_first_observation_and_lockstep_calls(tok):
    engine = ScriptedEngine(tok, ["cat strategy.py", "validate", "submit"])
    groups = collect_groups(
        engine,
        tok,
        _env_factory(),
        [11, 12],
        EpisodeSettings(group_size=3, temperatures=0.9, token_budget=600, turn_cap=32),
    )
    assert [len(g) for g in groups] == [3, 3]
    for g in groups:
        assert all(e.prompt_ids == g[0].prompt_ids for e in g)
        assert all(e.seed == g[0].seed for e in g)
        assert len({e.score for e in g}) == 1  # deterministic actions, one seed -> one score
    assert groups[0][0].prompt_ids != groups[1][0].prompt_ids
    # all 6 episodes advanced together: one call of 6 contexts per turn, 3 turns
    assert [n for n, _ in engine.calls] == [6, 6, 6]
    assert all(s.temperature == 0.9 and s.stop_token_ids == stop_token_ids(tok) for _, s in engine.calls)


def test_one_call_per_distinct_temperature(tok):
    engine = ScriptedEngine(tok, ["submit"])
    [group] = collect_groups(
        engine,
        tok,
        _env_factory(),
        [5],
        EpisodeSettings(group_size=3, temperatures=[0.5, 1.0], token_budget=200, turn_cap=8),
    )
    assert [e.temperature for e in group] == [0.5, 1.0, 0.5]
    assert sorted((n, s.temperature) for n, s in engine.calls) == [(1, 1.0), (2, 0.5)]


# ------------------------------------------------------------------ real model
def test_real_episode_masks_match_generated_ids(tiny):
    model, tok = tiny
    engine = RecordingEngine(HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id]))
    budget, cap = 120, 24
    torch.manual_seed(0)
    groups = collect_groups(
        engine,
        tok,
        _env_factory(),
        [1, 2],
        EpisodeSettings(group_size=2, temperatures=1.0, token_budget=budget, turn_cap=cap, env_workers=2),
    )
    episodes = [e for g in groups for e in g]
    contexts: dict[tuple, list[list[int]]] = {}
    for context, out in engine.record:
        contexts.setdefault(tuple(context), []).append(out)
    for ep in episodes:
        assert len(ep.response_ids) <= budget and len(ep.response_mask) == len(ep.response_ids)
        covered = set()
        for step in ep.steps:
            # the context of each turn was exactly prompt + response so far, and the kept ids are
            # a prefix of what the engine generated for it
            outs = contexts[tuple(ep.prompt_ids + ep.response_ids[: step.action_start])]
            kept = ep.response_ids[step.action_start : step.action_end]
            assert 1 <= len(kept) <= cap and any(out[: len(kept)] == kept for out in outs)
            assert all(ep.response_mask[i] == 1 for i in range(step.action_start, step.action_end))
            covered.update(range(step.action_start, step.action_end))
        # every other token is an observation token: mask 0, log-prob 0
        rest = [i for i in range(len(ep.response_ids)) if i not in covered]
        assert all(ep.response_mask[i] == 0 and ep.rollout_log_probs[i] == 0.0 for i in rest)
        assert "OBSERVATION:" in tok.decode([ep.response_ids[i] for i in rest])
        assert ep.exit_status in {"submitted", "autosubmitted", "forfeit", "evaluation_error"}
    # lockstep: 4 episodes share each generate call
    assert engine.calls == max(len(e.steps) for e in episodes)
