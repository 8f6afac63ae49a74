"""Iterated 2x2 games modelled on MLGym's game-theory tasks, plus a CLI that scores a strategy file.

The rules are re-implemented from the task descriptions (not copied). Moves are 0 or 1; a history is
a list of ``(row_move, column_move)`` tuples, oldest first. The agent plays the row player; the
column player is a fixed stochastic opponent driven by its own ``random.Random`` so that one seed
fixes its behaviour (given the row moves).

Opponents (behaviour chosen to reproduce MLGym's published figures at 10 rounds):

* battle of the sexes: round 1 plays 1 (its favourite). Afterwards it keys on the row player's
  *first* move m and plays m with probability 0.8, else 1 - m. Always-0 therefore scores
  (0 + 9 * 0.8 * 2) / 10 = 1.44 and always-1 (1 + 9 * 0.8) / 10 = 0.82; the starter strategy
  scores about 1.02 (exact expectation 1.021; MLGym's baseline: 1.0227).
* prisoner's dilemma: every round it draws one of eleven classic behaviours uniformly at random
  and plays that behaviour's move for the current history (see ``_PD_BEHAVIOURS``). At 10 rounds
  (measured with ``simulate``, 20k-50k games): the starter scores about 2.38 (MLGym's baseline:
  2.37), always-defect about 2.63, tit-for-tat about 2.34, always-cooperate about 2.25.

Two sides use this module. The agent's side: ``local_game.py`` runs it as a script
(``python -I games.py --interactive ...``) inside the sandbox as the runner, which starts the
agent's strategy in a process of its own (``--strategy-worker``: the strategy file is imported and
played there) and relays its moves (``relay_to_scorer``); neither process computes a score, and the
module must stay importable with the standard library only. The trusted side: ``game_scoring.py``
in the trainer's own process replays the opponent from the seed against the reported row moves and
computes the score; nothing the agent's code does in its process can change that computation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass

History = Sequence[tuple[int, int]]
Strategy = Callable[[list[tuple[int, int]]], int]
Opponent = Callable[[History, random.Random], int]

# The runner prints its result on one line that starts with a nonce it read from stdin. This only
# keeps stray text apart from the result: the result itself is untrusted and verified by the scorer.
RESULT_TAG = "RESULT"


def _bos_opponent(history: History, rng: random.Random) -> int:
    if not history:
        return 1
    first_row_move = history[0][0]
    return first_row_move if rng.random() < 0.8 else 1 - first_row_move


# --- prisoner's dilemma behaviours: each reads the row player's moves as history[i][0] ---
def _pd_noisy(history: History, rng: random.Random) -> int:
    if not history:
        return 1
    u = rng.random()
    if u < 1 / 3:
        return 0
    if u < 0.5:
        return 1
    if u < 0.9:
        return history[-1][1]  # repeat its own previous move
    return 1 - history[-1][0]  # play the opposite of the row player's previous move


def _pd_tit_for_tat(history: History, rng: random.Random) -> int:
    return history[-1][0] if history else 0


def _pd_always_cooperate(history: History, rng: random.Random) -> int:
    return 0


def _pd_always_defect(history: History, rng: random.Random) -> int:
    return 1


def _pd_coin(history: History, rng: random.Random) -> int:
    return 0 if rng.random() < 0.5 else 1


def _pd_grim(history: History, rng: random.Random) -> int:
    return 1 if any(row == 1 for row, _ in history) else 0


def _pd_win_stay_lose_shift(history: History, rng: random.Random) -> int:
    if not history:
        return 0
    row, col = history[-1]
    return 0 if row == col else 1


def _pd_tit_for_two_tats(history: History, rng: random.Random) -> int:
    return 1 if len(history) >= 2 and history[-1][0] == 1 and history[-2][0] == 1 else 0


def _pd_suspicious_tit_for_tat(history: History, rng: random.Random) -> int:
    return history[-1][0] if history else 1


def _pd_forgiving_tit_for_tat(history: History, rng: random.Random) -> int:
    if not history:
        return 0
    if len(history) >= 2 and history[-1][0] == 1 and history[-2][0] == 1:
        return 0
    return history[-1][0]


# Two coin-flip entries on purpose: the reference opponent lists two 50/50 behaviours.
_PD_BEHAVIOURS: tuple[Opponent, ...] = (
    _pd_noisy,
    _pd_tit_for_tat,
    _pd_always_cooperate,
    _pd_always_defect,
    _pd_coin,
    _pd_grim,
    _pd_win_stay_lose_shift,
    _pd_tit_for_two_tats,
    _pd_suspicious_tit_for_tat,
    _pd_coin,
    _pd_forgiving_tit_for_tat,
)


def _pd_opponent(history: History, rng: random.Random) -> int:
    behaviour = _PD_BEHAVIOURS[rng.randrange(len(_PD_BEHAVIOURS))]
    return behaviour(history, rng)


_BOS_STARTER = '''\
import random


def row_strategy(history):
    """Return your next move (0 or 1).

    history: list of (your_move, partner_move) tuples from earlier rounds, oldest first.
    Keep this function name and signature.
    """
    if len(history) == 0:
        return 0
    mine, theirs = history[-1]
    u = random.random()
    if u < 0.1:
        return 0
    if u < 0.2:
        return 1
    if u < 0.9:
        return theirs  # follow the partner's last move
    return mine  # repeat my last move
'''

_PD_STARTER = '''\
import random


def row_strategy(history):
    """Return your next move: 0 = cooperate, 1 = defect.

    history: list of (your_move, partner_move) tuples from earlier rounds, oldest first.
    Keep this function name and signature.
    """
    if len(history) == 0:
        return random.choice([0, 1])
    mine, theirs = history[-1]
    u = random.random()
    if theirs == 1:  # partner defected last round
        if u < 0.75:
            return 1
        return mine if u < 0.9 else 0
    if u < 0.6:
        return 0
    return mine if u < 0.9 else 1
'''


@dataclass(frozen=True)
class GameSpec:
    """One iterated 2x2 game: payoffs[row_move][col_move] = (row_payoff, col_payoff)."""

    name: str
    title: str
    payoffs: tuple[tuple[tuple[float, float], tuple[float, float]], ...]
    opponent: Opponent
    starter_source: str
    rules_text: str
    starter_score_10_rounds: float  # MLGym's published baseline, valid for 10 rounds


GAMES: dict[str, GameSpec] = {
    "battle_of_sexes": GameSpec(
        name="battle_of_sexes",
        title="Battle of the Sexes",
        payoffs=(((2.0, 1.0), (0.0, 0.0)), ((0.0, 0.0), (1.0, 2.0))),
        opponent=_bos_opponent,
        starter_source=_BOS_STARTER,
        rules_text=(
            "Payoffs (you, partner): both 0 -> (2, 1); both 1 -> (1, 2); different -> (0, 0). "
            "You prefer 0, your partner prefers 1."
        ),
        starter_score_10_rounds=1.02,
    ),
    "prisoners_dilemma": GameSpec(
        name="prisoners_dilemma",
        title="Iterated Prisoner's Dilemma",
        payoffs=(((3.0, 3.0), (0.0, 5.0)), ((5.0, 0.0), (1.0, 1.0))),
        opponent=_pd_opponent,
        starter_source=_PD_STARTER,
        rules_text=(
            "Move 0 = cooperate, 1 = defect. Payoffs (you, partner): both 0 -> (3, 3); "
            "you 0, partner 1 -> (0, 5); you 1, partner 0 -> (5, 0); both 1 -> (1, 1)."
        ),
        starter_score_10_rounds=2.37,
    ),
}

# MLGym task ids -> local names, so configs can use either spelling.
ALIASES: dict[str, str] = {"battleOfSexes": "battle_of_sexes", "prisonersDilemma": "prisoners_dilemma"}


def get_game(name: str) -> GameSpec:
    """Look a game up by local name or MLGym task id; unknown names raise KeyError listing the choices."""
    key = ALIASES.get(name, name)
    if key not in GAMES:
        raise KeyError(f"unknown game {name!r}; choose one of {sorted(GAMES) + sorted(ALIASES)}")
    return GAMES[key]


class StrategyError(ValueError):
    """The row strategy returned something other than 0 or 1."""


def _check_move(move: object, round_index: int) -> int:
    # bool is an int subclass; True/False are accepted as 1/0 like the reference evaluator does.
    if isinstance(move, int) and move in (0, 1):
        return int(move)
    raise StrategyError(
        f"row_strategy returned {move!r} (type {type(move).__name__}) in round {round_index + 1}; "
        "it must return the int 0 or 1"
    )


def play_game(
    game: GameSpec, row_strategy: Strategy, rounds: int, rng: random.Random
) -> list[tuple[int, int]]:
    """Play one iterated game; returns the full history of (row_move, col_move), length ``rounds``."""
    history: list[tuple[int, int]] = []
    for r in range(rounds):
        row_move = _check_move(row_strategy(list(history)), r)  # a copy: the strategy cannot rewrite history
        col_move = game.opponent(history, rng)
        history.append((row_move, col_move))
    return history


def row_mean_payoff(game: GameSpec, history: History) -> float:
    """Row player's mean payoff per round of one game."""
    return sum(game.payoffs[row][col][0] for row, col in history) / len(history)


