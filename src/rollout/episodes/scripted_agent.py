"""A scripted agent that plays local game episodes in the RLVCR step format, for SFT warm starts.

Each step is ``<level>k</level><think>…</think><action>CMD</action>``. The plan is a sensible one
for the local games: maybe read ``strategy.py``, overwrite it with the best constant move for the
game (always 0 in battle of the sexes, always defect in the prisoner's dilemma), ``validate`` when
actions are left for it, then ``submit``. The level is drawn from the step's ``KIND_LEVELS``:
reading, writing and validating think at level 2, 3 or 4 (uniformly), submitting acts at once
(level 1); higher levels think longer, in this module's own words.

The agent plays the real environment and records the exact ids the policy would see, built with
the same helpers as ``episodes.run_episodes`` (``prompt_ids``, ``observation_tokens``) and under the
same token budget rules, so the SFT data cannot drift from what RL feeds the model:

* turn t's context is ``prompt_ids + response_ids`` so far; its target is the encoded step + eos;
* a step longer than ``min(turn_cap, budget left)`` is rewritten at a lower level of its kind (its
  thinking is shorter); when none fits, the env is submitted (what ``run_episodes`` does once the
  budget is spent) and the turn is not recorded (``run_episodes`` would still show the model that
  context and cut what it writes, so the recorded turns are exactly the ones it would complete; a
  ``turn_cap`` too small for a plain level-1 step, ~40 tokens for the heredoc, is not supported);
* observations are cut to the room left; once the budget is spent the env is submitted.

Deterministic by seed: episode i draws its env seed, plan and levels from ``random.Random`` seeded
by ``(seed, i)``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from src.envs.base import EpisodeEnv
from src.rollout.episodes.loop import (
    EXIT_NOT_DONE,
    EpisodeSettings,
    EpisodeTemplates,
    observation_tokens,
    prompt_ids,
)
from src.rollout.rlvcr.steps import LEVELS, format_step

log = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label of tokens that are context, not target

# The constant move that beats the starter strategy in each local game (see envs/games.py).
BEST_MOVE = {"battle_of_sexes": 0, "prisoners_dilemma": 1}
# Why that move is good, one clause the thinking texts reuse.
MOVE_REASON = {
    "battle_of_sexes": "the partner copies my first move",
    "prisoners_dilemma": "defecting never pays less",
}

INSPECT, WRITE, VALIDATE, SUBMIT = "inspect", "write", "validate", "submit"

# The levels a plan step draws from (uniformly). Whether a step thinks is fixed by its kind, and the
# plan's branch points are readable from the context (see ``plan_steps``), because the tiny model,
# measured after SFT, ignores the level digit it has just written when it picks <think> or <action>
# right after ``</level>`` (same probabilities for k = 1..4) but follows the context. So: reading,
# writing and validating are decisions (level 2, 3 or 4); submitting is routine (level 1).
KIND_LEVELS: dict[str, tuple[int, ...]] = {
    INSPECT: (2, 3, 4),
    WRITE: (2, 3, 4),
    VALIDATE: (2, 3, 4),
    SUBMIT: (1,),
}


def write_command(move: int) -> str:
    """The heredoc that makes ``strategy.py`` always play ``move``."""
    return f"cat > strategy.py << 'EOF'\ndef row_strategy(history):\n    return {move}\nEOF"


def action_for(kind: str, move: int) -> str:
    """The shell command / keyword of a plan step."""
    commands = {
        INSPECT: "cat strategy.py",
        WRITE: write_command(move),
        VALIDATE: "validate",
        SUBMIT: "submit",
    }
    if kind not in commands:
        raise ValueError(f"unknown plan step {kind!r}; expected one of {list(commands)}")
    return commands[kind]


# Thinking text per (plan step, level); {move} and {reason} are filled in. Kept short and few
# because a tiny model has to learn them: level 2 is a short sentence (~10 tokens), level 3 a line
# of reasoning (~25), level 4 the goal, the options and a choice (~50). Every kind has all levels
# so that ``KIND_LEVELS`` can be changed freely.
THINKING: dict[str, dict[int, str]] = {
    INSPECT: {
        2: "First I read the strategy.",
        3: "Before changing anything I read strategy.py to see the function to keep.",
        4: "Goal: a high payoff with few actions. I could write at once, but reading strategy.py first "
        "shows what to keep.",
    },
    WRITE: {
        2: "I make it always play {move}.",
        3: "The starter mixes its moves, but {reason}, so I always play {move}.",
        4: "Goal: the best payoff. Options: keep the starter, or always play one move. Since {reason}, "
        "I write always {move}.",
    },
    VALIDATE: {
        2: "Check the score first.",
        3: "The new strategy is written. Validation scores it and the episode goes on.",
        4: "A typo would cost the episode. Options: submit now, or validate first. Validation shows "
        "the score for one action, so I validate.",
    },
    SUBMIT: {
        2: "The strategy is ready.",
        3: "Always {move} should beat the starter, so I submit.",
        4: "Goal check: strategy.py plays {move} always and {reason}. More actions would not raise the "
        "score, so I submit.",
    },
}


def plan_steps(rng: random.Random, max_steps: int) -> list[str]:
    """The plan of one episode: [inspect?] write [validate] submit, at most ``max_steps`` long.

    Reading first is a coin flip (the thinking says why); validating follows the write whenever at
    least two actions are left after it, so the step after a write can be told from the
    observation's ``[N actions left]``. Too long a plan drops inspect, then write; with
    ``max_steps`` < 2 it is just ``submit``.
    """
    plan = ([INSPECT] if rng.random() < 0.5 else []) + [WRITE]
    if max_steps < len(plan) + 1:
        plan = [WRITE] if max_steps >= 2 else []
    if max_steps - len(plan) >= 2:
        plan.append(VALIDATE)
    return plan + [SUBMIT]


def thinking_for(kind: str, level: int, game: str) -> str:
    """Thinking text of a ``kind`` step at ``level`` in ``game`` ("" for level 1)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {list(LEVELS)}, got {level!r}")
    if level == 1:
        return ""
    return THINKING[kind][level].format(
        move=BEST_MOVE.get(game, 0), reason=MOVE_REASON.get(game, "it is safe")
    )


