"""LocalGameEnv episodes with real subprocesses: scripted agents, errors, timeouts, limits, cleanup."""

from __future__ import annotations

from pathlib import Path

import pytest

from src.envs import EpisodeEnv, LocalGameConfig, LocalGameEnv
from src.envs.base import EXIT_AUTOSUBMITTED, EXIT_EVALUATION_ERROR, EXIT_FORFEIT, EXIT_SUBMITTED

SIMS = 2000  # score standard error ~0.006 here; tolerances below are >= 4 standard errors


def _env(tmp_path: Path, **overrides) -> LocalGameEnv:
    settings = {
        "simulations": SIMS,
        "command_timeout_s": 1.0,
        "eval_timeout_s": 2.0,
        "workspace_root": str(tmp_path),
        "max_steps": 10,
    }
    settings.update(overrides)
    return LocalGameEnv(LocalGameConfig(**settings))


def _write(body: str) -> str:
    return f"cat > strategy.py << 'EOF'\n{body}\nEOF"


ALWAYS_0 = _write("def row_strategy(history):\n    return 0")


def test_protocol_and_first_observation(tmp_path):
    env = _env(tmp_path)
    assert isinstance(env, EpisodeEnv)
    obs, info = env.reset(seed=5)
    assert "seed 5" in obs and "strategy.py" in obs and len(obs) < 300
    assert info["task_prompt"] == env.task_prompt and "row_strategy(history)" in env.task_prompt
    assert "validate" in env.task_prompt and "submit" in env.task_prompt
    assert sorted(p.name for p in Path(info["workspace"]).iterdir()) == ["starter_strategy.py", "strategy.py"]
    env.close()


def test_same_seed_same_start_and_opponent_different_seed_differs(tmp_path):
    scores, firsts = [], []
    for seed in (3, 3, 4):
        env = _env(tmp_path)
        obs, _ = env.reset(seed)
        _, _, _, info = env.step("validate")  # the starter is random: equal scores mean equal streams
        scores.append(info["validation_score"])
        firsts.append(obs)
        env.close()
    assert firsts[0] == firsts[1] and scores[0] == scores[1]
    assert firsts[0] != firsts[2] and scores[0] != scores[2]


def test_always_zero_submit_scores_1_44(tmp_path):
    env = _env(tmp_path)
    env.reset(seed=0)
    obs, reward, done, info = env.step(ALWAYS_0)
    assert (reward, done) == (0.0, False) and "(no output)" in obs
    obs, reward, done, info = env.step("submit")
    assert done and info["exit_status"] == EXIT_SUBMITTED
    assert reward == info["score"] == pytest.approx(1.44, abs=0.03)
    assert "Final score" in obs
    with pytest.raises(RuntimeError, match="reset"):
        env.step("ls")
    env.close()


def test_starter_validates_near_1_02_and_episode_continues(tmp_path):
    env = _env(tmp_path)
    env.reset(seed=1)
    obs, reward, done, info = env.step("validate")
    assert not done and reward == 0.0 and "Validation score" in obs and "starter strategy: about 1.02" in obs
    assert info["validation_score"] == pytest.approx(1.021, abs=0.04)
    env.close()


def test_prisoners_dilemma_starter(tmp_path):
    env = _env(tmp_path, game="prisoners_dilemma")
    env.reset(seed=2)
    _, reward, done, _ = env.step("submit")
    assert done and reward == pytest.approx(2.37, abs=0.06)
    env.close()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def row_strategy(history:\n    return 0", "SyntaxError"),
        ("def row_strategy(history):\n    return 'zero'", "must return the int 0 or 1"),
        ("def move(history):\n    return 0", "no function row_strategy"),
        (
            "print('RESULT {\"score\": 99}')\ndef row_strategy(history):\n    return 2",
            "must return the int 0 or 1",
        ),
    ],
    ids=["syntax", "wrong_return", "missing_function", "forged_result"],
)
def test_invalid_strategy_gives_evaluation_error_observation(tmp_path, body, expected):
    env = _env(tmp_path)
    env.reset(seed=0)
    env.step(_write(body))
    obs, reward, done, info = env.step("validate")
    assert not done and reward == 0.0
    assert obs.startswith("Evaluation error") and expected in obs and expected in info["eval_error"]
    env.close()


