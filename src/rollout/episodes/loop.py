"""Multi-step agent episodes as one token sequence each, run in lockstep across episodes.

Sequence layout per episode: ``[prompt][a1][o1][a2][o2]…[aN][oN]``. ``response_ids`` is
everything after the prompt; ``response_mask`` is 1 exactly on the tokens the model generated
(each action, the eos that ended it included) and 0 on observation tokens. The context of every
turn is ``prompt_ids + response_ids`` so far, as ids: the ids the model generated are the ids
trained on, never a re-tokenisation of decoded text.

Token budget: ``used`` counts ALL response tokens, actions and observations alike, so that
``len(response_ids) <= token_budget`` always holds and every sequence fits ``prompt + budget``
(what the trainer has to hold in memory). A turn generates at most ``min(turn_cap, budget -
used)`` tokens; observations are cut to the room left. When the budget is spent the episode ends
and is scored by sending ``submit`` to the environment:
* an action cut short by the budget (no eos, budget reached) is NOT executed, since half a command
  is not what the model meant; the env is submitted at once;
* an action cut by ``turn_cap`` alone is executed as it stands;
* after an observation that leaves no room, the env is submitted.

Reward = the final score (0.0 when the env reports none), minus ``baseline`` when given.

Episodes of different temperatures cannot share one ``engine.generate`` call (``SamplingParams``
carries one temperature), so each turn makes one call per distinct temperature; with a single
temperature every active episode generates its turn in one batched call. Per-episode token
limits differ, so a call asks for the largest limit and each output is cut to its own limit
(a prefix of an autoregressive sample is a sample of the shorter generation).

Prompts: an episode is one ChatML conversation held as token ids: the prompt is a system turn plus
a user turn (task description and first observation) ending in the assistant generation prompt;
each action is the model's assistant turn, ended by its eos ``<|im_end|>``; each observation is a
user turn followed by the next assistant generation prompt (``EpisodeTemplates``). Texts are kept
short because the default model is tiny (~2k positions). ``action_from_text`` reads the action
from a generated turn.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import cycle, islice
from typing import Any

from src.config.sampling import SamplingParams
from src.envs.base import EpisodeEnv
from src.rollout.engines.types import RolloutEngine
from src.rollout.rlvcr.steps import ACTION_OPEN, parse_step

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an agent working in a shell on a small coding task. Each reply is exactly ONE action: "
    "a single shell command, or `validate` to score your work, or `submit` to finish. "
    "Reply with the action only; the next message shows its output."
)
TASK_TEMPLATE = "{task}\n\nOBSERVATION:\n{observation}"
NEXT_STEP_TEMPLATE = "OBSERVATION:\n{observation}"
# ChatML turn boundaries around an observation: close the assistant turn (the model's eos already
# did when the action ended normally), open a user turn, then re-open the assistant turn.
TURN_OPEN = "\n<|im_start|>user\n"
TURN_CLOSE = "<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class EpisodeTemplates:
    """All texts an episode shows the model. ``{task}`` and ``{observation}`` are filled in."""

    system: str = SYSTEM_PROMPT
    task: str = TASK_TEMPLATE
    next_step: str = NEXT_STEP_TEMPLATE
    turn_open: str = TURN_OPEN
    turn_close: str = TURN_CLOSE

    def first_messages(self, task_prompt: str, observation: str) -> list[dict[str, str]]:
        """Chat messages of the episode prompt (system + user with the task and first observation)."""
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.task.format(task=task_prompt, observation=observation)},
        ]

    def observation_parts(self, observation: str) -> tuple[str, str, str]:
        """(head, body, tail) of an observation turn; only ``body`` may be cut to fit the budget."""
        head, _, tail = self.next_step.partition("{observation}")
        return self.turn_open + head, observation, tail + self.turn_close


def prompt_ids(tokenizer, templates: EpisodeTemplates, task_prompt: str, observation: str) -> list[int]:
    """Token ids of the episode prompt, chat-templated, ending with the assistant generation prompt."""
    out = tokenizer.apply_chat_template(
        templates.first_messages(task_prompt, observation),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(i) for i in out]


def stop_token_ids(tokenizer) -> list[int]:
    """Tokens that end an action: the eos and, when the vocabulary has it, ChatML's ``<|im_end|>``."""
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if i is not None)