@dataclass(frozen=True)
class ScriptedTurn:
    """One recorded turn: ``context_ids`` is what the policy sees, ``target_ids`` what it should write
    (``text`` encoded, plus the eos). ``drawn_level`` is the level drawn before any budget downgrade."""

    level: int
    drawn_level: int
    think: str
    action: str
    text: str
    context_ids: list[int]
    target_ids: list[int]


@dataclass
class ScriptedEpisode:
    """One scripted episode as ``run_episodes`` would hold it (same prompt / response / mask layout)."""

    seed: int
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    turns: list[ScriptedTurn] = field(default_factory=list)
    score: float | None = None
    exit_status: str = EXIT_NOT_DONE
    budget_exhausted: bool = False

    def sft_example(self) -> tuple[list[int], list[int]]:
        """(input_ids, labels) of the whole episode: labels are the ids on generated tokens and
        ``IGNORE_INDEX`` elsewhere. Equivalent to every (context, target) turn at once, since each
        context is a prefix of the sequence."""
        ids = self.prompt_ids + self.response_ids
        labels = [IGNORE_INDEX] * len(self.prompt_ids)
        labels += [t if m else IGNORE_INDEX for t, m in zip(self.response_ids, self.response_mask)]
        return ids, labels


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _fitting_step(
    tokenizer, kind: str, drawn: int, move: int, game: str, room: int
) -> tuple[int, str, str, list[int]] | None:
    """(level, think, text, target ids) of the highest level of the kind's ``KIND_LEVELS`` that is
    <= ``drawn`` and whose ids fit ``room``; None when none fits."""
    action = action_for(kind, move)
    for level in sorted((k for k in KIND_LEVELS[kind] if k <= drawn), reverse=True):
        think = thinking_for(kind, level, game)
        text = format_step(level, think, action)
        ids = _encode(tokenizer, text) + [tokenizer.eos_token_id]
        if len(ids) <= room:
            return level, think, text, ids
    return None


