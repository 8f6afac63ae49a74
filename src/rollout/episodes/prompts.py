"""Prompt templates for multi-step agent episodes, and how an action is read from generated text.

An episode is one ChatML conversation held as token ids: the prompt is a system turn plus a user
turn (task description and first observation) ending in the assistant generation prompt; each
action is the model's assistant turn, ended by its eos ``<|im_end|>``; each observation is a user
turn followed by the next assistant generation prompt (``observation_text``). Texts are kept short
because the default model is tiny (~2k positions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from src.rollout.rlvcr.format import ACTION_OPEN, parse_step

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