_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def action_from_text(text: str) -> str:
    """The command in one generated turn ("" when there is none).

    In order: the ``<action>`` content of an RLVCR step (``<level>k</level><think>…</think>
    <action>CMD</action>``); the first fenced code block; else the first non-empty line. A
    command that opens a here-document (``cat > f << 'EOF'``) keeps its body up to the
    terminator line (or the end of the text), since that is still one shell command.
    """
    if ACTION_OPEN in text:
        action = parse_step(text, allow_unclosed_action=True).action
        if action:
            return action
    fence = _FENCE.search(text)
    if fence and fence.group(1).strip():
        text = fence.group(1)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip():
            return _with_heredoc(lines, i).strip()
    return ""


def _with_heredoc(lines: list[str], first: int) -> str:
    match = _HEREDOC.search(lines[first])
    if match is None:
        return lines[first]
    terminator = match.group(2)
    for j in range(first + 1, len(lines)):
        if lines[j].strip() == terminator:
            return "\n".join(lines[first : j + 1])
    return "\n".join(lines[first:])


EXIT_NOT_DONE = "not_done"  # submit after the budget ran out did not end the episode (env quirk)


@dataclass
class StepRecord:
    """One turn: ``response_ids[action_start:action_end]`` are the tokens the model generated.

    action_text: the command extracted by ``action_from_text`` (what the env received).
    generated_text: the decoded turn, special tokens kept.
    executed: False when the action was cut by the token budget and not sent to the env.
    """

    action_start: int
    action_end: int
    action_text: str
    generated_text: str
    executed: bool = True


