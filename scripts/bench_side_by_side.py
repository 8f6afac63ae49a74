"""Side by side with TRL's ``GRPOTrainer`` (issue 21): alternating runs, one process at a time.

    python scripts/bench_side_by_side.py --work $W --settings P4G4T64,P4G8T64,P4G4T128,P4G4T256 \\
        --engines hf,vllm --rounds 3
    # on a GPU, the ~0.37 B model in bf16 (../shared/bench/README.md):
    python scripts/bench_side_by_side.py --work $W --model q05b --device cuda --settings P8G8T256 \\
        --engines hf,hfgraph --rounds 2

``$W`` holds the model (``$W/<--model>``, default the 6.3 M ``m6``) and the cut prompts
(``$W/trunc512.parquet``) of ``../shared/bench/README.md``. Our engines: ``hf`` (decode=lean, eager:
``cuda_graph=false``), ``hfgraph`` (decode=lean replayed as CUDA graphs, the default on a GPU),
``hfcompile`` (decode=lean with ``lean_compile``: the step and sampler compiled, replayed as CUDA
graphs on a GPU), ``hfgen`` (HF generate), ``vllm``. Each round runs, per setting, TRL's peer, then ours with each
engine, each under ``/usr/bin/time -v`` with the same glibc allocator setting on every side (``--allocator
tuned``: ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=64GiB``; ``default`` leaves glibc alone). TRL
uses torch's default threads (both cores); ours runs with ``trainer.threads=null`` (the same). Before
each run: the 1-minute load average and a matmul probe (CPU: 2048x2048 fp32 on both threads; CUDA:
8192x8192 bf16). Where ``/usr/bin/time`` is missing, the context switches and page faults come from
``getrusage`` of the finished child (no peak RSS).

Writes one JSON line per run to ``--out`` (default ``$W/side_by_side.jsonl``; appended, so rounds of
several invocations pool) and prints a summary table over all lines of that file matching the
settings: s/step median (first step left out) per side, ours over TRL, generation s, start-up apart,
the weight push per step, and the step's share of the probe by the FLOPs it needs (2N per generated
token, 6N per trained token, a prompt once per group of G). Runs with more than
``--max-involuntary-cs`` involuntary context switches shared the cores with other work: flagged and
left out of the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEER = REPO.parent / "shared" / "bench" / "peers" / "trl_grpo.py"
ALLOCATOR = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
TIME_FIELDS = {
    "Involuntary context switches": "involuntary_cs",
    "Voluntary context switches": "voluntary_cs",
    "Minor (reclaiming a frame) page faults": "minor_faults",
    "Maximum resident set size (kbytes)": "max_rss_kib",
}


def parse_setting(text: str) -> dict:
    """``P4G8T64`` -> {"P": 4, "G": 8, "T": 64}."""
    m = re.fullmatch(r"P(\d+)G(\d+)T(\d+)", text.strip())
    if not m:
        raise ValueError(f"--settings: {text!r} is not of the form P<prompts>G<group>T<new tokens>")
    return {"P": int(m[1]), "G": int(m[2]), "T": int(m[3])}


def needed_flops(n_params: int, s: dict, prompt_tokens: float) -> float:
    """FLOPs one step needs: 2N per generated token, 6N per trained token, a prompt once per group."""
    generated = s["P"] * s["G"] * s["T"]
    return 2 * n_params * generated + 6 * n_params * (s["P"] * prompt_tokens + generated)


def matmul_gflops(device: str = "cpu") -> float:
    """The measured matmul rate the FLOP share is taken of: fp32 on CPU, bf16 on CUDA."""
    import torch

    n, reps, dtype = (2048, 5, torch.float32) if device == "cpu" else (8192, 20, torch.bfloat16)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9


def model_params(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                total += _numel(st.get_slice(k).get_shape())
    return total


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def trl_command(args, s: dict) -> list[str]:
    return [
        args.trl_python, str(args.peer), str(args.work / args.model), str(args.work / "trunc512.parquet"),
        "--steps", str(args.steps), "--prompts-per-step", str(s["P"]), "--group", str(s["G"]),
        "--max-new-tokens", str(s["T"]), "--max-prompt-tokens", "512", "--device", args.device,
        "--dtype", args.dtype,
    ]  # fmt: skip


def ours_command(args, s: dict, engine: str, run_dir: Path) -> list[str]:
    python = args.vllm_python if engine == "vllm" else args.python
    cmd = [
        python, str(REPO / "scripts" / "benchmark.py"), "experiment=grpo", f"model.path={args.work / args.model}",
        "model.warm_start=null", "data=rlla", f"data.train_files=[{args.work / 'trunc512.parquet'}]",
        "data.max_prompt_length=512", f"sampling.n_prompts={s['P']}", f"sampling.n_generations_per_prompt={s['G']}",
        f"sampling.max_new_tokens={s['T']}", f"sampling.min_new_tokens={s['T']}", "algorithm.use_kl_loss=false",
        f"trainer.max_steps={args.steps}", "trainer.save_freq=100000", "trainer.threads=null", f"run_dir={run_dir}",
    ]  # fmt: skip
    if args.device == "cuda":
        # bf16 weights under bf16 autocast: what TRL's --dtype bfloat16 (its bf16 flag) runs; the
        # update in one micro-batch of all P * G completions, as the peer's
        # per_device_train_batch_size (the job's default, 16, is sized for CPU memory)
        cmd += ["trainer.accelerator=gpu", f"model.dtype={args.dtype}",
                "trainer.precision=" + ("bf16-mixed" if args.dtype == "bfloat16" else "32-true"),
                f"algorithm.micro_batch_size={s['P'] * s['G']}"]  # fmt: skip
    if engine == "vllm":
        cmd += ["rollout=vllm", f"rollout.engines.vllm.kv_cache_memory_gib={args.vllm_kv_gib}",
                "rollout.engines.vllm.max_model_len=1024"]  # fmt: skip
    elif engine == "hfgraph":
        cmd += ["rollout.engines.hf.decode=lean", "rollout.engines.hf.cuda_graph=true"]
    elif engine == "hfcompile":  # decode=lean compiled with its sampler, as CUDA graphs on a GPU
        graph = "true" if args.device == "cuda" else "false"
        # prompt widths bucketed by 64: each new width compiles the step again (tens of seconds on a GPU)
        cmd += ["rollout.engines.hf.decode=lean", "rollout.engines.hf.lean_compile=true",
                f"rollout.engines.hf.cuda_graph={graph}", "rollout.engines.hf.pad_to_multiple_of=64"]  # fmt: skip
    elif engine == "hfgen":  # the HF engine with Hugging Face generate (an A/B under one load)
        cmd += ["rollout.engines.hf.decode=generate"]
    else:
        cmd += [f"rollout.engines.hf.decode={args.hf_decode}", "rollout.engines.hf.cuda_graph=false"]
    if "rollout.engines.hf.decode=generate" in cmd:  # HF generate draws every row from one stream
        cmd += ["rollout.keyed_draws=false"]
    if args.profile:  # benchmark.py's torch.profiler of one step, a folder per run
        cmd.insert(2, f"--profile={args.profile / run_dir.name}")
    return cmd + args.ours_extra.split()


def time_v(stderr: str) -> dict:
    """The ``/usr/bin/time -v`` fields we keep, from the end of a run's stderr."""
    out = {}
    for line in stderr.splitlines()[-40:]:
        key, _, value = line.strip().rpartition(": ")
        if key in TIME_FIELDS:
            out[TIME_FIELDS[key]] = int(value)
    return out


