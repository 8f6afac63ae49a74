"""The partner cannot be predicted or reached from the agent's strategy: its random stream is drawn
in the scorer's process from a seed derived with a key the sandbox never holds, one move at a time,
after the strategy committed its own move. The issue's attacks (replaying ``random.Random(seed)``
from the seed in argv or in the first observation, reading ``rng`` from the caller's frames,
patching the runner's opponent / ``simulate`` / ``play_all``, forging the report) now gain nothing:
each scores exactly what the same moves score honestly, never the 1.618 the replay attack reached."""

from __future__ import annotations

import math

import pytest

from src.envs import LocalGameConfig, LocalGameEnv
from src.envs.base import EXIT_EVALUATION_ERROR
from src.envs.game_scoring import partner_seed, partner_streams, score_interactively
from src.envs.games import GAMES, play_game, row_mean_payoff
from src.envs.sandbox import SandboxUnavailableError, resolve_backend

HONEST_BEST = 1.437  # the best honest strategy in the issue (1.618 with the partner predicted)
CEILING = HONEST_BEST + 0.08  # sampling noise of 300 games; a predicted partner scores ~1.6


def _env(tmp_path, backend="auto", simulations=300) -> LocalGameEnv:
    try:
        resolve_backend(backend)
    except SandboxUnavailableError:
        pytest.skip("no confinement tool")
    env = LocalGameEnv(
        LocalGameConfig(
            simulations=simulations, eval_timeout_s=30.0, workspace_root=str(tmp_path), confinement=backend
        )
    )
    env.reset(seed=7)
    return env


def _submit(env: LocalGameEnv, body: str) -> tuple[float, dict]:
    env.step(f"cat > strategy.py << 'EOF'\n{body}\nEOF")
    _, reward, done, info = env.step("submit")
    assert done and math.isfinite(reward)
    return reward, info


# Replays the partner from the episode seed found in argv (also stated in the first observation)
# and plays the best response to its predicted move: 1.618 before the fix.
REPLAY_SEED = """
import random, sys
seed = int(sys.argv[sys.argv.index("--seed") + 1])
runner = sys.modules["__main__"]
game = runner.GAMES["battle_of_sexes"]
rng = random.Random(seed)
def row_strategy(history):
    col = game.opponent(history, rng)
    return col  # coordinate on the predicted move
"""

# Looks for a random.Random in the caller's frames (the runner's rng) and predicts with a copy.
READ_FRAMES = """
import random, sys
def _partner_rng():
    frame = sys._getframe(1)
    while frame is not None:
        for value in frame.f_locals.values():
            if isinstance(value, random.Random) and value is not random._inst:
                return value
        frame = frame.f_back
    return None
def row_strategy(history):
    rng = _partner_rng()
    if rng is None:
        return 0
    twin = random.Random()
    twin.setstate(rng.getstate())
    runner = sys.modules["__main__"]
    return runner.GAMES["battle_of_sexes"].opponent(history, twin)
"""

PATCH_RUNNER = """
import dataclasses, sys
runner = sys.modules["__main__"]
runner.simulate = lambda *args, **kwargs: 1e9
runner.play_all = lambda *args, **kwargs: ("0" * 10, "0" * 10)
game = runner.GAMES["battle_of_sexes"]
runner.GAMES["battle_of_sexes"] = dataclasses.replace(game, opponent=lambda history, rng: 0)
def row_strategy(history):
    return 0
"""

FORGE_MOVES = """
import os
def row_strategy(history):
    for fd in range(3, 12):  # the protocol's pipe: claim extra rounds, answer for the partner
        try:
            os.write(fd, b"0\\n0\\n0\\n")
        except OSError:
            pass
    return 0
"""


@pytest.mark.parametrize("body", [REPLAY_SEED, READ_FRAMES], ids=["replay_seed", "read_frames"])
def test_prediction_attacks_gain_nothing(tmp_path, body):
    env = _env(tmp_path)
    reward, info = _submit(env, body)
    assert reward < CEILING, info  # a predicted partner would give ~1.6+


def test_patching_the_runner_changes_nothing(tmp_path):
    env = _env(tmp_path)
    cheat, _ = _submit(env, PATCH_RUNNER)
    env.reset(seed=7)
    honest, _ = _submit(env, "def row_strategy(history):\n    return 0")
    assert cheat == honest  # the same moves, scored against the scorer's own partner