@dataclass
class Episode:
    """One finished episode.

    response_mask: 1 on generated tokens, 0 on observation tokens; same length as response_ids.
    rollout_log_probs: per response token, the sampling log-prob (0.0 on observation tokens).
    score: the env's final score (None when it reported none); reward: score (or 0) − baseline.
    num_steps: actions sent to the env (the budget's closing ``submit`` is not counted).
    exit_status: the env's ``info["exit_status"]`` at the end (``"done"`` when it gives none).
    budget_exhausted: the token budget ended the episode (the env was submitted for it).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    reward: float
    score: float | None
    num_steps: int
    seed: int
    temperature: float
    exit_status: str
    steps: list[StepRecord]
    budget_exhausted: bool
    rollout_log_probs: list[float] = field(default_factory=list)
    final_observation: str = ""

    @property
    def n_action_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def n_observation_tokens(self) -> int:
        return len(self.response_mask) - sum(self.response_mask)


def observation_tokens(
    tokenizer, templates: EpisodeTemplates, observation: str, room: int, close_turn: bool
) -> list[int]:
    """Ids of one observation turn, at most ``room`` of them.

    ``close_turn`` prefixes the eos when the action did not end with it (cut by a token limit), so
    the assistant turn is still closed. When the turn does not fit, the observation body is cut
    first (the ChatML boundaries are kept); when even those do not fit, the ids are cut at ``room``.
    """
    if room <= 0:
        return []
    prefix = [tokenizer.eos_token_id] if close_turn else []
    head, body, tail = templates.observation_parts(observation)
    full = prefix + _encode(tokenizer, head + body + tail)
    if len(full) <= room:
        return full
    h, b, t = prefix + _encode(tokenizer, head), _encode(tokenizer, body), _encode(tokenizer, tail)
    keep = room - len(h) - len(t)
    return h + b[:keep] + t if keep >= 0 else full[:room]


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


class _Run:
    """Mutable state of one episode while it runs."""

    def __init__(self, env: EpisodeEnv, seed: int, temperature: float):
        self.env, self.seed, self.temperature = env, seed, temperature
        self.prompt: list[int] = []
        self.response: list[int] = []
        self.mask: list[int] = []
        self.logp: list[float] = []
        self.steps: list[StepRecord] = []
        self.done = False
        self.score: float | None = None
        self.exit_status = EXIT_NOT_DONE
        self.budget_exhausted = False
        self.num_steps = 0
        self.final_observation = ""
        self.pending: str | None = None  # action to send to the env this turn
        self.closed_turn = True  # the last action ended with a stop token

    def finish(self, observation: str, reward: float, done: bool, info: dict[str, Any]) -> None:
        self.done = True
        self.final_observation = observation
        if done:
            self.score = _as_score(info.get("score", reward))
            self.exit_status = str(info.get("exit_status") or "done")


def _as_score(value) -> float | None:
    return None if value is None else float(value)


@dataclass
class EpisodeSettings:
    """group_size: G episodes per seed; temperatures: one value, or a list (``collect_groups``:
    cycled over the G; ``run_episodes``: one per episode); token_budget: max response tokens
    (actions + observations) per episode; turn_cap: max generated tokens per action; baseline:
    subtracted from the final score; env_workers: threads for env reset/step (>1 overlaps the
    envs' subprocesses; keep 1 for envs that change the working directory, e.g. real MLGym)."""

    group_size: int = 4
    temperatures: float | list[float] = 1.0
    top_p: float = 1.0
    token_budget: int = 1024
    turn_cap: int = 128
    baseline: float | None = None
    env_workers: int = 1


def run_episodes(
    engine: RolloutEngine,
    tokenizer,
    envs: Sequence[EpisodeEnv],
    seeds: Sequence[int],
    settings: EpisodeSettings,
    templates: EpisodeTemplates | None = None,
) -> list[Episode]:
    """Run one episode per env, all in lockstep (see the module docstring). Envs are not closed.

    Args:
        envs / seeds: one env and its reset seed per episode (same length).
        settings: ``temperatures`` one value for all or one per episode; ``group_size`` unused.
    Returns:
        Episodes in env order.
    """
    token_budget, turn_cap = settings.token_budget, settings.turn_cap
    temps = episode_temperatures(settings.temperatures, len(envs), len(seeds))
    if token_budget < 1 or turn_cap < 1:
        raise ValueError(f"token_budget and turn_cap must be >= 1, got {token_budget}, {turn_cap}")
    templates = templates or EpisodeTemplates()
    runs = [_Run(env, int(seed), t) for env, seed, t in zip(envs, seeds, temps)]
    pool = ThreadPoolExecutor(max_workers=settings.env_workers) if settings.env_workers > 1 else None
    try:
        firsts = _map(pool, lambda r: r.env.reset(r.seed), runs)
        for run, (observation, _info) in zip(runs, firsts):
            run.prompt = prompt_ids(tokenizer, templates, run.env.task_prompt, observation)
        turn = _Turn(
            engine, tokenizer, templates, stop_token_ids(tokenizer), token_budget, turn_cap, settings.top_p
        )
        while any(not r.done for r in runs):
            _play_turn(turn, pool, [r for r in runs if not r.done])
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return [_to_episode(r, settings.baseline) for r in runs]


def episode_temperatures(temperatures: float | Sequence[float], n_envs: int, n_seeds: int) -> list[float]:
    """One temperature per episode (a single value is shared); ValueError on a length mismatch."""
    if n_envs != n_seeds:
        raise ValueError(f"run_episodes: {n_envs} envs but {n_seeds} seeds")
    one = isinstance(temperatures, (int, float))
    temps = [float(temperatures)] * n_envs if one else [float(t) for t in temperatures]
    if len(temps) != n_envs:
        raise ValueError(f"run_episodes: {n_envs} envs but {len(temps)} temperatures")
    return temps


@dataclass
class _Turn:
    """What every turn of a lockstep run shares."""

    engine: RolloutEngine
    tokenizer: Any
    templates: EpisodeTemplates
    stops: list[int]
    budget: int
    turn_cap: int
    top_p: float


def _play_turn(turn: _Turn, pool: ThreadPoolExecutor | None, active: list[_Run]) -> None:
    """Generate every active episode's action, step the envs, submit those out of budget."""
    _generate_turn(turn.engine, turn.tokenizer, active, turn.stops, turn.budget, turn.turn_cap, turn.top_p)
    stepping = [r for r in active if r.pending is not None]
    results = _map(pool, lambda r: r.env.step(r.pending), stepping)
    for run, result in zip(stepping, results):
        _absorb_observation(turn.tokenizer, turn.templates, run, result, turn.budget)
    closing = [r for r in active if not r.done and len(r.response) >= turn.budget]
    for run, result in zip(closing, _map(pool, lambda r: r.env.step("submit"), closing)):
        run.budget_exhausted = True
        run.finish(result[0], result[1], result[2], result[3])


def _map(pool: ThreadPoolExecutor | None, fn: Callable, items: list) -> list:
    return list(pool.map(fn, items)) if pool is not None and len(items) > 1 else [fn(x) for x in items]


def _generate_turn(
    engine, tokenizer, active: list[_Run], stops: list[int], budget: int, turn_cap: int, top_p: float
) -> None:
    """One batched generate call per distinct temperature; appends each action (mask 1)."""
    by_temp: dict[float, list[_Run]] = {}
    for run in active:
        by_temp.setdefault(run.temperature, []).append(run)
    for temperature, group in by_temp.items():
        limits = [min(turn_cap, budget - len(r.response)) for r in group]
        out = engine.generate(
            [r.prompt + r.response for r in group],
            SamplingParams(
                n_generations_per_prompt=1,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max(limits),
                stop_token_ids=stops,
            ),
        )
        logps = [lp[m.bool()].tolist() for lp, m in zip(out.log_probs, out.response_mask)]
        for run, tokens, logp, limit in zip(group, out.token_lists(), logps, limits):
            tokens, logp = tokens[:limit], logp[:limit]
            start = len(run.response)
            run.response += tokens
            run.mask += [1] * len(tokens)
            run.logp += [float(x) for x in logp]
            text = tokenizer.decode(tokens, skip_special_tokens=False)
            action = action_from_text(tokenizer.decode(tokens, skip_special_tokens=True))
            run.closed_turn = bool(tokens) and tokens[-1] in stops
            cut_by_budget = not run.closed_turn and len(run.response) >= budget
            run.steps.append(StepRecord(start, len(run.response), action, text, executed=not cut_by_budget))
            run.pending = None if cut_by_budget else action


def _absorb_observation(tokenizer, templates: EpisodeTemplates, run: _Run, result, budget: int) -> None:
    """Count the env step and append its observation (mask 0), cut to the room left."""
    observation, reward, done, info = result
    run.num_steps += 1
    run.pending = None
    ids = observation_tokens(
        tokenizer, templates, observation, budget - len(run.response), close_turn=not run.closed_turn
    )
    run.response += ids
    run.mask += [0] * len(ids)
    run.logp += [0.0] * len(ids)
    if done:
        run.finish(observation, reward, done, info)


def _to_episode(run: _Run, baseline: float | None) -> Episode:
    reward = (run.score if run.score is not None else 0.0) - (baseline or 0.0)
    return Episode(
        prompt_ids=run.prompt,
        response_ids=run.response,
        response_mask=run.mask,
        reward=reward,
        score=run.score,
        num_steps=run.num_steps,
        seed=run.seed,
        temperature=run.temperature,
        exit_status=run.exit_status,
        steps=run.steps,
        budget_exhausted=run.budget_exhausted,
        rollout_log_probs=run.logp,
        final_observation=run.final_observation,
    )


def group_temperatures(temperatures: float | Sequence[float], group_size: int) -> list[float]:
    """Temperature of each of the G members: one value for all, or a list cycled over them."""
    if isinstance(temperatures, (int, float)):
        return [float(temperatures)] * group_size
    temps = [float(t) for t in temperatures]
    if not temps:
        raise ValueError("temperatures is an empty list")
    return list(islice(cycle(temps), group_size))


def collect_groups(
    engine: RolloutEngine,
    tokenizer,
    env_factory: Callable[[], EpisodeEnv],
    seeds: Sequence[int],
    settings: EpisodeSettings,
    templates: EpisodeTemplates | None = None,
) -> list[list[Episode]]:
    """GRPO groups: for each seed, ``group_size`` episodes from that same env seed.

    All len(seeds) × G episodes run in one lockstep ``run_episodes``; every env is built by
    ``env_factory()`` and closed afterwards, also on error. Returns one list of G episodes per seed.
    """
    group_size = settings.group_size
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    temps = group_temperatures(settings.temperatures, group_size)
    envs: list[EpisodeEnv] = []
    try:
        for _ in range(len(seeds) * group_size):
            envs.append(env_factory())
        flat_seeds = [int(s) for s in seeds for _ in range(group_size)]
        per_episode = replace(settings, temperatures=temps * len(seeds))
        episodes = run_episodes(engine, tokenizer, envs, flat_seeds, per_episode, templates)
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:
                log.exception("closing an episode env failed")
    return [episodes[i * group_size : (i + 1) * group_size] for i in range(len(seeds))]
