"""The multi-step environment protocol that episode collection is written against.

An episode: ``obs, info = env.reset(seed)``; then ``obs, reward, done, info = env.step(action)``
until ``done``. Actions and observations are plain text. The reward is 0.0 on every step except
the last, where it is the episode's final score (also in ``info["score"]``). ``task_prompt`` is
the task description the agent must be shown (system/user prompt); the first observation is kept
short because it is appended to that prompt.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

# info["exit_status"] values on the final step of an episode.
EXIT_SUBMITTED = "submitted"  # the agent sent `submit`; info["score"] is the evaluation score
EXIT_AUTOSUBMITTED = "autosubmitted"  # the step limit was reached; the current solution was scored
EXIT_FORFEIT = "forfeit"  # the agent sent `exit` / `exit_forfeit`; score 0.0
EXIT_EVALUATION_ERROR = "evaluation_error"  # submit/autosubmit failed to evaluate; score 0.0


@runtime_checkable
class EpisodeEnv(Protocol):
    """Text environment for multi-step agent episodes (local games, real MLGym)."""

    task_prompt: str  # the task description to show the agent; set by reset() at the latest

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Start a fresh episode; the same seed gives the same first observation and opponent."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply one action; returns (observation, reward, done, info)."""
        ...

    def close(self) -> None:
        """Release resources (workspace, container). Safe to call twice."""
        ...
