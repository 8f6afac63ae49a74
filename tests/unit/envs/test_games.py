"""Game rules, opponents and Monte-Carlo scoring of src/envs/games.py (in-process, no subprocess)."""

from __future__ import annotations

import random

import pytest

from src.envs import game_scoring, games

BOS = games.get_game("battle_of_sexes")
PD = games.get_game("prisoners_dilemma")


def _starter(game: games.GameSpec):
    namespace: dict = {}
    exec(game.starter_source, namespace)  # noqa: S102 - our own starter text
    return namespace["row_strategy"]


def _bos_starter_expectation(rounds: int) -> float:
    """Exact expected score of the BoS starter, by a plain loop over rounds (reference for simulate).

    Row plays 0 in round 1, so from round 2 on the partner plays 0 w.p. 0.8 independently each round.
    Starter: 0 w.p. 0.1, 1 w.p. 0.1, partner's last move w.p. 0.7, own last move w.p. 0.1.
    """
    total = 0.0  # round 1: (0, 1) -> 0
    p_row0 = 1.0  # P(row played 0) in the previous round
    p_col0_prev = 0.0  # partner played 1 in round 1
    for _ in range(2, rounds + 1):
        p_row0 = 0.1 + 0.7 * p_col0_prev + 0.1 * p_row0
        total += p_row0 * 0.8 * 2.0 + (1 - p_row0) * 0.2 * 1.0
        p_col0_prev = 0.8
    return total / rounds


def test_payoffs_match_rules():
    assert BOS.payoffs[0][0] == (2, 1) and BOS.payoffs[1][1] == (1, 2)
    assert BOS.payoffs[0][1] == (0, 0) and BOS.payoffs[1][0] == (0, 0)
    assert PD.payoffs[0][0] == (3, 3) and PD.payoffs[0][1] == (0, 5)
    assert PD.payoffs[1][0] == (5, 0) and PD.payoffs[1][1] == (1, 1)


def test_aliases_and_unknown_game():
    assert games.get_game("battleOfSexes") is BOS
    assert games.get_game("prisonersDilemma") is PD
    with pytest.raises(KeyError, match="unknown game 'chess'"):
        games.get_game("chess")


def test_bos_opponent_keys_on_first_row_move():
    rng = random.Random(0)
    assert BOS.opponent([], rng) == 1
    # first row move 0, later row moves 1: the partner still follows the first move ~80% of the time
    history = [(0, 1)] + [(1, 0)] * 5
    share = sum(BOS.opponent(history, rng) == 0 for _ in range(4000)) / 4000
    assert share == pytest.approx(0.8, abs=0.03)


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [(lambda h: 0, 1.44), (lambda h: 1, 0.82)],
    ids=["always0", "always1"],
)
def test_bos_constant_strategies_match_closed_form(strategy, expected):
    random.seed(11)
    assert games.simulate(BOS, strategy, rounds=10, simulations=4000, seed=5) == pytest.approx(
        expected, abs=0.02
    )


def test_bos_starter_matches_exact_expectation():
    exact = _bos_starter_expectation(10)
    assert exact == pytest.approx(1.021, abs=0.001)  # MLGym publishes 1.0227 from 10k simulations
    random.seed(101)
    assert games.simulate(BOS, _starter(BOS), 10, 6000, seed=100) == pytest.approx(exact, abs=0.025)


def test_pd_reference_figures():
    random.seed(8)
    assert games.simulate(PD, _starter(PD), 10, 4000, seed=7) == pytest.approx(2.37, abs=0.05)
    assert games.simulate(PD, lambda h: 1, 10, 4000, seed=7) == pytest.approx(2.63, abs=0.05)
    assert games.simulate(PD, lambda h: 0, 10, 4000, seed=7) == pytest.approx(2.25, abs=0.05)


def test_simulate_deterministic_per_seed_and_seed_sensitive():
    def run(seed: int) -> list:
        rng = random.Random(seed)
        return [games.play_game(PD, lambda h: 0, 10, rng) for _ in range(20)]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_row_mean_payoff_plain_loop():
    rng = random.Random(3)
    for _ in range(50):
        history = [(rng.randrange(2), rng.randrange(2)) for _ in range(rng.randint(1, 12))]
        expected = 0.0
        for row, col in history:
            expected += PD.payoffs[row][col][0]
        assert games.row_mean_payoff(PD, history) == pytest.approx(expected / len(history))


def test_invalid_moves_raise_strategy_error():
    with pytest.raises(games.StrategyError, match="returned 2"):
        games.play_game(BOS, lambda h: 2, 3, random.Random(0))
    with pytest.raises(games.StrategyError, match="returned '0'"):
        games.play_game(BOS, lambda h: "0", 3, random.Random(0))
    assert games.play_game(BOS, lambda h: True, 2, random.Random(0))[0][0] == 1


def test_strategy_cannot_rewrite_history():
    def vandal(history):
        history.clear()
        return 0

    assert len(games.play_game(BOS, vandal, 5, random.Random(0))) == 5


def test_play_strategy_file_reports_moves_or_errors(tmp_path):
    path = tmp_path / "strategy.py"
    path.write_text("def row_strategy(history):\n    return 0\n")
    ok = games.play_strategy_file("battle_of_sexes", str(path), 10, 200, seed=1)
    assert set(ok) == {"rows", "cols"} and ok["rows"] == "0" * 2000
    assert game_scoring.replay_score(BOS, ok["rows"], ok["cols"], 10, 200, 1) == pytest.approx(1.44, abs=0.1)
    path.write_text("def row_strategy(history:\n    return 0\n")
    assert games.play_strategy_file("battle_of_sexes", str(path), 10, 10, 1)["error"].startswith(
        "SyntaxError"
    )
    path.write_text("def other(history):\n    return 0\n")
    assert (
        "no function row_strategy"
        in games.play_strategy_file("battle_of_sexes", str(path), 10, 10, 1)["error"]
    )
    path.write_text("def row_strategy(history):\n    return history[-1][0]\n")
    error = games.play_strategy_file("battle_of_sexes", str(path), 10, 10, 1)["error"]
    assert error.startswith("IndexError") and "line 2" in error
