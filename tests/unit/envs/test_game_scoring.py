"""The trusted scorer: replay equals in-process simulation, malformed/forged/non-finite reports rejected."""

from __future__ import annotations

import json
import random

import pytest

from src.envs import game_scoring, games
from src.envs.game_scoring import ScoreRejected, checked_score, parse_runner_result, replay_score

BOS = games.get_game("battle_of_sexes")
PD = games.get_game("prisoners_dilemma")


def _random_strategy(seed: int):
    rng = random.Random(seed)
    return lambda history: rng.randrange(2) if len(history) % 3 else (history[-1][1] if history else 0)


@pytest.mark.parametrize("game", [BOS, PD], ids=["bos", "pd"])
@pytest.mark.parametrize("seed", [0, 7, 123])
def test_replay_matches_in_process_simulation(game, seed):
    rounds, sims = 1 + seed % 9, 150
    rows, cols = games.play_all(game, _random_strategy(seed), rounds, sims, seed)
    reference = games.simulate(game, _random_strategy(seed), rounds, sims, seed)
    assert replay_score(game, rows, cols, rounds, sims, seed) == pytest.approx(reference, abs=1e-12)


def test_replay_plain_loop_reference():
    rounds, sims, seed = 4, 50, 3
    rows, cols = games.play_all(PD, _random_strategy(1), rounds, sims, seed)
    total = 0.0
    for i in range(len(rows)):
        total += PD.payoffs[int(rows[i])][int(cols[i])][0]
    assert replay_score(PD, rows, cols, rounds, sims, seed) == pytest.approx(total / (rounds * sims))


@pytest.mark.parametrize(
    ("rows", "cols", "message"),
    [
        ("0" * 19, "1" * 20, "malformed row moves"),
        ("0" * 20, None, "malformed partner moves"),
        ("0" * 19 + "2", "1" * 20, "malformed row moves"),
        ("0" * 20, "0" * 20, "tampered"),
    ],
)
def test_bad_reports_are_rejected(rows, cols, message):
    with pytest.raises(ScoreRejected, match=message):
        replay_score(BOS, rows, cols, 10, 2, seed=0)


@pytest.mark.parametrize("score", [float("nan"), float("inf"), -float("inf"), 1e9, -0.5, "1.0", None])
def test_checked_score_rejects_impossible_scores(score):
    with pytest.raises(ScoreRejected):
        checked_score(score, BOS)


def test_checked_score_accepts_the_payoff_range():
    assert game_scoring.payoff_range(PD) == (0.0, 5.0)
    assert checked_score(0, PD) == 0.0 and checked_score(5.0, PD) == 5.0


def _line(nonce: str, payload) -> str:
    return f"{nonce} {games.RESULT_TAG} {json.dumps(payload)}"


def test_parse_runner_result():
    good = {"rows": "01", "cols": "10"}
    assert parse_runner_result("noise\n" + _line("n1", good) + "\n", "n1") == good
    assert parse_runner_result(_line("n1", {"error": "boom"}), "n1") == {"error": "boom"}
    with pytest.raises(ScoreRejected, match="without a result"):
        parse_runner_result(_line("other", good), "n1")
    with pytest.raises(ScoreRejected, match="2 results"):
        parse_runner_result(_line("n1", good) + "\n" + _line("n1", good), "n1")
    with pytest.raises(ScoreRejected, match="unexpected content"):
        parse_runner_result(_line("n1", {"score": 1e9}), "n1")
    with pytest.raises(ScoreRejected, match="unexpected content"):
        parse_runner_result(_line("n1", {**good, "score": 2.0}), "n1")
    with pytest.raises(ScoreRejected, match="not valid JSON"):
        parse_runner_result("n1 RESULT {", "n1")
