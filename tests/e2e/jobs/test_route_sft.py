"""Route-following warm-start examples, the SFT progress log and the router's progress-bar postfix."""

from __future__ import annotations

import json
import logging
import math
import zlib

import pytest

from src.callbacks.progress import eta_seconds, router_postfix
from src.datamodules.schema import extract_records
from src.datamodules.synthetic import TOOLS, generate_rlla_rows
from src.jobs.route_sft import DIRECT_ANSWER_XML, _request_text, route_following_examples
from src.rewards.rlla import compute_score, parse_tool_block
from src.router.families import ToolFamilies
from src.router.routes import weak_label


def _listed(messages) -> list[str]:
    system = messages[0]["content"]
    return [line.split("Name: ", 1)[1] for line in system.split("\n") if ". Name: " in line]


def _synthetic_records(n: int, seed: int):
    """``n`` synthetic rows as records, and as the dicts ``route_following_examples`` reads."""
    df = generate_rlla_rows(n, seed=seed, p_search=1, p_calculate=1, p_answer=1, low_gain=0.5)
    records, _ = extract_records(df, "synthetic")
    dicts = [
        {"messages": r.messages, "ground_truth": r.ground_truth, "data_source": r.data_source}
        for r in records
    ]
    return records, dicts


def test_every_row_under_every_route_with_route_following_targets():
    records, dicts = _synthetic_records(30, seed=3)
    families = ToolFamilies()
    pairs = route_following_examples(dicts, families, mode="only_family")
    assert len(pairs) == 3 * len(records)
    for k, record in enumerate(records):
        label = weak_label(
            record.ground_truth, families, descriptions={t: TOOLS[t].description for t in TOOLS}
        )
        (ans_msgs, ans), (s_msgs, s), (c_msgs, c) = pairs[3 * k : 3 * k + 3]
        assert "**Available Tools**" not in ans_msgs[0]["content"]
        assert ans == (record.ground_truth if label == "ANSWER" else DIRECT_ANSWER_XML)
        for family, msgs, target in (("search", s_msgs, s), ("calculate", c_msgs, c)):
            listed = _listed(msgs)
            assert listed and all(TOOLS[n].family == family for n in listed)  # only_family
            (call,) = parse_tool_block(target)
            assert call["name"] in listed  # the actor calls what the route lists
            if label == family.upper():
                assert target == record.ground_truth
            else:  # misrouted: the request goes into the first parameter; a wrong call scores low
                assert list(call["parameters"]) == [next(iter(TOOLS[call["name"]].parameters))]
                assert compute_score(target, record.ground_truth).total <= 0.0
            json.dumps(call)


@pytest.mark.parametrize("misrouted_tool", ["first", "request_hash"])
def test_misrouted_calls_name_the_first_listed_tool_or_the_one_the_request_hashes_to(misrouted_tool):
    records, dicts = _synthetic_records(60, seed=5)
    families = ToolFamilies()
    descriptions = {t: TOOLS[t].description for t in TOOLS}
    pairs = route_following_examples(dicts, families, mode="only_family", misrouted_tool=misrouted_tool)
    positions = []
    for k, record in enumerate(records):
        label = weak_label(record.ground_truth, families, descriptions=descriptions)
        for family, (msgs, target) in zip(("SEARCH", "CALCULATE"), pairs[3 * k + 1 : 3 * k + 3]):
            if label in (family, "MIXED"):
                continue
            listed = _listed(msgs)
            (call,) = parse_tool_block(target)
            want = 0 if misrouted_tool == "first" else zlib.crc32(_request_text(msgs).encode()) % len(listed)
            assert call["name"] == listed[want]
            positions.append(want)
    # the hash reaches every position of a two-tool family, so no list position predicts the call
    assert set(positions) == ({0} if misrouted_tool == "first" else {0, 1})


def test_misrouted_tool_is_validated_and_keys_only_a_non_default_warm_start(tmp_path):
    from src.config.job import compose_job
    from src.config.validate import ConfigError, validate
    from src.jobs.sft import _sft_key

    args = ["experiment=router_grpo", f"run_dir={tmp_path}"]
    assert "misrouted_tool" not in _sft_key(compose_job(args))  # the keys cached before it existed
    assert (
        _sft_key(compose_job(args + ["sft.misrouted_tool=request_hash"]))["misrouted_tool"] == "request_hash"
    )
    with pytest.raises(ConfigError, match="sft.misrouted_tool: 'last' is not one of"):
        validate(compose_job(args + ["sft.misrouted_tool=last"]))


def test_router_postfix_shows_lambda_cost_against_budget_and_route_mix():
    metrics = {
        "train/reward_task_mean": 0.5,
        "train/lambda": 1.25,
        "train/cost_mean": 0.31,
        "train/route_frac_answer": 0.5,
        "train/route_frac_search": 0.25,
        "train/route_frac_calculate": 0.25,
        "train/route_acc_answer": 0.9,
        "train/route_acc_family": float("nan"),
    }
    post = router_postfix(metrics, 0.3)
    assert post == {"reward": "0.50", "λ": "1.25", "cost": "0.31/B0.30", "a/s/c": "0.50/0.25/0.25"}
    assert router_postfix({"train/reward_task_mean": 1.0, "train/kl": 0.01}, None) == {
        "reward": "1.00",
        "kl": "0.01",
    }


def test_eta_is_the_mean_rate_times_the_steps_left():
    assert math.isinf(eta_seconds(0, 10, 5.0))
    assert eta_seconds(4, 10, 8.0) == 12.0 and eta_seconds(10, 10, 8.0) == 0.0


def test_sft_progress_is_logged_with_step_loss_and_eta(tmp_path, caplog, tiny_model_dir):
    import torch
    from src.config.job import compose_job

    from src.jobs.sft import train_on_examples
    from src.models.loading import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)
    ids = tok("<think> hi </think>")["input_ids"]
    examples = [{"input_ids": ids, "labels": ids} for _ in range(8)]
    cfg = compose_job(
        ["experiment=sft", f"run_dir={tmp_path}", "sft.max_steps=4", "sft.batch_size=4", "sft.lr=1e-3",
         "sft.log_every=2"]
    )  # fmt: skip
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="src.callbacks.progress"):
        train_on_examples(cfg, model, tok, examples, None)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("SFT step")]
    assert [line.split()[2] for line in lines] == ["2/4", "4/4"]
    assert all("loss" in line and "ETA" in line for line in lines)
