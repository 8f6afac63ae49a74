"""The steps of collected episodes as RLVCR scores them: parse, level, and the generated action ids.

The action is scored as the ids the policy generated (a slice of the episode's ``response_ids``),
never as a re-tokenisation of its decoded text: decode -> encode can merge or split tokens
differently (token drift), and the log-probs the scorer compares would then be of ids the policy
never produced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from src.rollout.rlvcr.format import ACTION_OPEN, LEVELS, THINK_CLOSE, StepParse, action_span, parse_step
from src.rollout.rlvcr.prompts import level_tag

Encode = Callable[[str], list[int]]


@dataclass
class TagIds:
    """Token ids of the tags, each tokenised on its own (``score_level_groups`` needs this)."""

    action: list[int]
    levels: list[list[int]]
    stop: list[int] = field(default_factory=list)


def tag_ids(encode: Encode) -> TagIds:
    """Tag ids; single-token ``<action>`` / ``</think>`` become stop ids for the alternative-thinking
    generation (multi-token tags rely on max_new_tokens and truncation)."""
    action = encode(ACTION_OPEN)
    stop = [ids[0] for ids in (action, encode(THINK_CLOSE)) if len(ids) == 1]
    return TagIds(action=action, levels=[encode(level_tag(k)) for k in LEVELS], stop=stop)


@dataclass
class ActionTokens:
    """The generated ids of one step's action.

    action_ids: ``turn_ids[start:end]`` exactly; prefix_ids: the context that goes between a
    thinking context and the action (the ``<action>`` tag, or the part of it the action's first
    token does not already hold).
    """

    prefix_ids: list[int]
    action_ids: list[int]
    start: int
    end: int


def decode_with_offsets(
    tokenizer, ids: Sequence[int], drop_ids: set[int]
) -> tuple[str, list[tuple[int, int]]]:
    """Text of ``ids`` without ``drop_ids`` and each id's character span in it (dropped ids: empty)."""
    kept: list[int] = []
    offsets, end = [], 0
    for t in ids:
        if t in drop_ids:
            offsets.append((end, end))
            continue
        kept.append(int(t))
        new_end = len(tokenizer.decode(kept, skip_special_tokens=False))
        offsets.append((end, max(end, new_end)))
        end = max(end, new_end)
    return tokenizer.decode(kept, skip_special_tokens=False), offsets


def action_char_span(text: str, env_action: str) -> tuple[int, int, int | None] | None:
    """(content start, content end, ``<action>`` tag start or None) of the step's action in ``text``:
    the tagged action, else the command the env received where the text holds it."""
    span = action_span(text)
    if span is not None:
        return span[0], span[1], span[0] - len(ACTION_OPEN)
    action = env_action.strip()
    at = text.find(action) if action else -1
    return None if at < 0 else (at, at + len(action), None)


def generated_action_tokens(
    text: str, offsets: list[tuple[int, int]], turn_ids: Sequence[int], env_action: str, encode: Encode
) -> ActionTokens | None:
    """The generated ids whose characters overlap the action (None when there are none, or when the
    first one reaches back before the ``<action>`` tag, so no prefix can be put before it)."""
    where = action_char_span(text, env_action)
    if where is None:
        return None
    lo, hi, tag_at = where
    hits = [i for i, (a, b) in enumerate(offsets) if b > a and a < hi and b > lo]
    if not hits:
        return None
    first_char = offsets[hits[0]][0]
    if tag_at is None:
        prefix = encode(ACTION_OPEN)
    elif first_char < tag_at:
        return None
    else:
        prefix = encode(text[tag_at:first_char])
    start, end = hits[0], hits[-1] + 1
    return ActionTokens(prefix, [int(t) for t in turn_ids[start:end]], start, end)


@dataclass
class StepRef:
    """One step of one episode, as the augmenter sees it.

    parse: the step's parse (its declared level feeds the metrics).
    level / think: what is scored: the step's level (None = not scorable) and its own thinking.
    action: the generated action ids (None when the turn holds no action).
    executed: False for a turn the token budget cut off (never sent to the env): it is neither
        scored nor counted as malformed; its tokens carry the trajectory advantage.
    """

    row: int
    start: int
    end: int
    parse: StepParse
    history_ids: list[int]
    level: int | None
    think: str
    action: ActionTokens | None
    executed: bool = True


def scored_step(parse: StepParse, env_action: str, score_malformed: bool) -> tuple[int | None, str, str]:
    """(level, thinking, action) to score for one step; level None when the step is not scorable.

    A well-formed step is scored as written. A malformed one only with ``score_malformed``: the
    declared level when it parses (else 1), its thinking for levels > 1, and its action (else the
    command the env received); without any action it is not scorable.
    """
    if not parse.malformed:
        return parse.level, parse.think, parse.action
    action = parse.action or env_action.strip()
    if not score_malformed or not action:
        return None, "", ""
    level = parse.level or 1
    return level, (parse.think if level > 1 else ""), action


@dataclass
class StepReader:
    """Turns an episode's steps into :class:`StepRef` (parse, scored level, generated action ids)."""

    tokenizer: Any
    drop_ids: set[int]
    encode: Encode
    allow_unclosed_action: bool = True
    score_malformed: bool = False

    def read(self, row: int, episode: Any, width: int) -> list[StepRef]:
        prompt, response = list(episode.prompt_ids), [int(t) for t in episode.response_ids]
        return [self.read_step(row, j, st, prompt, response, width) for j, st in enumerate(episode.steps)]

    def read_step(
        self, row: int, j: int, st: Any, prompt: list[int], response: list[int], width: int
    ) -> StepRef:
        if not 0 <= st.action_start <= st.action_end <= min(len(response), width):
            raise ValueError(
                f"RLVCR: episode {row} step {j}: token span [{st.action_start}, {st.action_end}) "
                f"is outside its {len(response)} response tokens (batch width {width})"
            )
        turn = response[st.action_start : st.action_end]
        # the turn's own ids, decoded without its stop token (generated_text keeps it)
        text, offsets = decode_with_offsets(self.tokenizer, turn, self.drop_ids)
        parse = parse_step(text, allow_unclosed_action=self.allow_unclosed_action)
        level, think, action = scored_step(parse, st.action_text, self.score_malformed)
        tokens = generated_action_tokens(text, offsets, turn, action, self.encode) if level else None
        history = prompt + response[: st.action_start]
        executed = bool(getattr(st, "executed", True))
        return StepRef(row, st.action_start, st.action_end, parse, history, level, think, tokens, executed)