def play_episode(
    env: EpisodeEnv,
    tokenizer,
    templates: EpisodeTemplates,
    env_seed: int,
    limits: EpisodeSettings,
    rng: random.Random,
    game: str | None = None,
) -> ScriptedEpisode:
    """Play one scripted episode on ``env`` (reset with ``env_seed``); the env is not closed.

    ``limits``: the episode loop's ``token_budget`` and ``turn_cap`` (the rest is unused).

    ``game`` picks the strategy to write (``BEST_MOVE``); None = the env's own game (``env.game.name``).
    """
    token_budget, turn_cap = limits.token_budget, limits.turn_cap
    observation, info = env.reset(env_seed)
    ep = ScriptedEpisode(
        seed=env_seed, prompt_ids=prompt_ids(tokenizer, templates, env.task_prompt, observation)
    )
    game = game or getattr(getattr(env, "game", None), "name", "")
    move = BEST_MOVE.get(game, 0)
    done = False
    for kind in plan_steps(rng, int(info.get("max_steps", 1 << 30))):
        drawn = rng.choice(KIND_LEVELS[kind])
        room = min(turn_cap, token_budget - len(ep.response_ids))
        step = _fitting_step(tokenizer, kind, drawn, move, game, room)
        if step is None:
            break  # no level of this kind fits: the budget is spent (submitted below)
        level, think, text, target = step
        ep.turns.append(
            ScriptedTurn(
                level, drawn, think, action_for(kind, move), text, ep.prompt_ids + ep.response_ids, target
            )
        )
        ep.response_ids += target
        ep.response_mask += [1] * len(target)
        observation, _reward, done, info = env.step(action_for(kind, move))
        obs_ids = observation_tokens(
            tokenizer, templates, observation, token_budget - len(ep.response_ids), close_turn=False
        )
        ep.response_ids += obs_ids
        ep.response_mask += [0] * len(obs_ids)
        if done or len(ep.response_ids) >= token_budget:
            break
    if not done:  # the plan ends with submit, so only the budget stops it early: score what is there
        ep.budget_exhausted = True
        _observation, _reward, done, info = env.step("submit")
    if done:
        score = info.get("score")
        ep.score = None if score is None else float(score)
        ep.exit_status = str(info.get("exit_status") or "done")
    return ep


def scripted_episodes(
    env_factory: Callable[[], EpisodeEnv],
    tokenizer,
    templates: EpisodeTemplates,
    n_episodes: int,
    seed: int,
    limits: EpisodeSettings,
    game: str | None = None,
) -> list[ScriptedEpisode]:
    """``n_episodes`` scripted episodes, deterministic by ``seed``; each env is built by
    ``env_factory()`` and closed afterwards. ``limits``: ``token_budget``, ``turn_cap`` and
    ``env_workers`` (threads that overlap the envs' subprocesses) of the episode loop."""
    token_budget, turn_cap, workers = limits.token_budget, limits.turn_cap, limits.env_workers
    if n_episodes < 1:
        raise ValueError(f"n_episodes must be >= 1, got {n_episodes}")
    if token_budget < 1 or turn_cap < 1:
        raise ValueError(f"token_budget and turn_cap must be >= 1, got {token_budget}, {turn_cap}")

    def one(i: int) -> ScriptedEpisode:
        rng = random.Random(f"scripted-agent/{seed}/{i}")
        env = env_factory()
        try:
            return play_episode(env, tokenizer, templates, rng.randrange(2**31 - 1), limits, rng, game)
        finally:
            env.close()

    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            episodes = list(pool.map(one, range(n_episodes)))
    else:
        episodes = [one(i) for i in range(n_episodes)]
    log.info(
        "scripted episodes: %d episodes, %d steps, level counts %s",
        len(episodes),
        sum(len(e.turns) for e in episodes),
        level_counts(episodes),
    )
    return episodes


def level_counts(episodes: Sequence[ScriptedEpisode]) -> dict[int, int]:
    """How many recorded turns use each level."""
    levels = [t.level for e in episodes for t in e.turns]
    return {k: levels.count(k) for k in LEVELS}
