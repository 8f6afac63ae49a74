"""The side-by-side driver's parsing and accounting, and benchmark.py's pipeline clock."""

import time

import pytest

from scripts.bench_side_by_side import needed_flops, parse_setting, summary, time_v
from scripts.benchmark import PipelineClock


def test_settings_parse_and_a_bad_one_is_named():
    assert parse_setting("P4G8T128") == {"P": 4, "G": 8, "T": 128}
    with pytest.raises(ValueError, match="P4G8"):
        parse_setting("P4G8")


def test_needed_flops_count_a_prompt_once_per_group():
    s = {"P": 2, "G": 3, "T": 5}
    n, prompt = 10, 7.0
    expected = 0.0
    for _ in range(s["P"]):
        expected += 6 * n * prompt  # the prompt, trained once for its group
        for _ in range(s["G"]):
            expected += (2 + 6) * n * s["T"]  # each response token: generated, then trained
    assert needed_flops(n, s, prompt) == expected


def test_time_v_fields_are_read_from_the_end_of_stderr():
    err = "noise\n\tInvoluntary context switches: 123\n\tMaximum resident set size (kbytes): 2048\n"
    assert time_v(err) == {"involuntary_cs": 123, "max_rss_kib": 2048}


def test_summary_leaves_out_disturbed_and_failed_runs():
    base = {"P": 4, "G": 4, "T": 64, "rc": 0, "generation_s": 1.0, "startup_s": 5.0,
            "weight_sync_s": 0.0, "flop_share": 0.1}  # fmt: skip
    rows = [
        {**base, "side": "trl", "s_per_step": 8.0, "involuntary_cs": 10},
        {**base, "side": "ours-hf", "s_per_step": 2.0, "involuntary_cs": 10},
        {**base, "side": "ours-hf", "s_per_step": 50.0, "involuntary_cs": 99999},
        {**base, "side": "ours-hf", "s_per_step": 60.0, "involuntary_cs": 5, "rc": 1},
    ]
    table = summary(rows, [parse_setting("P4G4T64")], max_cs=1000)
    hf = next(line for line in table.splitlines() if "ours-hf" in line)
    assert "| 1 | 2.00 (2.00) | 4.00× |" in hf


def test_pipeline_clock_spans_each_step_from_rollout_to_the_end_of_its_sync():
    class Pipeline:
        def start(self):
            self.sync_weights()  # the start-up sync is not a step's

        def rollout(self):
            time.sleep(0.02)

        def sync_weights(self):
            time.sleep(0.01)

    clock = PipelineClock()
    with clock.watching(Pipeline):
        p = Pipeline()
        p.start()
        for _ in range(3):
            p.rollout()
            p.sync_weights()
    assert Pipeline.rollout.__name__ == "rollout" and "watching" not in Pipeline.start.__qualname__
    out = clock.summary()
    assert len(out["wall_s_per_step_all"]) == 3 and out["wall_s_per_step"] >= 0.03
    assert 0.01 <= out["weight_sync_s"] < out["wall_s_per_step"] and out["engine_start_s"] >= 0.01


@pytest.mark.parametrize(
    "engine,graph,decode",
    [
        ("hf", False, "lean"),
        ("hfgraph", True, "lean"),
        ("hfcompile", True, "lean"),
        ("hfgen", "auto", "generate"),
    ],
)
def test_our_gpu_command_composes_a_bf16_gpu_job_with_the_engine_it_names(tmp_path, engine, graph, decode):
    """Our side of a CUDA comparison: bf16 weights under bf16 autocast on the GPU, the HF engine
    eager (``hf``), as CUDA graphs (``hfgraph``), compiled with its sampler and captured
    (``hfcompile``, prompt widths bucketed so one compile serves every step) or HF generate
    (``hfgen``), the update in one micro-batch as TRL's; the overrides compose."""
    from scripts.bench_side_by_side import ours_command, parse_args
    from src.config.job import compose_job

    args = parse_args(["--work", str(tmp_path), "--model", "q05b", "--device", "cuda"])
    args.dtype = "bfloat16"  # what main() derives for --device cuda
    cmd = ours_command(args, parse_setting("P8G8T256"), engine, tmp_path / "run")
    overrides = cmd[cmd.index("experiment=grpo") :]
    cfg = compose_job([o for o in overrides if not o.startswith("run_dir=")])
    assert (cfg.trainer.accelerator, cfg.model.dtype, cfg.trainer.precision) == (
        "gpu",
        "bfloat16",
        "bf16-mixed",
    )
    assert cfg.model.path == str(tmp_path / "q05b")
    assert (cfg.rollout.engines.hf.cuda_graph, cfg.rollout.engines.hf.decode) == (graph, decode)
    assert cfg.rollout.keyed_draws == (decode != "generate")  # HF generate has one stream (validate)
    assert (cfg.sampling.max_new_tokens, cfg.sampling.min_new_tokens) == (256, 256)
    assert cfg.algorithm.micro_batch_size == 64  # one micro-batch of P * G, as TRL's peer
    compiled = engine == "hfcompile"
    assert (cfg.rollout.engines.hf.lean_compile, cfg.rollout.engines.hf.pad_to_multiple_of > 1) == (
        compiled,
        compiled,
    )


def test_rusage_delta_counts_only_the_children_finished_since():
    import resource
    import subprocess
    import sys

    from scripts.bench_side_by_side import rusage_delta

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "x = bytearray(64 << 20)"], check=True)
    delta = rusage_delta(before)
    assert set(delta) == {"involuntary_cs", "voluntary_cs", "minor_faults"}
    assert delta["minor_faults"] > (64 << 20) // 4096 // 2  # the child touched 64 MiB
    assert min(delta.values()) >= 0


def test_extra_overrides_and_the_profile_folder_reach_ours_and_label_its_rows(tmp_path):
    """``--ours-extra`` ends our command (the last override wins), ``--profile`` gives each run its
    own folder, and the summary keeps runs under other overrides apart."""
    from scripts.bench_side_by_side import ours_command, parse_args, summary

    args = parse_args(["--work", str(tmp_path), "--ours-extra", "algorithm.micro_batch_size=4 a.b=1",
                       "--profile", str(tmp_path / "prof")])  # fmt: skip
    args.dtype = "float32"
    cmd = ours_command(args, parse_setting("P2G2T8"), "hf", tmp_path / "run7")
    assert cmd[-2:] == ["algorithm.micro_batch_size=4", "a.b=1"]
    assert f"--profile={tmp_path / 'prof' / 'run7'}" in cmd[2:3]
    row = {"P": 2, "G": 2, "T": 8, "rc": 0, "s_per_step": 1.0, "generation_s": 0.5, "startup_s": 1.0,
           "weight_sync_s": 0.0, "flop_share": 0.1}  # fmt: skip
    rows = [{**row, "side": "ours-hf", "ours_extra": ""}, {**row, "side": "ours-hf", "ours_extra": "a.b=1"}]
    table = summary(rows, [parse_setting("P2G2T8")], max_cs=10)
    assert "| ours-hf | 1 |" in table and "| ours-hf a.b=1 | 1 |" in table