def simulate(game: GameSpec, row_strategy: Strategy, rounds: int, simulations: int, seed: int) -> float:
    """Monte-Carlo score: the row player's mean payoff per round, averaged over ``simulations`` games.

    The opponent draws from ``random.Random(seed)``; the agent's own use of the global ``random``
    module is seeded by the caller (see ``score_strategy_file``).
    """
    if rounds < 1 or simulations < 1:
        raise ValueError(
            f"rounds and simulations must be >= 1, got rounds={rounds}, simulations={simulations}"
        )
    rng = random.Random(seed)
    total = 0.0
    for _ in range(simulations):
        total += row_mean_payoff(game, play_game(game, row_strategy, rounds, rng))
    return total / simulations


def _load_row_strategy(path: str) -> Strategy:
    # Compile from source instead of importing: no stale __pycache__ when the file is rewritten
    # within the same second with the same size.
    with open(path, encoding="utf-8") as f:
        code = compile(f.read(), path, "exec")
    module = types.ModuleType("strategy")
    module.__file__ = path
    sys.modules["strategy"] = module
    exec(code, module.__dict__)  # noqa: S102 - running the agent's strategy is the point
    fn = getattr(module, "row_strategy", None)
    if not callable(fn):
        raise TypeError(f"{os.path.basename(path)} defines no function row_strategy(history)")
    return fn


