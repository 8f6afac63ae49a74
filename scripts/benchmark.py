"""Benchmark the training loop: s/step split into generation / scoring / training, tokens/s,
peak memory and MFU against the device's measured matmul rate.

    python scripts/benchmark.py experiment=router_grpo trainer.max_steps=6 [more overrides]

Prints one JSON line (append it to docs/benchmarks.md with date, device and commit). The first
step is treated as warm-up and left out of the averages.

    python scripts/benchmark.py --profile=DIR [--profile-step=3] experiment=... [overrides]

also profiles one step (torch.profiler): its rollout and its actor update each get a kernel table
(``DIR/<part>_kernels.txt``, by self device time), a trace (``DIR/<part>_trace.json.gz``) and a
line in ``DIR/profile.json`` (wall seconds, device-busy seconds, kernel launches). The profiler
slows that step's host side (~3x on an H200), so take timings from a run without ``--profile``.

Besides the logged ``timing/*`` scalars (generation + scoring + training), the script clocks the
pipeline's own calls: ``wall_s_per_step`` spans a step from its rollout to the end of its weight
sync (everything a step costs, the push to a vLLM engine included: the figure to compare with a
peer's per-step wall time), ``weight_sync_s`` the push alone, ``engine_start_s`` the engine's
start-up (built and first synced once per run, not per step) and ``startup_s`` the process start
to the first step.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T_SCRIPT0 = time.perf_counter()


class PipelineClock:
    """Wall-clock spans of the run, read off the rollout pipeline's own calls (wrapped while
    ``watching``): the engine's start-up (``start``), each step from its ``rollout`` to the end of
    the ``sync_weights`` after it, and each of those syncs."""

    def __init__(self):
        self.engine_start_s = float("nan")
        self.first_step_at = float("nan")
        self.step_starts: list[float] = []
        self.steps_s: list[float] = []
        self.syncs_s: list[float] = []
        self._starting = False

    @contextmanager
    def watching(self, pipeline_cls):
        names = ("start", "rollout", "sync_weights")
        original = {name: getattr(pipeline_cls, name) for name in names}
        clock = self

        def start(pipeline, *a, **kw):
            t0, clock._starting = time.perf_counter(), True
            try:
                return original["start"](pipeline, *a, **kw)
            finally:
                clock._starting, clock.engine_start_s = False, time.perf_counter() - t0

        def rollout(pipeline, *a, **kw):
            clock.step_starts.append(time.perf_counter())
            if len(clock.step_starts) == 1:
                clock.first_step_at = clock.step_starts[0] - T_SCRIPT0
            return original["rollout"](pipeline, *a, **kw)

        def sync_weights(pipeline, *a, **kw):
            t0 = time.perf_counter()
            out = original["sync_weights"](pipeline, *a, **kw)
            if not clock._starting and clock.step_starts:
                clock.syncs_s.append(time.perf_counter() - t0)
                clock.steps_s.append(time.perf_counter() - clock.step_starts[-1])
            return out

        for name, fn in (("start", start), ("rollout", rollout), ("sync_weights", sync_weights)):
            setattr(pipeline_cls, name, fn)
        try:
            yield self
        finally:
            for name, fn in original.items():
                setattr(pipeline_cls, name, fn)

    def summary(self) -> dict:
        """Medians and means over the steps after the first (the warm-up), the start-up apart."""
        steps, syncs = self.steps_s[1:] or self.steps_s, self.syncs_s[1:] or self.syncs_s
        return {
            "wall_s_per_step": statistics.median(steps) if steps else float("nan"),
            "wall_s_per_step_all": [round(x, 4) for x in self.steps_s],
            "weight_sync_s": statistics.mean(syncs) if syncs else float("nan"),
            "engine_start_s": self.engine_start_s,
            "startup_s": self.first_step_at,
        }


class StepProfiler:
    """torch.profiler over one step's rollout (``pipeline_rollout``) and actor update
    (``_actor_updates``) apart, each synchronised at both ends so its wall time is its own."""

    PARTS = (("rollout", "pipeline_rollout"), ("actor", "_actor_updates"))

    def __init__(self, out: Path, step: int):
        self.out, self.step, self.summary = out, step, {}
        out.mkdir(parents=True, exist_ok=True)

    @contextmanager
    def watching(self, module_cls):
        original = {part: getattr(module_cls, name) for part, name in self.PARTS}
        for part, name in self.PARTS:
            setattr(module_cls, name, self._wrapped(part, original[part]))
        try:
            yield self
        finally:
            for part, name in self.PARTS:
                setattr(module_cls, name, original[part])
            (self.out / "profile.json").write_text(json.dumps(self.summary, indent=1) + "\n")

    def _wrapped(self, part: str, fn):
        profiler = self

        def run(module, *a, **kw):
            if module.global_step != profiler.step:
                return fn(module, *a, **kw)
            return profiler._profile(part, fn, module, *a, **kw)

        return run

    def _profile(self, part: str, fn, *a, **kw):
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        with profile(activities=activities) as prof:
            out = fn(*a, **kw)
            sync()
        wall = time.perf_counter() - t0
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        (self.out / f"{part}_kernels.txt").write_text(
            prof.key_averages().table(sort_by=sort, row_limit=60, max_name_column_width=90)
        )
        prof.export_chrome_trace(str(self.out / f"{part}_trace.json"))
        subprocess.run(["gzip", "-f", str(self.out / f"{part}_trace.json")], check=False)
        self.summary[part] = {
            "step": self.step,
            "wall_s": wall,
            "device_busy_s": sum(e.self_device_time_total for e in kernels) / 1e6,
            "kernel_launches": len(kernels),
        }
        return out


def step_model_flops(n_params: int, tokens: float, gen_tokens: float, cfg) -> float:
    """FLOPs the step needs (MFU's numerator), not the FLOPs a naive implementation spends.

    2N per generated token; 6N per token of the training forward + backward and 2N per token of the
    reference pass when KL is on, where a prompt counts once per group of G responses (it has to be
    processed once, and with ``algorithm.shared_prompt_forward`` it is). The PPO old-log-prob pass
    is left out: with one epoch over one mini-batch it does not run, and with several the generation
    step's own log-probs can replace it (``algorithm.old_log_prob_source: rollout``).
    """
    group = max(int(cfg.sampling.n_generations_per_prompt), 1)
    needed = (tokens - gen_tokens) / group + gen_tokens
    per_token = 6 + (2 if cfg.algorithm.use_kl_loss else 0)
    return 2 * n_params * gen_tokens + per_token * n_params * needed


def matmul_tflops(dtype: torch.dtype, device: str, n: int = 4096, iters: int = 20) -> float:
    """Measured dense matmul rate of the device for ``dtype`` (TFLOP/s)."""
    if device == "cpu":
        n, iters = 1024, 5
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def split_run_dir(overrides: list[str]) -> tuple[str, list[str]]:
    """The user's ``run_dir=`` (the last one wins) or a fresh temp dir, and the other overrides."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("run_dir=")]
    rest = [o for o in overrides if not o.startswith("run_dir=")]
    return (given[-1] if given else tempfile.mkdtemp(prefix="toolrouter-bench-")), rest


def split_profile(args: list[str]) -> tuple[Path | None, int, list[str]]:
    """(``--profile=DIR`` or None, ``--profile-step=N`` (3), the overrides)."""
    flags = {a.partition("=")[0]: a.partition("=")[2] for a in args if a.startswith("--profile")}
    if "" in flags.values() or not set(flags) <= {"--profile", "--profile-step"}:
        raise SystemExit(f"benchmark.py: give --profile=DIR and --profile-step=N, got {sorted(flags)}")
    rest = [a for a in args if not a.startswith("--profile")]
    out = Path(flags["--profile"]) if "--profile" in flags else None
    return out, int(flags.get("--profile-step", 3)), rest


def main(args: list[str]) -> dict:
    from src.config.job import compose_job
    from src.jobs.train import train
    from src.models.module import ToolRouterModule
    from src.rollout.pipeline import RolloutPipeline

    repo = Path(__file__).resolve().parents[1]
    profile_dir, profile_step, overrides = split_profile(args)
    run_dir, overrides = split_run_dir(overrides)
    cfg = compose_job(
        [f"cache_dir={repo / '.cache' / 'toolrouter'}", "name=benchmark", *overrides, f"run_dir={run_dir}"]
    )
    device = (
        "cuda" if torch.cuda.is_available() and cfg.trainer.accelerator in ("gpu", "cuda", "auto") else "cpu"
    )
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    profiler = StepProfiler(profile_dir, profile_step) if profile_dir else None
    profiling = profiler.watching(ToolRouterModule) if profiler else contextlib.nullcontext()
    with PipelineClock().watching(RolloutPipeline) as clock, profiling:
        _, objects = train(cfg)
    result = summarise(cfg, objects["module"], run_dir, device, clock.summary())
    result["overrides"] = overrides
    print(json.dumps(result))
    return result


def summarise(cfg, module, run_dir: str, device: str, clocked: dict) -> dict:
    """The JSON line: the logged ``timing/*`` means, the clocked spans, rates and MFU."""
    repo = Path(__file__).resolve().parents[1]
    from src.analysis import load_scalars

    series = load_scalars(run_dir)

    def avg(tag: str) -> float:
        if tag not in series:
            return float("nan")
        values = series[tag].dropna()
        return float((values.iloc[1:] if len(values) > 1 else values).mean())

    n_params = sum(p.numel() for p in module.actor.parameters())
    step_s = avg("timing/step_s")
    tokens = avg("train/tokens_per_sec") * step_s  # tokens of the batch per step (prompt + response)
    gen_tokens = avg("rollout/generated_tokens")
    flops = step_model_flops(n_params, tokens, gen_tokens, cfg)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    peak = matmul_tflops(dtype, device)
    wall = clocked["wall_s_per_step"]
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "params": n_params,
        "steps": cfg.trainer.max_steps,
        "s_per_step": step_s,
        **clocked,
        "generation_s": avg("timing/generation_s"),
        "scoring_s": avg("timing/scoring_s"),
        "training_s": avg("timing/training_s"),
        "tokens_per_s": avg("train/tokens_per_sec"),
        "generated_tokens_per_step": gen_tokens,
        "generation_tokens_per_s": gen_tokens / avg("timing/generation_s"),
        "run_dir": run_dir,
        "peak_mem_gib": (
            torch.cuda.max_memory_allocated()
            if device == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )
        / 2**30,
        "matmul_tflops": peak,
        "mfu": flops / step_s / (peak * 1e12) if not math.isnan(step_s) else float("nan"),
        "step_flops": flops,
        "mfu_wall": flops / wall / (peak * 1e12) if not math.isnan(wall) else float("nan"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        ).stdout.strip(),
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