def rusage_delta(before) -> dict:
    """The ``time_v`` fields but peak RSS, from ``getrusage`` of the children that finished since."""
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "involuntary_cs": after.ru_nivcsw - before.ru_nivcsw,
        "voluntary_cs": after.ru_nvcsw - before.ru_nvcsw,
        "minor_faults": after.ru_minflt - before.ru_minflt,
    }


def last_json(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def run_one(args, side: str, s: dict, round_no: int, n_params: int) -> dict:
    tag = f"r{round_no}_{side}_P{s['P']}G{s['G']}T{s['T']}_{int(time.time())}"
    logs = args.work / "side_by_side_logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = trl_command(args, s) if side == "trl" else ours_command(args, s, side.split("-")[1], logs / tag)
    path = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
    env = {**os.environ, "PYTHONPATH": path, **(ALLOCATOR if args.allocator == "tuned" else {})}
    probe, load = matmul_gflops(args.device), os.getloadavg()[0]
    timed = Path("/usr/bin/time").exists()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        ["/usr/bin/time", "-v", *cmd] if timed else cmd,
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    (logs / f"{tag}.log").write_text(proc.stdout + "\n---- stderr ----\n" + proc.stderr)
    out = last_json(proc.stdout)
    row = {"tag": tag, "side": side, **s, "round": round_no, "allocator": args.allocator, "rc": proc.returncode,
           "load1_before": load, "load1_after": os.getloadavg()[0], "matmul_gflops_before": probe,
           "device": args.device, "dtype": args.dtype, "model": args.model, "date": time.strftime("%Y-%m-%d %H:%M"),
           "ours_extra": "" if side == "trl" else args.ours_extra,
           **(time_v(proc.stderr) if timed else rusage_delta(before))}  # fmt: skip
    if side == "trl" and out:
        prompt = statistics.mean(out["prompt_tokens_mean_per_step"])
        row.update(s_per_step=out["sec_per_step_median"], generation_s=out["gen_sec_per_step_median"],
                   startup_s=out["script_wall_sec"] - out["train_wall_sec"], weight_sync_s=0.0,
                   steps_all=out["sec_per_step_all"], gen_exact=out["gen_tokens_exact"])  # fmt: skip
    elif out:
        prompt = out["tokens_per_s"] * out["s_per_step"] / (s["P"] * s["G"]) - s["T"]
        row.update(s_per_step=out["wall_s_per_step"], generation_s=out["generation_s"],
                   startup_s=out["startup_s"], engine_start_s=out["engine_start_s"],
                   weight_sync_s=out["weight_sync_s"], training_s=out["training_s"],
                   steps_all=out["wall_s_per_step_all"], commit=out["commit"])  # fmt: skip
    if out:
        row["prompt_tokens_mean"] = prompt
        row["flop_share"] = needed_flops(n_params, s, prompt) / row["s_per_step"] / (probe * 1e9)
    return row


def _label(row: dict) -> str:
    """The side of a row, with the overrides ours ran under (``--ours-extra``) where there were any."""
    return " ".join(filter(None, (row["side"], row.get("ours_extra"))))


def summary(rows: list[dict], settings: list[dict], max_cs: int) -> str:
    """A markdown table: per setting and side, medians over the clean runs."""
    head = ("| setting | side | runs | s/step (each run) | ours / TRL rate | generation s | start-up s "
            "| push s | FLOP share of probe | invol. cs |")  # fmt: skip
    lines = [head, "|---" * 10 + "|"]
    for s in settings:
        sel = [r for r in rows if all(r.get(k) == s[k] for k in "PGT") and "s_per_step" in r]
        clean = [r for r in sel if r.get("involuntary_cs", 0) <= max_cs and r["rc"] == 0]
        trl = [r["s_per_step"] for r in clean if r["side"] == "trl"]
        for side in sorted({_label(r) for r in clean}, key=lambda x: x != "trl"):
            rs = [r for r in clean if _label(r) == side]
            med = statistics.median(r["s_per_step"] for r in rs)
            ratio = f"{statistics.median(trl) / med:.2f}×" if trl and side != "trl" else ""
            lines.append(
                f"| P{s['P']} G{s['G']} T{s['T']} | {side} | {len(rs)} | {med:.2f} ("
                + " / ".join(f"{r['s_per_step']:.2f}" for r in rs)
                + f") | {ratio} | "
                f"{statistics.median(r['generation_s'] for r in rs):.2f} | "
                f"{statistics.median(r['startup_s'] for r in rs):.1f} | "
                f"{statistics.median(r['weight_sync_s'] for r in rs):.3f} | "
                f"{statistics.median(r['flop_share'] for r in rs):.2f} | "
                + " / ".join(str(r.get("involuntary_cs", "?")) for r in rs)
                + " |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str]):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="holds the model folder and trunc512.parquet")
    ap.add_argument("--model", default="m6", help="the model's folder under --work")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument(
        "--dtype", choices=["float32", "bfloat16"], default=None, help="default: fp32 on CPU, bf16 on CUDA"
    )
    ap.add_argument("--settings", default="P4G4T64,P4G8T64,P4G4T128,P4G4T256")
    ap.add_argument(
        "--engines",
        default="hf,vllm",
        help="ours: hf (decode=lean), hfgraph (lean as CUDA graphs), hfcompile (lean compiled, CUDA graphs "
        "on a GPU), hfgen (HF generate), vllm; comma-separated",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--allocator", choices=["tuned", "default"], default="tuned")
    ap.add_argument("--trl-python", default="/work/venv-trl/bin/python")
    ap.add_argument(
        "--peer", type=Path, default=PEER, help="TRL's peer script (../shared/bench/peers/trl_grpo.py)"
    )
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--python", default=sys.executable, help="ours with the HF engine")
    ap.add_argument("--hf-decode", default="lean", choices=["lean", "loop", "generate"])
    ap.add_argument("--vllm-kv-gib", type=float, default=1.0)
    ap.add_argument("--no-trl", action="store_true", help="ours only (e.g. engine A/B under one load)")
    ap.add_argument("--ours-extra", default="", help="overrides added to ours' runs (space-separated)")
    ap.add_argument(
        "--profile", type=Path, default=None, help="profile one step of ours' runs into this folder"
    )
    ap.add_argument("--max-involuntary-cs", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    args.work = args.work.resolve()
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    out = args.out or args.work / "side_by_side.jsonl"
    settings = [parse_setting(x) for x in args.settings.split(",")]
    sides = ([] if args.no_trl else ["trl"]) + [f"ours-{e.strip()}" for e in args.engines.split(",")]
    n_params = model_params(args.work / args.model)
    for round_no in range(1, args.rounds + 1):
        for s in settings:
            for side in sides:
                row = run_one(args, side, s, round_no, n_params)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    rows = [
        r for r in rows
        if r.get("allocator") == args.allocator and r.get("device", "cpu") == args.device
        and r.get("model", "m6") == args.model
    ]  # fmt: skip
    print(summary(rows, settings, args.max_involuntary_cs))


if __name__ == "__main__":
    main(sys.argv[1:])