def _short_traceback(exc: BaseException, strategy_path: str) -> str:
    """The error plus the frames inside the agent's file, kept short because a tiny model reads it."""
    frames = [
        f"line {f.lineno}: {(f.line or '').strip()}"
        for f in traceback.extract_tb(exc.__traceback__)
        if f.filename == strategy_path
    ]
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno}: {(exc.text or '').strip()})"
    where = f" ({'; '.join(frames[-2:])})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def play_all(
    game: GameSpec, row_strategy: Strategy, rounds: int, simulations: int, seed: int
) -> tuple[str, str]:
    """Play ``simulations`` games; returns (row moves, column moves) as strings of '0'/'1',
    ``rounds`` characters per game, games concatenated. Same streams as ``simulate``."""
    rng = random.Random(seed)
    rows: list[str] = []
    cols: list[str] = []
    for _ in range(simulations):
        for row, col in play_game(game, row_strategy, rounds, rng):
            rows.append(str(row))
            cols.append(str(col))
    return "".join(rows), "".join(cols)


def play_strategy_file(game_name: str, strategy_path: str, rounds: int, simulations: int, seed: int) -> dict:
    """Import the agent's file and play it; returns {"rows": str, "cols": str} or {"error": str}."""
    random.seed(seed + 1)  # the agent's own randomness: fixed per seed, separate from the opponent's stream
    sys.path.insert(0, os.path.dirname(os.path.abspath(strategy_path)))  # allow helper modules beside it
    try:
        row_strategy = _load_row_strategy(strategy_path)
        if "numpy" in sys.modules:  # seed numpy only if the strategy imported it (importing it is slow)
            sys.modules["numpy"].random.seed(seed + 1)
        rows, cols = play_all(get_game(game_name), row_strategy, rounds, simulations, seed)
        return {"rows": rows, "cols": cols}
    except Exception as exc:  # noqa: BLE001 - any failure of the agent's code is reported, not raised
        return {"error": _short_traceback(exc, strategy_path)}


def _silence_agent_output() -> int:
    """Point fds 1 and 2 at /dev/null (the strategy's prints are dropped); return a copy of stdout."""
    result_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    return result_fd


