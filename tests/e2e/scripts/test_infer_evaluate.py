"""scripts/infer.py and scripts/evaluate.py on a real (2-step) router run, and src.jobs.inference."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from jobhelpers import run_script
from omegaconf import OmegaConf

ROUTES = {"answer", "search", "calculate"}


@pytest.fixture(scope="module")
def test_parquet(router_run):
    """The synthetic test split of the run's data (resolved from its manifest config)."""
    import yaml

    from src.jobs.build import data_files

    manifest = yaml.safe_load((router_run / "checkpoints" / "manifest.yaml").read_text())
    return data_files(OmegaConf.create(manifest["config"]))[1][0]


def test_infer_prompt_prints_route_prompt_response_and_tools(router_run):
    out = run_script("infer.py", "--run", str(router_run), "--prompt", "What is 12% of 250?").stdout
    route_line = next(line for line in out.splitlines() if line.startswith("[prompt] route:"))
    route = route_line.split("route:")[1].split()[0]
    assert route in ROUTES
    probs = [float(x.split("=")[1]) for x in route_line.split("probs:")[1].split()]
    assert len(probs) == 3 and abs(sum(probs) - 1) < 1e-2
    for section in ("--- route-specific system prompt ---", "--- response ---", "--- tools called ---"):
        assert section in out
    assert "<user> What is 12% of 250? </user>" in out
    # the default system prompt lists the default synthetic tools, rewritten for the route
    assert ("**Answer Directly**" in out) if route == "answer" else ("**Tool Preference**" in out)


def test_infer_parquet_json_with_forced_route(router_run, test_parquet):
    out = run_script(
        "infer.py",
        "--ckpt",
        str(router_run / "checkpoints" / "last.ckpt"),
        "--parquet",
        test_parquet,
        "--limit",
        "2",
        "--route",
        "answer",
        "--json",
    ).stdout
    *items, summary = [json.loads(line) for line in out.splitlines()]
    assert len(items) == 2
    assert summary == {
        "prompts": 2,
        "budget": None,
        "tool_route_rate": 0.0,
        "tool_call_rate": summary["tool_call_rate"],
    }
    expected_uids = pd.read_parquet(test_parquet)["extra_info"].map(lambda e: e["index"]).tolist()[:2]
    assert [it["id"] for it in items] == [f"uid {u}" for u in expected_uids]
    for it in items:
        assert it["route"] == "answer" and len(it["probs"]) == 3
        system = it["messages"][0]["content"]
        assert "**Available Tools**" not in system and "**Answer Directly**" in system
        assert it["cost"] == float(it["usage"]["used_any_tool"])  # router_grpo's cost is any_tool


def test_evaluate_routing_reports_shares_auc_and_a_budget_it_keeps(router_run, test_parquet, tmp_path):
    summary_path, rows_path = tmp_path / "routing.json", tmp_path / "routes.csv"
    out = run_script(
        "evaluate.py", "--run", str(router_run), "--routing", test_parquet, "--budget", "0.25",
        "--summary", str(summary_path), "--out", str(rows_path),
    ).stdout  # fmt: skip
    assert "label \\ route (greedy)" in out and "answer-vs-tool AUC" in out
    report = json.loads(summary_path.read_text())
    n = report["n"]
    assert n == len(pd.read_parquet(test_parquet))
    for reading in ("greedy", "sampled"):
        assert 0.0 <= report[reading]["tool_rate"] <= 1.0
    assert sum(row["n"] for row in report["shares_greedy"].values()) == n
    # calibrated on the same prompts: at most floor(B * n) of them go to a tool
    assert report["budgeted"]["tool_rate"] <= int(0.25 * n) / n + 1e-9
    assert report["calibration"]["tool_rate"] == report["budgeted"]["tool_rate"]
    # --out: one row per prompt, the same readings as the report
    rows = pd.read_csv(rows_path)
    assert len(rows) == n and rows["user"].tolist() == [
        m[1]["content"] for m in pd.read_parquet(test_parquet)["prompt"]
    ]
    probs = rows[["p_answer", "p_search", "p_calculate"]].to_numpy()
    assert abs(probs.sum(1) - 1).max() < 1e-6
    assert (rows["greedy_route"] != "answer").mean() == pytest.approx(report["greedy"]["tool_rate"])
    for label, share in report["shares_greedy"].items():
        mine = rows[rows["weak_label"] == label]
        assert len(mine) == share["n"] and (mine["greedy_route"] == "search").mean() == pytest.approx(
            share["search"]
        )