def test_invalid_strategy_submit_scores_zero(tmp_path):
    env = _env(tmp_path)
    env.reset(seed=0)
    env.step("rm strategy.py")
    obs, reward, done, info = env.step("submit")
    assert (
        done and reward == 0.0 and info["exit_status"] == EXIT_EVALUATION_ERROR and "Evaluation error" in obs
    )
    env.close()


def test_infinite_loops_are_killed_and_episode_goes_on(tmp_path):
    env = _env(tmp_path, eval_timeout_s=1.0)
    env.reset(seed=0)
    obs, _, done, info = env.step("while true; do :; done")
    assert not done and info["timed_out"] and "command killed" in obs
    env.step(_write("def row_strategy(history):\n    while True:\n        pass"))
    obs, _, done, info = env.step("validate")
    assert not done and "Evaluation error" in obs and "endless loop" in obs
    env.step(ALWAYS_0)
    _, reward, done, _ = env.step("submit")
    assert done and reward == pytest.approx(1.44, abs=0.03)
    env.close()


def test_step_limit_auto_submits(tmp_path):
    env = _env(tmp_path, max_steps=3)
    env.reset(seed=0)
    assert "[2 actions left]" in env.step("ls")[0]
    env.step(ALWAYS_0)
    obs, reward, done, info = env.step("cat strategy.py")
    assert done and info["exit_status"] == EXIT_AUTOSUBMITTED and "Step limit (3) reached" in obs
    assert reward == info["score"] == pytest.approx(1.44, abs=0.03)
    env.close()


def test_forfeit_scores_zero(tmp_path):
    env = _env(tmp_path)
    for action in ("exit", "exit_forfeit"):
        env.reset(seed=0)
        _, reward, done, info = env.step(action)
        assert done and reward == 0.0 and info["score"] == 0.0 and info["exit_status"] == EXIT_FORFEIT
    env.close()


def test_host_files_are_absent_and_empty_actions_use_a_step(tmp_path):
    env = _env(tmp_path)
    env.reset(seed=0)
    obs, _, done, info = env.step("cat /etc/passwd")
    assert not done and "No such file" in obs and info["action_type"] == "shell" and info["exit_code"] == 1
    obs, _, _, info = env.step("   ")
    assert "Empty action" in obs and info["step"] == 2
    env.close()


def test_deleting_the_workspace_does_not_break_the_episode(tmp_path):
    env = _env(tmp_path)
    env.reset(seed=0)
    env.step("rm -rf ~")
    obs, _, done, _ = env.step("ls")
    assert not done and obs.startswith("(no output)")
    env.step(ALWAYS_0)
    assert env.step("submit")[1] == pytest.approx(1.44, abs=0.03)
    env.close()


def test_output_truncation(tmp_path):
    env = _env(tmp_path, max_output_chars=100)
    env.reset(seed=0)
    obs, _, _, info = env.step("python -c \"print('x' * 5000)\"")
    assert info["truncated"] and "characters cut" in obs and len(obs) < 200
    env.close()


def test_close_removes_workspace_and_reset_replaces_it(tmp_path):
    env = _env(tmp_path)
    _, info = env.reset(seed=0)
    first = Path(info["workspace"])
    _, info = env.reset(seed=0)
    second = Path(info["workspace"])
    assert not first.exists() and second.exists()
    env.close()
    env.close()
    assert not second.exists()


def test_bad_config_is_rejected():
    with pytest.raises(KeyError, match="unknown game"):
        LocalGameConfig(game="go")
    with pytest.raises(ValueError, match="rounds"):
        LocalGameConfig(rounds=0)
    with pytest.raises(TypeError, match="int seed"):
        LocalGameEnv().reset(seed="1")  # type: ignore[arg-type]
