"""The trusted scorer: turns the moves reported by the sandboxed strategy process into a score.

The agent's strategy is imported only inside the sandbox (``games.py`` run as a script), which
reports the row and column moves of every game. Everything here runs in the trainer's process:

* the result line must appear exactly once and be well-formed JSON holding exactly the expected
  keys, with move strings of the exact length made of '0'/'1' only;
* the opponent is replayed from the seed against the reported row moves; the reported column
  moves must equal the replay (a strategy that rewired the opponent, ``play_game`` or
  ``simulate`` in its own process is caught here);
* the score is computed here from the payoff table and must be finite and within the game's
  payoff range.

Any violation raises ``ScoreRejected`` with a message the agent can read; it never becomes a reward.
"""

from __future__ import annotations

import hashlib
import json
import math
import random

from src.envs.games import RESULT_TAG, GameSpec

_MOVES = frozenset("01")


class ScoreRejected(ValueError):
    """The sandboxed evaluator's report cannot be trusted or scored."""


def parse_runner_result(output: str, nonce: str) -> dict:
    """The one result payload in the runner's output: {"rows", "cols"} or {"error"}."""
    prefix = f"{nonce} {RESULT_TAG} "
    lines = [line[len(prefix) :] for line in output.splitlines() if line.startswith(prefix)]
    if not lines:
        raise ScoreRejected("the evaluator stopped without a result")
    if len(lines) > 1:
        raise ScoreRejected(f"the evaluator reported {len(lines)} results instead of one (forged output?)")
    try:
        payload = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise ScoreRejected(f"the evaluator's result is not valid JSON ({exc.msg})") from exc
    if not isinstance(payload, dict) or set(payload) not in ({"rows", "cols"}, {"error"}):
        keys = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise ScoreRejected(f"the evaluator's result has unexpected content {keys}; expected rows and cols")
    return payload


def _check_moves(name: str, moves: object, expected_len: int) -> str:
    if not isinstance(moves, str) or len(moves) != expected_len or not set(moves) <= _MOVES:
        got = f"length {len(moves)}" if isinstance(moves, str) else type(moves).__name__
        raise ScoreRejected(
            f"the evaluator reported malformed {name} ({got}; expected {expected_len} moves 0/1)"
        )
    return moves


def payoff_range(game: GameSpec) -> tuple[float, float]:
    """Lowest and highest row payoff of one round."""
    values = [cell[0] for row in game.payoffs for cell in row]
    return min(values), max(values)


def replay_score(
    game: GameSpec, rows: object, cols: object, rounds: int, simulations: int, seed: int
) -> float:
    """Score reported row moves against the opponent replayed from ``seed``.

    rows, cols: strings of length ``rounds * simulations`` ('0'/'1'), game after game.
    Returns the row player's mean payoff per round; raises ``ScoreRejected`` when the report is
    malformed or its column moves differ from the replay.
    """
    n = rounds * simulations
    rows = _check_moves("row moves", rows, n)
    cols = _check_moves("partner moves", cols, n)
    rng = random.Random(seed)
    total = 0.0
    for g in range(simulations):
        history: list[tuple[int, int]] = []
        for r in range(rounds):
            i = g * rounds + r
            col = game.opponent(history, rng)
            if str(col) != cols[i]:
                raise ScoreRejected(
                    f"the partner's moves reported from the strategy's process differ from the scorer's "
                    f"replay (game {g + 1}, round {r + 1}): the strategy tampered with the game"
                )
            history.append((int(rows[i]), col))
        total += sum(game.payoffs[row][col][0] for row, col in history) / rounds
    return checked_score(total / simulations, game)


def checked_score(score: float, game: GameSpec) -> float:
    """``score`` if it is finite and a possible mean payoff of ``game``; else ``ScoreRejected``."""
    low, high = payoff_range(game)
    if not isinstance(score, (int, float)) or not math.isfinite(score):
        raise ScoreRejected(f"score {score!r} is not a finite number")
    if not low - 1e-9 <= score <= high + 1e-9:
        raise ScoreRejected(f"score {score!r} is outside the game's payoff range [{low}, {high}]")
    return float(score)


class StrategyFailed(ValueError):
    """The agent's strategy failed (did not load, raised, returned a bad move): the message says why."""


def partner_seed(episode_seed: int) -> int:
    """The partner's seed for an episode: derived here from the episode seed and a key that is
    neither in the sandbox nor in any observation, so the agent cannot replay the partner."""
    digest = hashlib.sha256(_PARTNER_KEY + str(int(episode_seed)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


_PARTNER_KEY = b"toolrouter/partner-stream/v1:"


def partner_streams(episode_seed: int, simulations: int) -> list[random.Random]:
    """One partner random stream per game, all derived from ``partner_seed(episode_seed)``."""
    base = partner_seed(episode_seed)
    return [random.Random(base * 1_000_003 + g) for g in range(simulations)]


def score_interactively(
    game: GameSpec, recv, send, rounds: int, simulations: int, rngs: list[random.Random]
) -> float:
    """Play ``simulations`` games of ``rounds`` rounds side by side against the sandboxed strategy
    (see ``games.relay_to_scorer``): each round, read the row moves of all games, then draw
    the partner's moves here (game ``g`` from ``rngs[g]``) and send them. Returns the row player's
    mean payoff per round over all games.

    Raises ``StrategyFailed`` with the strategy's error, ``ScoreRejected`` on anything malformed.
    """
    _expect_ready(recv())
    histories: list[list[tuple[int, int]]] = [[] for _ in range(simulations)]
    for r in range(rounds):
        line = recv()
        if line.startswith("E "):
            raise StrategyFailed(_error_text(line))
        if len(line) != simulations or not set(line) <= _MOVES:
            raise ScoreRejected(
                f"the evaluator sent {line[:40]!r} (length {len(line)}) in round {r + 1}; "
                f"expected {simulations} moves 0/1"
            )
        cols = [game.opponent(h, rng) for h, rng in zip(histories, rngs)]
        send("".join(map(str, cols)))
        for h, row, col in zip(histories, line, cols):
            h.append((int(row), col))
    total = sum(sum(game.payoffs[row][col][0] for row, col in h) / rounds for h in histories)
    return checked_score(total / simulations, game)


def _expect_ready(line: str) -> None:
    if line.startswith("E "):
        raise StrategyFailed(_error_text(line))
    if line != "R":
        raise ScoreRejected(
            "the evaluator stopped before playing" if not line else f"unexpected {line[:40]!r}"
        )


def _error_text(line: str) -> str:
    try:
        text = json.loads(line[2:])
    except (ValueError, RecursionError):
        raise ScoreRejected("the evaluator's error report is not valid JSON") from None
    if not isinstance(text, str):
        raise ScoreRejected("the evaluator's error report is not a message")
    return text