def test_evaluate_calibrates_on_the_calibration_split_and_prints_the_budgeted_metrics(
    router_run, test_parquet
):
    """--calibrate the run's calibration split (data.synthetic.n_calib): the threshold is set there
    and the held-out tool rate is what it realises on --routing's prompts; the JSON line printed
    last carries the budgeted metrics and the calibration."""
    import yaml

    from src.datamodules.prepare import calibration_files

    config = yaml.safe_load((router_run / "checkpoints" / "manifest.yaml").read_text())["config"]
    d = config["data"]
    calib = calibration_files(d["kind"], d["calib_files"], d["synthetic"], config["cache_dir"])[0]
    out = run_script("evaluate.py", "--run", str(router_run), "--routing", test_parquet, "--budget", "0.25",
               "--calibrate", calib).stdout  # fmt: skip
    printed = json.loads(out.strip().splitlines()[-1])
    assert printed["calibration"]["calibrated_on"] == calib and printed["calibration"]["tool_rate"] <= 16 / 64
    routes = pd.read_parquet(router_run / "rollouts" / "val" / "routes_00000005.parquet")
    threshold = printed["calibration"]["threshold"]
    p_route = routes[["p_search", "p_calculate"]].max(axis=1)
    expected = float((p_route >= threshold).mean())  # the last validation's readings
    assert printed["budgeted"]["tool_rate"] == pytest.approx(expected, abs=1 / len(routes))


def test_infer_route_only_under_a_budget_keeps_it_on_held_out_prompts(router_run, test_parquet):
    out = run_script(
        "infer.py", "--run", str(router_run), "--parquet", test_parquet, "--limit", "0", "--budget", "0.5",
        "--calibrate", test_parquet, "--route-only",
    ).stdout  # fmt: skip
    *items, summary = [json.loads(line) for line in out.splitlines()]
    assert summary["prompts"] == len(items) == len(pd.read_parquet(test_parquet))
    assert summary["budget"] == 0.5 and summary["tool_route_rate"] <= 0.5
    assert summary["tool_route_rate"] == sum(it["route"] != "answer" for it in items) / len(items)


def test_evaluate_summary_and_rows(router_run, test_parquet, tmp_path):
    rows_file = tmp_path / "rows.csv"
    proc = run_script(
        "evaluate.py",
        "--run",
        str(router_run),
        "--parquet",
        test_parquet,
        "--limit",
        "12",
        "--out",
        str(rows_file),
        "--batch-size",
        "6",
    )
    summary = json.loads(proc.stdout)
    for key in (
        "checkpoint",
        "n",
        "reward",
        "route_mix",
        "tool_call_rate",
        "mean_cost",
        "route_vs_weak_label",
        "weak_label_counts",
        "skipped_rows",
    ):
        assert key in summary, key
    assert summary["n"] == 12 and summary["global_step"] == 6
    assert set(summary["reward"]) == {"total", "format", "correctness", "length"}
    assert -5.0 <= summary["reward"]["total"] <= 5.0
    assert set(summary["route_mix"]) == ROUTES and abs(sum(summary["route_mix"].values()) - 1) < 1e-9
    assert 0.0 <= summary["tool_call_rate"] <= 1.0 and summary["mean_cost"] >= 0.0
    versus = summary["route_vs_weak_label"]
    assert versus["accuracy"] is None or 0.0 <= versus["accuracy"] <= 1.0
    assert sum(sum(r.values()) for r in versus["confusion"].values()) == 12  # synthetic rows all have a label
    assert sum(summary["weak_label_counts"].values()) == 12

    rows = pd.read_csv(rows_file)
    assert len(rows) == 12 and set(rows["route"]) <= ROUTES
    assert rows["used_tool"].mean() == pytest.approx(summary["tool_call_rate"])
    assert rows["reward_task"].mean() == pytest.approx(summary["reward"]["total"])
    # accuracy recomputed with a plain loop over the rows
    labelled = [(r.weak_label, r.route) for r in rows.itertuples() if r.weak_label != "MIXED"]
    if labelled:
        hits = sum(label.lower() == route for label, route in labelled)
        assert versus["accuracy"] == pytest.approx(hits / len(labelled))
    probs = rows[["p_answer", "p_search", "p_calculate"]].to_numpy()
    assert abs(probs.sum(1) - 1).max() < 1e-4


