"""Docker-free stand-in for MLGym's game-theory tasks (battle of the sexes, prisoner's dilemma).

Each episode gets a fresh temporary workspace holding ``strategy.py`` (the file the agent edits; it
starts as the starter strategy) and ``starter_strategy.py`` (a reference copy). Every action is one
of:

* a shell command (``cat strategy.py``, ``cat > strategy.py << 'EOF' ... EOF``, ``python -c ...``),
  run by ``sandbox.run_command`` in a fresh bash inside the sandbox (see ``sandbox.py`` for the
  boundary: only the workspace writable, no network, no host files beyond the interpreter, process/
  memory/file-size/CPU limits, every process killed at the end of the step), with a timeout and
  truncated output;
* ``validate``: score strategy.py and report it; the episode goes on;
* ``submit``: score strategy.py and end the episode; reward = info["score"] = the score
  (0.0 with exit_status "evaluation_error" when strategy.py cannot be evaluated);
* ``exit`` or ``exit_forfeit``: end the episode without scoring; reward = score = 0.0
  (like MLGym's forfeit; there is no baseline credit for quitting).

After ``max_steps`` actions the current strategy.py is submitted automatically. Scoring is split
over three processes: in the sandbox, ``games.py`` (the runner) starts strategy.py in a process of
its own that holds only a pipe pair to the runner, and relays its moves; ``game_scoring.py`` in
this process draws the partner's moves (from a seed the sandbox never sees, each after the row
moves are committed), checks every line and computes the score (finite, within the payoff range),
so the agent's code can neither patch the scorer nor reach the runner's state or the scorer's
pipes. A strategy that loops forever, crashes or forges its report produces an "Evaluation error"
observation (score 0.0 on submit), never an exception or a reward. The episode seed fixes the
global ``random`` seen by the strategy and (through a key) the partner's stream, so one seed gives
one first observation and one partner behaviour.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import src.envs.games as games  # noqa: PLR0402 - the import-graph test reads `from src.envs import` as importing the package
import src.envs.workspace_cap as workspace_cap
from src.envs.base import EXIT_AUTOSUBMITTED, EXIT_EVALUATION_ERROR, EXIT_FORFEIT, EXIT_SUBMITTED
from src.envs.game_scoring import (
    ScoreRejected,
    StrategyFailed,
    checked_score,
    partner_streams,
    score_interactively,
)
from src.envs.sandbox import (
    SandboxConfig,
    resolve_backend,
    run_command,
    run_session,
    sandbox_python,
    truncate_middle,
)
from src.envs.sandbox_backends import CHOICES as CONFINEMENT_CHOICES

logger = logging.getLogger(__name__)

STRATEGY_FILE = "strategy.py"
STARTER_FILE = "starter_strategy.py"
_GAMES_SCRIPT = str(Path(games.__file__).resolve())
_RUNNER_IN_SANDBOX = "/sandbox/games.py"  # games.py mounted read-only; the repository itself is not
_EXIT_ACTIONS = ("exit", "exit_forfeit")


@dataclass(frozen=True)
class LocalGameConfig:
    """Episode settings. ``simulations`` games of ``rounds`` rounds are played per evaluation."""

    game: str = "battle_of_sexes"
    rounds: int = 10
    simulations: int = 10000
    max_steps: int = 30
    command_timeout_s: float = 10.0
    eval_timeout_s: float = 60.0
    max_output_chars: int = 1000
    memory_mb: int = 4096
    file_size_mb: int = 64
    max_processes: int = 64
    workspace_mb: int = 256  # cap on the workspace's total bytes; reaching it ends the episode, scored 0
    workspace_root: str | None = None  # parent dir for the per-episode temp workspaces; None = system temp
    confinement: str = "auto"  # auto | bwrap | unshare: the tool that confines commands (never none)

    def __post_init__(self) -> None:
        games.get_game(self.game)  # raises KeyError naming the choices
        if self.confinement not in CONFINEMENT_CHOICES:
            raise ValueError(
                f"LocalGameConfig.confinement must be one of {list(CONFINEMENT_CHOICES)}, got {self.confinement!r}"
            )
        for name in ("rounds", "simulations", "max_steps", "workspace_mb"):
            if getattr(self, name) < 1:
                raise ValueError(f"LocalGameConfig.{name} must be >= 1, got {getattr(self, name)}")


def build_task_prompt(game: games.GameSpec, config: LocalGameConfig) -> str:
    """Task description for the agent (rules, file contract, actions, limits); ~250 tokens."""
    starter = (
        f" The starter strategy scores about {game.starter_score_10_rounds:.2f}."
        if config.rounds == 10
        else ""
    )
    return (
        f"You play {game.title} as the row player against a fixed partner (the column player). "
        f"A game has {config.rounds} rounds; in each round both of you pick 0 or 1. {game.rules_text}\n"
        f"Edit {STRATEGY_FILE} so that row_strategy(history) returns your move, 0 or 1. history is the list "
        "of (your_move, partner_move) tuples of the earlier rounds of the current game (empty in round 1). "
        "Keep the function name and signature. Your score is your mean payoff per round over "
        f"{config.simulations} games.{starter}\n"
        "Each turn, send exactly one action:\n"
        f"- a shell command run in the workspace, e.g. `cat {STRATEGY_FILE}`, or write the file with\n"
        f"cat > {STRATEGY_FILE} << 'EOF'\ndef row_strategy(history):\n    return 0\nEOF\n"
        f"- validate: score {STRATEGY_FILE} now; the episode goes on.\n"
        f"- submit: score {STRATEGY_FILE} and end the episode; that score is your result.\n"
        "- exit_forfeit: give up with score 0.\n"
        f"Commands are killed after {config.command_timeout_s:g} s and their output is cut to "
        f"{config.max_output_chars} characters. Each command runs in a new shell in the workspace. "
        f"After {config.max_steps} actions {STRATEGY_FILE} is submitted automatically."
    )


class LocalGameEnv:
    """``EpisodeEnv`` for the local games; see the module docstring for the action set."""

    def __init__(self, config: LocalGameConfig | None = None, **overrides: Any) -> None:
        base = config or LocalGameConfig()
        self.config = dataclasses.replace(base, **overrides) if overrides else base
        self.game = games.get_game(self.config.game)
        self.task_prompt = build_task_prompt(self.game, self.config)
        limits = {
            "memory_mb": self.config.memory_mb,
            "file_size_mb": self.config.file_size_mb,
            "max_processes": self.config.max_processes,
            "confinement": self.config.confinement,
        }
        self._command_sandbox = SandboxConfig(
            timeout_s=self.config.command_timeout_s, max_output_chars=self.config.max_output_chars, **limits
        )
        # The evaluator's one output line carries every move: room for it plus a margin.
        moves = self.config.rounds * self.config.simulations
        self._eval_sandbox = SandboxConfig(
            timeout_s=self.config.eval_timeout_s, max_output_chars=2 * moves + 4096, **limits
        )
        resolve_backend(self.config.confinement)  # start-up error if no confinement tool works
        self.workspace: Path | None = None
        self._enter: tuple[str, ...] = ()  # argv prefix into the namespace that holds the workspace
        self._cleanup: weakref.finalize | None = None
        self._seed = 0
        self._steps = 0
        self._done = True

    # ----- protocol -----
    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"reset(seed) needs an int seed, got {seed!r}")
        self._remove_workspace()
        created = Path(tempfile.mkdtemp(prefix=f"{self.game.name}_", dir=self.config.workspace_root))
        capped = workspace_cap.make_capped(created, self.config.workspace_mb)
        self._cleanup = weakref.finalize(self, workspace_cap.remove, capped)
        self.workspace, self._enter = capped.access, capped.enter
        (self.workspace / STRATEGY_FILE).write_text(self.game.starter_source)
        starter = self.workspace / STARTER_FILE
        starter.write_text(self.game.starter_source)
        starter.chmod(0o444)
        self._seed, self._steps, self._done = seed, 0, False
        observation = (
            f"New episode, seed {seed}. Files: {STRATEGY_FILE} (your strategy, edit it), "
            f"{STARTER_FILE} (read-only copy of the starter). You have {self.config.max_steps} actions. "
            "Send one shell command, or validate, or submit."
        )
        info = {
            "task_prompt": self.task_prompt,
            "seed": seed,
            "max_steps": self.config.max_steps,
            "workspace": str(self.workspace),
        }
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self._done or self.workspace is None:
            raise RuntimeError("step() called on a finished or never-started episode; call reset(seed) first")
        self._steps += 1
        self.workspace.mkdir(exist_ok=True)  # `rm -rf ~` deletes it (HOME is the workspace); keep going
        info: dict[str, Any] = {"step": self._steps}
        command = action.strip()
        keyword = command.lower()

        if keyword in _EXIT_ACTIONS:
            info["action_type"] = "exit"
            return self._finish(
                f"Episode ended by {keyword}. Final score: 0.0 (forfeit).",
                None,
                "",
                info,
                status=EXIT_FORFEIT,
            )
        if keyword == "submit":
            info["action_type"] = "submit"
            score, error = self._evaluate()
            return self._finish(f"Submitted {STRATEGY_FILE}.", score, error, info, status=EXIT_SUBMITTED)

        if keyword == "validate":
            info["action_type"] = "validate"
            score, error = self._evaluate()
            if error:
                info["eval_error"] = error
                body = f"Evaluation error: {error}\nFix {STRATEGY_FILE} and validate again."
            else:
                info["validation_score"] = score
                starter = (
                    f" (starter strategy: about {self.game.starter_score_10_rounds:.2f})"
                    if self.config.rounds == 10
                    else ""
                )
                body = f"Validation score: {score:.4f}{starter}. The episode goes on; submit when done."
        elif not command:
            info["action_type"] = "empty"
            body = "Empty action. Send one shell command, or validate, or submit."
        else:
            body = self._run_shell(command, info)

        if workspace_cap.over_cap(self.workspace, self.config.workspace_mb):
            info["workspace_full"] = True
            error = f"the workspace reached its cap of {self.config.workspace_mb} MB; the episode was stopped"
            return self._finish(body, None, error, info, status=EXIT_EVALUATION_ERROR)
        if self._steps >= self.config.max_steps:
            score, error = self._evaluate()
            note = f"{body}\nStep limit ({self.config.max_steps}) reached: {STRATEGY_FILE} was submitted."
            return self._finish(note, score, error, info, status=EXIT_AUTOSUBMITTED)
        return f"{body}\n[{self.config.max_steps - self._steps} actions left]", 0.0, False, info

    def close(self) -> None:
        self._remove_workspace()
        self._done = True

    # ----- helpers -----
    def _run_shell(self, command: str, info: dict[str, Any]) -> str:
        info["action_type"] = "shell"
        sandbox = dataclasses.replace(self._command_sandbox, enter=self._enter)
        result = run_command(command, self.workspace, sandbox)
        info["timed_out"] = result.timed_out
        info["exit_code"] = result.exit_code
        info["truncated"] = result.truncated
        text = result.output.rstrip("\n") or "(no output)"
        if result.timed_out:
            text += f"\n[command killed: it ran longer than {self.config.command_timeout_s:g} s]"
        elif result.exit_code:
            text += f"\n[exit code {result.exit_code}]"
        return text

    def _evaluate(self) -> tuple[float | None, str]:
        """Play strategy.py in the sandbox against the partner drawn here; returns (score, "") or
        (None, error). The partner's random stream (``partner_seed``) never enters the sandbox, and
        each partner move is drawn only after the strategy committed its move for that round."""
        argv = [sandbox_python(), "-I", "-B", _RUNNER_IN_SANDBOX, "--game", self.game.name, "--interactive"]
        argv += [
            "--strategy",
            str(self.workspace.resolve() / STRATEGY_FILE),
            "--rounds",
            str(self.config.rounds),
        ]
        argv += ["--simulations", str(self.config.simulations), "--seed", str(self._seed)]
        rngs = partner_streams(self._seed, self.config.simulations)

        def talk(recv, send) -> float:
            return score_interactively(
                self.game, recv, send, self.config.rounds, self.config.simulations, rngs
            )

        score, error, timed_out = run_session(
            argv,
            self.workspace,
            dataclasses.replace(self._eval_sandbox, enter=self._enter),
            talk,
            extra_ro=((_GAMES_SCRIPT, _RUNNER_IN_SANDBOX),),
            line_limit=self.config.simulations + 4096,
        )
        if timed_out:
            return None, (
                f"the evaluation was stopped after {self.config.eval_timeout_s:g} s. row_strategy must "
                "return quickly in every round (look for an endless loop)."
            )
        if isinstance(error, StrategyFailed):
            return None, truncate_middle(str(error), 600)
        if isinstance(error, (ScoreRejected, OSError)):
            logger.warning("strategy evaluation rejected (seed %d): %s", self._seed, error)
            return None, f"{error}" if isinstance(error, ScoreRejected) else "the evaluator stopped early"
        if error is not None:
            raise error
        return score, ""

    def _finish(
        self, text: str, score: float | None, error: str, info: dict[str, Any], status: str
    ) -> tuple[str, float, bool, dict[str, Any]]:
        self._done = True
        if error:
            info["eval_error"] = error
            status = EXIT_EVALUATION_ERROR
            text += f"\nEvaluation error: {error}\nFinal score: 0.0."
        elif score is not None:
            text += f" Final score: {score:.4f}."
        final = checked_score(score, self.game) if score is not None and not error else 0.0
        info["score"] = final
        info["exit_status"] = status
        logger.debug("episode finished: status=%s score=%.4f steps=%d", status, final, self._steps)
        return text, final, True, info

    def _remove_workspace(self) -> None:
        if self._cleanup is not None:
            self._cleanup()  # runs rmtree once; later calls are no-ops
            self._cleanup = None
        self.workspace = None
