"""Benchmark the training loop: s/step split into generation / scoring / training, tokens/s,
peak memory and MFU against the device's measured matmul rate.

    python scripts/benchmark.py experiment=router_grpo trainer.max_steps=6 [more overrides]

Prints one JSON line (append it to docs/benchmarks.md with date, device and commit). The first
step is treated as warm-up and left out of the averages.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


def main(overrides: list[str]) -> dict:
    from src.config.compose import compose_job
    from src.jobs.train import train

    repo = Path(__file__).resolve().parents[1]
    run_dir, overrides = split_run_dir(overrides)
    cfg = compose_job(
        [f"cache_dir={repo / '.cache' / 'toolrouter'}", "name=benchmark", *overrides, f"run_dir={run_dir}"]
    )
    device = (
        "cuda" if torch.cuda.is_available() and cfg.trainer.accelerator in ("gpu", "cuda", "auto") else "cpu"
    )
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _, objects = train(cfg)
    module = objects["module"]
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
    result = {
        "overrides": overrides,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "params": n_params,
        "steps": cfg.trainer.max_steps,
        "s_per_step": step_s,
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
        "mfu": flops / step_s / (peak * 1e12) if step_s == step_s else float("nan"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        ).stdout.strip(),
        "date": time.strftime("%Y-%m-%d"),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
