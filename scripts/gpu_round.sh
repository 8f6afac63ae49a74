#!/usr/bin/env bash
# One round of the GPU checks on a lent machine (docs/benchmarks.md, "GPU"), in priority order under
# one deadline, each part with its own log:
#   1. the environment (GPU, torch, transformers, the wheels it lacks installed from WHEELS);
#   2. the decode tests on CUDA: the CUDA-graph lean step and the compiled lean step with its sampler
#      (tests/unit/rollout/engines/test_hf_graph.py, test_hf_compile.py, marker gpu);
#   3. the ~0.37 B setting of ../shared/bench/README.md (P8 G8 T256, bf16) side by side with TRL:
#      TRL, ours as CUDA graphs (hfgraph, the default on a GPU), ours compiled + graphed (hfcompile);
#   4. the gpu-marked job tests (bf16 on one GPU; FSDP2, ZeRO-2, ZeRO-3 with checkpoint + resume);
#   5. the main job's steps (scripts/benchmark.py experiment=router_grpo on the GPU, bf16);
#   6. one step of ours (hfcompile) profiled: its rollout and actor update apart (kernel tables and
#      traces; scripts/benchmark.py --profile);
#   7. a second side-by-side round, in the other order, where time is left.
#
#   scripts/gpu_round.sh OUT SHARE [WHEELS] [DEADLINE_S] [PARTS]
# PARTS (default 2,3,4,5,6,7; the environment always comes first) picks parts, e.g. a second call on
# the warm machine with 6,7 where the first call's deadline cut them (on 2026-11-28 parts 1-5 took
# ~520 s of an H200: the job tests alone ~200 s).
# SHARE holds bench/ (a copy of ../shared/bench) and data/rlla_4k/test.parquet +
# data/rlla_4k_raw/rlla_sft.json; WHEELS (optional) a folder of wheels for packages the image lacks
# (hydra-core, omegaconf, trl, datasets, deepspeed, ...). Everything lands under OUT.
set -u
OUT=$(realpath "$1"); SHARE=$(realpath "$2"); WHEELS=${3:-}; DEADLINE=${4:-540}; PARTS=",${5:-2,3,4,5,6,7},"
REPO=$(cd "$(dirname "$0")/.." && pwd)
START=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - START))); }
want() { [[ "$PARTS" == *",$1,"* ]]; }
part() { echo "== $(date -u +%H:%M:%S) +$(($(date +%s) - START))s: $*"; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

part "1. environment"
if [ -n "$WHEELS" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import sys, torch, transformers, lightning; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__, torch.cuda.get_device_name())"
  python3 -c "import trl, datasets, hydra, deepspeed; print('trl', trl.__version__, 'datasets', datasets.__version__, 'hydra', hydra.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | tail -1
  # a device copy of the tree may carry older git metadata than its files: the diff says so
  git -C "$REPO" log -1 --format='commit %h %s' 2>/dev/null || echo "commit: (no git)"
  git -C "$REPO" status --short 2>/dev/null | head -20
} 2>&1 | tee "$OUT/env.txt"

W=/tmp/bench
mkdir -p $W
python3 "$SHARE/bench/make_tiny_model.py" $W/q05b --parquet "$SHARE/data/rlla_4k/test.parquet" \
  --sft-json "$SHARE/data/rlla_4k_raw/rlla_sft.json" --hidden 896 --layers 24 --heads 14 --kv-heads 2 \
  --intermediate 4864 --vocab 8192 --seed 0 2>&1 | tail -2
python3 "$SHARE/bench/truncate_parquet.py" $W/q05b "$SHARE/data/rlla_4k/test.parquet" $W/trunc512.parquet 2>&1 | tail -1

cd "$REPO"
if want 2; then
  part "2. decode tests on CUDA"
  timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/unit/rollout/engines/test_hf_graph.py \
    tests/unit/rollout/engines/test_hf_compile.py 2>&1 | tail -15 | tee "$OUT/decode_tests.log"
fi

side_by_side() {  # $1 = our engines (TRL runs first), then bench_side_by_side.py's own flags
  timeout "$(left)" python3 scripts/bench_side_by_side.py --work $W --model q05b --device cuda --settings P8G8T256 \
    --engines "$1" --rounds 1 --steps 6 --allocator default --trl-python python3 --peer "$SHARE/bench/peers/trl_grpo.py" \
    --out "$OUT/side_by_side.jsonl" "${@:2}" 2>&1 | grep -v '^{' | tail -8
}
if want 3; then
  part "3. 0.37 B side by side, round 1 ($(left) s left)"
  side_by_side hfgraph,hfcompile
fi

if want 4 && [ "$(left)" -gt 200 ]; then
  part "4. gpu job tests ($(left) s left)"
  timeout $(($(left) - 90)) python3 -m pytest -v -m gpu -p no:cacheprovider tests/e2e/jobs/test_gpu_jobs.py 2>&1 | tail -40 > "$OUT/gpu_job_tests.log"
  tail -5 "$OUT/gpu_job_tests.log"
fi

if want 5 && [ "$(left)" -gt 80 ]; then
  part "5. main job steps on the GPU ($(left) s left)"
  timeout $(($(left) - 10)) python3 scripts/benchmark.py experiment=router_grpo trainer.accelerator=gpu \
    trainer.precision=bf16-mixed model.dtype=bfloat16 trainer.max_steps=6 trainer.threads=null \
    > "$OUT/main_job.log" 2>&1
  grep '^{' "$OUT/main_job.log" | tail -1 | tail -c 600; echo
fi

if want 6 && [ "$(left)" -gt 150 ]; then
  part "6. one step of ours profiled ($(left) s left)"
  side_by_side hfcompile --no-trl --steps 5 --profile $W/profile --out $W/profiled_runs.jsonl
  cat $W/profile/*/profile.json
fi

if want 7 && [ "$(left)" -gt 150 ]; then
  part "7. 0.37 B side by side, round 2 ($(left) s left)"
  side_by_side hfcompile,hfgraph
fi
part "done"
# the runs' logs and the profile only: their run folders hold checkpoints of the 0.37 B model (GBs;
# taring them outran the first call's limit on 2026-11-25). One archive: a device call returns at
# most 8 files.
(cd $W && { find side_by_side_logs -maxdepth 1 -name '*.log'; find profile -type f -size -5M 2>/dev/null; ls profiled_runs.jsonl 2>/dev/null; } \
  | tar czf "$OUT/logs.tgz" -T -)
