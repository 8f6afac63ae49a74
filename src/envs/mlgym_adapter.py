"""``EpisodeEnv`` over the real MLGym (container-backed) environments.

MLGym registers each task as the gymnasium id ``mlgym/<task id>`` (its ``register_task``) and
its env speaks the 4-tuple ``step(action) -> (observation, reward, done, info)`` with reward always
0 and the evaluation metrics appended to ``info["score"]`` as a list of dicts such as
``[{"Score": 1.43}]``. This adapter:

* imports ``mlgym`` / ``gymnasium`` lazily and fails with a clear ImportError (package missing) or
  RuntimeError (no ``docker``/``podman`` on PATH) at construction;
* registers the task if needed and makes it with ``gymnasium.make(..).unwrapped``;
* returns a text first observation (MLGym's reset gives ``{"observation": None}``) and puts the
  task description in ``task_prompt``;
* turns the final metrics into a float: ``info["score"]`` (None when MLGym produced none, e.g.
  after ``exit_forfeit``), reward = that score (0.0 if None) on the final step; the raw list stays
  in ``info["mlgym_score"]``;
* ``os.chdir``s back to the directory it was built in before every reset and on close, because
  MLGym's task setup may leave the process inside the task workspace.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

logger = logging.getLogger(__name__)


def extract_mlgym_score(raw: Any, metric: str = "Score") -> float | None:
    """The last evaluation's ``metric`` from MLGym's ``info["score"]`` (list of dicts, a dict or a number).

    Falls back to the first numeric value of the last dict when ``metric`` is absent; None when
    there is nothing numeric (no evaluation happened).
    """
    if raw is None or isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, dict):
        if isinstance(raw.get(metric), (int, float)):
            return float(raw[metric])
        numeric = [v for v in raw.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return float(numeric[0]) if numeric else None
    if isinstance(raw, (list, tuple)):
        for item in reversed(raw):
            value = extract_mlgym_score(item, metric)
            if value is not None:
                return value
    return None


def _require_mlgym(container_type: str):
    try:
        import gymnasium
        from mlgym.environment.env import EnvironmentArguments
        from mlgym.environment.registration import register_task
    except ImportError as exc:
        raise ImportError(
            "MLGymAdapter needs the `mlgym` package (https://github.com/facebookresearch/MLGym) and "
            f"`gymnasium`; install them or use a local/... env instead ({exc})"
        ) from exc
    if shutil.which(container_type) is None:
        raise RuntimeError(f"MLGymAdapter needs the container runtime {container_type!r} on PATH")
    return gymnasium, EnvironmentArguments, register_task


class MLGymAdapter:
    """Real MLGym task as an ``EpisodeEnv``; ``task`` is the MLGym task id, e.g. ``battleOfSexes``."""

    def __init__(
        self,
        task: str,
        *,
        task_config_path: str | None = None,
        max_steps: int = 50,
        container_type: str = "docker",
        metric: str = "Score",
        env_args: dict[str, Any] | None = None,
        make_kwargs: dict[str, Any] | None = None,
    ) -> None:
        gymnasium, environment_arguments, register_task = _require_mlgym(container_type)
        self.task = task
        self.metric = metric
        self._home = os.getcwd()
        env_id = f"mlgym/{task}"
        if env_id not in gymnasium.registry:
            arguments = environment_arguments(
                task_config_path=task_config_path or f"tasks/{task}.yaml",
                max_steps=max_steps,
                container_type=container_type,
                **(env_args or {}),
            )
            register_task(arguments)
        self._env = gymnasium.make(env_id, **(make_kwargs or {})).unwrapped
        self.task_prompt = ""

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        os.chdir(self._home)  # a previous episode may have left us inside its workspace
        raw_obs, raw_info = self._env.reset(seed=seed)
        self.task_prompt = self._description()
        observation = raw_obs.get("observation") if isinstance(raw_obs, dict) else raw_obs
        if not observation:
            observation = f"New episode, seed {seed}. The task files are in the current directory."
        info = dict(raw_info or {})
        info.update(task_prompt=self.task_prompt, seed=seed)
        return str(observation), info

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        observation, _, done, raw_info = self._env.step(action)
        info = dict(raw_info or {})
        raw_score = info.get("score")
        info["mlgym_score"] = raw_score
        score = extract_mlgym_score(raw_score, self.metric)
        info["score"] = score
        reward = float(score) if done and score is not None else 0.0
        return "" if observation is None else str(observation), reward, bool(done), info

    def close(self) -> None:
        try:
            self._env.close()
        finally:
            os.chdir(self._home)

    def _description(self) -> str:
        for owner in (
            getattr(self._env, "task_args", None),
            getattr(getattr(self._env, "task", None), "args", None),
        ):
            text = getattr(owner, "description", None)
            if text:
                return str(text)
        logger.warning("MLGym task %s exposes no description; task_prompt is empty", self.task)
        return ""
