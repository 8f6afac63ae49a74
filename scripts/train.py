"""Entry point: python scripts/train.py experiment=router_grpo [overrides...]

A bad config exits 2 before Hydra creates the run directory, and so before anything is written:
the command's overrides are composed (unknown keys and wrong types: the schemas in src/config/) and
validated (ranges, cross-group problems, registry names: ``validate_job``), and the paths they name
are checked (run / cache directory, the data files' parquet footers, the run directory against
``resume``: ``start_problems``) first, each problem on one line naming the key. Then Hydra runs the
job. A user error only the job can find (malformed rows, prompts all too long, a model that does not
fit the checkpoint: a ``UserError``) is one line too, exit 2; a traceback is left for bugs."""

import logging
import signal
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from src.config.job import register_configs  # noqa: E402
from src.config.validate import ConfigError, UserError  # noqa: E402

CONFIG_ERROR_EXIT = 2
PREFLIGHT_VALIDATED = False  # preflight's answer: the job's config passed validate_job already
register_configs()


def _exit_now(signum: int, frame) -> None:
    logging.getLogger("toolrouter").warning("%s received: stopping", signal.Signals(signum).name)
    keep_exit_code_on_signals()
    raise SystemExit(128 + signum)


def exit_on_signals() -> None:
    """SIGINT / SIGTERM before the trainer's own handlers take over (while the config, model, data
    or a warm start are prepared) end the job with 128 + signal at once: cached artefacts are
    written atomically, so nothing half-written is left. Lightning composes this SIGTERM handler
    into its own, and the fit's callbacks replace both at the first step."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_now)


def keep_exit_code_on_signals() -> None:
    """Once the job is stopping on a signal, further SIGINT / SIGTERM are ignored: the interpreter
    resets Python-level handlers while it shuts down, so a second Ctrl-C arriving then would end
    the process by the signal itself (-2) instead of with the 130 / 143 already decided."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def preflight(argv: list[str]) -> bool:
    """Compose and validate the command's config; on a problem, say it (one line a problem, naming
    the key) and exit 2 before anything exists on disk. Returns whether it validated: with Hydra's
    own flags (``--cfg``, ``-m`` sweeps, ...) it leaves the command to Hydra and each job validates."""
    if any(arg.startswith("-") for arg in argv):
        return False
    from src.config.job import compose_job
    from src.jobs.checks import validate_job
    from src.jobs.start_checks import start_problems

    try:
        cfg = compose_job(argv)
        validate_job(cfg)
    except ConfigError as err:
        exit_on_user_error(err)
    except Exception as err:  # noqa: BLE001 - Hydra / OmegaConf composition errors, each naming the key
        sys.stderr.write(f"config error: {composition_error(err)}\n")
        sys.exit(CONFIG_ERROR_EXIT)
    problems = start_problems(cfg)  # the paths, once the config is known to be sound
    if problems:
        exit_on_user_error(ConfigError(problems))
    return True


def exit_on_user_error(err: UserError) -> None:
    """Say a user error on stderr, one line a problem (a ``ConfigError`` lists several), and exit 2."""
    if isinstance(err, ConfigError):
        lines = [f"config error: {problem}" for problem in err.problems]
    else:
        lines = [f"error: {' '.join(str(err).split())}"]  # one line, whatever the message held
    sys.stderr.write("".join(f"{line}\n" for line in lines))
    sys.exit(CONFIG_ERROR_EXIT)


def composition_error(err: BaseException) -> str:
    """One line of a composition error and its causes, without OmegaConf's ``full_key`` trailer."""
    parts, seen = [], err
    while seen is not None:
        for raw in str(seen).splitlines():
            line = raw.strip()
            if (
                line
                and not line.startswith(("full_key", "object_type", "reference_type"))
                and line not in parts
            ):
                parts.append(line)
        seen = seen.__cause__
    return " ".join(parts)


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> None:
    exit_on_signals()  # SIGINT / SIGTERM before the trainer's handlers: exit 130 / 143, never 1 or 0
    from src.jobs.train import train

    try:
        metrics, _ = train(cfg, validated=PREFLIGHT_VALIDATED)  # validated once, before Hydra's writes
    except UserError as err:  # found by the job (data rows, a checkpoint that does not fit): one line
        exit_on_user_error(err)
    except SystemExit as stop:
        if stop.code in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            keep_exit_code_on_signals()
        raise
    log_run_summary(cfg, metrics)


def log_run_summary(cfg: DictConfig, metrics: dict[str, float]) -> None:
    """A few lines on what the run achieved and where its outputs are (the RL jobs), or the final
    scalars (SFT). Every metric stays in TensorBoard."""
    log = logging.getLogger("toolrouter")
    if cfg.task == "sft":
        log.info("final metrics: %s", {k: round(v, 4) for k, v in sorted(metrics.items())})
        return
    from src.analysis import run_summary
    from src.jobs.build import resume_command

    budget = float(cfg.router.budget) if cfg.router.enable else None
    for line in run_summary(cfg.run_dir, budget, resume_command(cfg)):
        log.info("%s", line)


if __name__ == "__main__":
    exit_on_signals()
    PREFLIGHT_VALIDATED = preflight(sys.argv[1:])
    main()