def play_against_runner(strategy_path: str, rounds: int, simulations: int, seed: int, inp, out) -> None:
    """The strategy's own process (``--strategy-worker``): load the agent's strategy and play the
    ``simulations`` games side by side, round by round, talking only to the runner over ``inp`` /
    ``out`` (see :func:`relay_to_scorer` for the protocol, which the runner passes on unchanged).
    ``seed`` seeds only the strategy's own ``random``; the partner's seed never enters the sandbox.
    """

    def send(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    random.seed(seed + 1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(strategy_path)))
    try:
        row_strategy = _load_row_strategy(strategy_path)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(seed + 1)
    except Exception as exc:  # noqa: BLE001 - the agent's failure is reported, not raised
        return send("E " + json.dumps(_short_traceback(exc, strategy_path)))
    send("R")
    histories: list[list[tuple[int, int]]] = [[] for _ in range(simulations)]
    for r in range(rounds):
        try:
            rows = [_check_move(row_strategy(list(h)), r) for h in histories]
        except Exception as exc:  # noqa: BLE001
            return send("E " + json.dumps(_short_traceback(exc, strategy_path)))
        send("".join(map(str, rows)))
        cols = inp.readline().strip()
        if not _is_moves(cols, simulations):
            return None  # the runner stopped: nothing more to play
        for h, row, col in zip(histories, rows, cols):
            h.append((row, int(col)))
    return None


def _is_moves(line: str, simulations: int) -> bool:
    return len(line) == simulations and set(line) <= {"0", "1"}


def _not_dumpable() -> None:
    """Make this process's memory and /proc/<pid>/fd unreachable to the strategy's process (same
    uid, no capabilities): no ptrace, no opening the scorer's pipes through /proc."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass  # not Linux: the process boundary still holds


def relay_to_scorer(
    strategy_path: str, rounds: int, simulations: int, seed: int, scorer_in, scorer_out
) -> None:
    """The sandbox side of a scored evaluation. The agent's strategy runs in a child process
    (:func:`play_against_runner`) that holds only a pipe pair to this one: it cannot read this
    process's frames or objects, nor reach the scorer's pipes. Protocol (one line each, relayed):
    ``R`` (strategy loaded) or ``E <json error>``; then every round the row moves of all games
    (``simulations`` characters 0/1) or ``E <json error>``, answered by the partner's moves, which
    the scorer draws only after the row moves are committed. A line that is not a move line ends
    the evaluation after it is passed on (the scorer names what was wrong)."""
    _not_dumpable()
    argv = [
        sys.executable,
        "-I",
        "-B",
        os.path.abspath(__file__),
        "--strategy-worker",
        "--strategy",
        strategy_path,
    ]
    argv += ["--rounds", str(rounds), "--simulations", str(simulations), "--seed", str(seed)]
    worker = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        close_fds=True,
    )

    def pass_on(line: str) -> None:
        scorer_out.write(line + "\n")
        scorer_out.flush()

    try:
        first = worker.stdout.readline(1 << 16).strip()
        pass_on(first)
        for _ in range(rounds if first == "R" else 0):
            rows = worker.stdout.readline(simulations + (1 << 16)).strip()
            pass_on(rows)
            cols = scorer_in.readline().strip()
            if not (_is_moves(rows, simulations) and _is_moves(cols, simulations)):
                return
            worker.stdin.write(cols + "\n")
            worker.stdin.flush()
    except (BrokenPipeError, OSError):
        return
    finally:
        worker.kill()
        worker.wait()


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Play a row_strategy file; reads a nonce from stdin.")
    parser.add_argument("--game", help="the game (not needed by --interactive and --strategy-worker)")
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--simulations", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument(
        "--interactive", action="store_true", help="play against the scorer over stdin/stdout"
    )
    parser.add_argument("--strategy-worker", action="store_true", help="(internal) the strategy's process")
    args = parser.parse_args(argv)
    if args.interactive:
        relay_to_scorer(args.strategy, args.rounds, args.simulations, args.seed, sys.stdin, sys.stdout)
        return 0
    if args.strategy_worker:
        result_fd = _silence_agent_output()
        with os.fdopen(result_fd, "w", encoding="utf-8") as out:
            play_against_runner(args.strategy, args.rounds, args.simulations, args.seed, sys.stdin, out)
        return 0
    nonce = sys.stdin.readline().strip()
    result_fd = _silence_agent_output()
    result = play_strategy_file(args.game, args.strategy, args.rounds, args.simulations, args.seed)
    with os.fdopen(result_fd, "w", encoding="utf-8") as out:
        out.write(f"{nonce} {RESULT_TAG} {json.dumps(result)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