def test_load_router_policy_restores_checkpoint_weights(router_run):
    from src.datamodules.synthetic import TOOLS, build_system_prompt, build_user_turn
    from src.jobs.inference import InferenceSettings, load_router_policy

    policy = load_router_policy(router_run, device="cpu")
    assert policy.module.reference is None and policy.has_router
    state = torch.load(router_run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)[
        "state_dict"
    ]
    mine = policy.module.state_dict()
    for key in ("router_head.mlp.4.weight", "actor.lm_head.weight", "lagrange.lam"):
        assert torch.equal(mine[key], state[key]), key
    messages = [
        {"role": "system", "content": build_system_prompt([TOOLS["calculator"], TOOLS["web_search"]])},
        {"role": "user", "content": build_user_turn("Compute 3*7.")},
    ]
    route, probs = policy.route(messages)
    assert route in ROUTES and probs[["answer", "search", "calculate"].index(route)] == max(probs)
    result = policy.respond(messages, route="search", settings=InferenceSettings(max_new_tokens=4))
    assert result.route == "search" and result.response_length <= 4
    assert "**Tool Preference**" in result.messages[0]["content"]
    # with ground truths the answer is scored by the collector's scorer: reward parts and weak label
    from src.rewards.dispatch import score

    truth = '<tool_call>\n{"name": "calculator", "parameters": {"expression": "3*7"}}\n</tool_call>'
    (scored,) = policy.respond_batch(
        [messages], ["rlla"], settings=InferenceSettings(max_new_tokens=4), ground_truths=[truth]
    )
    assert scored.weak_label == "CALCULATE" and scored.route in ROUTES
    expected = score("rlla", scored.response, truth, step=0, config=policy.reward_config)
    assert scored.reward == expected and "reward" not in result.to_dict()
    with pytest.raises(ValueError, match="ground truths"):
        policy.respond_batch([messages], ["rlla"], ground_truths=[truth, truth])


def test_parse_tool_calls_names_parameters_and_unreadable_lines():
    from src.jobs.inference import parse_tool_calls

    text = (
        '<think> a <tool_call> quoted </think>\n<tool_call>\n{"name": "calculator", "parameters": {"expression": "1+2"}}\n'
        "not json\n</tool_call>\n<response> 3 </response>"
    )
    calls = parse_tool_calls(text, "xml")
    assert [(c.name, c.parameters) for c in calls] == [("calculator", {"expression": "1+2"}), (None, None)]
    assert calls[1].raw == "not json"
    assert parse_tool_calls("<think> x </think>\n<response> hi </response>") == []
    harmony = (
        '<|start|>assistant to=functions.web_search<|channel|>commentary json<|message|>{"query":"oslo"}'
        "<|call|>"
    )
    assert [(c.name, c.parameters) for c in parse_tool_calls(harmony, "harmony")] == [
        ("web_search", {"query": "oslo"})
    ]
    with pytest.raises(ValueError, match="format"):
        parse_tool_calls(text, "yaml")