def test_forged_protocol_lines_are_rejected_or_worthless(tmp_path):
    env = _env(tmp_path)
    reward, info = _submit(env, FORGE_MOVES)
    assert reward == 0.0 and info["exit_status"] == EXIT_EVALUATION_ERROR or reward < CEILING


def test_partner_seed_is_not_the_episode_seed():
    assert all(partner_seed(s) != s for s in range(100))
    assert len({partner_seed(s) for s in range(1000)}) == 1000


@pytest.mark.parametrize("game", sorted(GAMES))
def test_interactive_scoring_equals_a_plain_loop(game):
    """Games played side by side score as the same games played one after another with the same
    per-game partner streams (a strategy that depends on the history only)."""
    spec, n_games, rounds = GAMES[game], 30, 10

    def row_strategy(history):
        return (len(history) + sum(c for _, c in history)) % 2

    expected = (
        sum(
            row_mean_payoff(spec, play_game(spec, row_strategy, rounds, rng))
            for rng in partner_streams(9, n_games)
        )
        / n_games
    )
    histories = [[] for _ in range(n_games)]
    replies: list[str] = ["R"]

    def recv() -> str:
        return replies.pop(0) if replies else "".join(str(row_strategy(h)) for h in histories)

    def send(cols: str) -> None:
        for h, col in zip(histories, cols):
            h.append((row_strategy(h), int(col)))

    got = score_interactively(spec, recv, send, rounds, n_games, partner_streams(9, n_games))
    assert got == pytest.approx(expected, abs=1e-12)


# Walks everything it can reach for the runner's state and the channel to the scorer: its call
# stack, every object (gc), __main__, its own open files, and the parent's through /proc (opening
# any pipe found there to forge a move line); records it all beside itself.
REACH_RUNNER = """
import gc, json, os, sys

def _links(pid):
    out = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                out[f"/proc/{pid}/fd/{fd}"] = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                pass
    except OSError:
        pass
    return out

def _gc_files():
    found = []
    for obj in gc.get_objects():
        fileno = getattr(obj, "fileno", None)
        if callable(fileno) and not isinstance(obj, type):
            try:
                found.append(os.readlink(f"/proc/self/fd/{fileno()}"))
            except Exception:
                pass
    return found

def _stack():
    names, frame = [], sys._getframe()
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names

reach = {"self": _links("self"), "parent": _links(os.getppid()), "gc": _gc_files(), "stack": _stack()}
reach["opened"] = []
for path, link in reach["parent"].items():
    if link.startswith("pipe:"):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"1" * 300 + b"\\n")
            reach["opened"].append(link)
        except OSError:
            pass
here = os.path.dirname(os.path.abspath(sys.argv[sys.argv.index("--strategy") + 1]))
with open(os.path.join(here, "reach.json"), "w") as f:
    json.dump(reach, f)

def row_strategy(history):
    return 0
"""


def test_strategy_cannot_reach_the_runner_or_the_scorer_pipes(tmp_path, monkeypatch):
    """The strategy runs in its own process: neither its objects, its stack, its files nor the
    runner's /proc entries give it the pipes the scorer talks over, or a frame of the runner."""
    import json
    import os

    from src.envs import local_game

    scorer_pipes: set[str] = set()
    real_run_session = local_game.run_session

    def run_session(argv, workspace, config, talk, **kwargs):
        def spying_talk(recv, send):
            proc = dict(zip(send.__code__.co_freevars, (c.cell_contents for c in send.__closure__)))["proc"]
            for pipe in (proc.stdin, proc.stdout):
                scorer_pipes.add(f"pipe:[{os.fstat(pipe.fileno()).st_ino}]")
            return talk(recv, send)

        return real_run_session(argv, workspace, config, spying_talk, **kwargs)

    monkeypatch.setattr(local_game, "run_session", run_session)
    env = _env(tmp_path)
    attack, _ = _submit(env, REACH_RUNNER)
    reach = json.loads((env.workspace / "reach.json").read_text())
    reached = {*reach["self"].values(), *reach["parent"].values(), *reach["gc"]}
    assert len(scorer_pipes) == 2 and reached and not scorer_pipes & reached, (scorer_pipes, reach)
    assert not reach["opened"] and "relay_to_scorer" not in reach["stack"], reach
    env.reset(seed=7)
    honest, _ = _submit(env, "def row_strategy(history):\n    return 0")
    assert attack == honest
