"""Synthetic RLLA rows: exact ToolRL schema, seeded determinism, proportions, max reward, short prompts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from src.datamodules.schema import RLLA_ARROW_SCHEMA, extract_records
from src.datamodules.synthetic import (
    TOOLS,
    SyntheticOptions,
    build_system_prompt,
    generate_rlla_rows,
    ground_truth_family,
    is_vague_request,
    prompt_texts,
    user_texts,
    write_synthetic_rlla,
)
from src.rewards.rlla import compute_score, format_ok, parse_tool_block

REPO = Path(__file__).resolve().parents[3]
REAL_TEST = REPO / ".." / "shared" / "data" / "rlla_4k" / "test.parquet"


def _gts(df: pd.DataFrame) -> list[str]:
    return [r["ground_truth"] for r in df["reward_model"]]


def test_schema_equals_toolrl_file(tmp_path):
    paths = write_synthetic_rlla(tmp_path, n_train=30, n_test=10, seed=0)
    for split, path in paths.items():
        schema = pq.read_schema(path)
        assert schema.equals(RLLA_ARROW_SCHEMA, check_metadata=False), split
        df = pd.read_parquet(path)
        assert set(df["ability"]) == {"math"}
        assert {r["style"] for r in df["reward_model"]} == {"rule"}
        assert {e["split"] for e in df["extra_info"]} == {split}
    if not REAL_TEST.is_file():
        pytest.skip("real RLLA data not present")
    real = pq.read_schema(REAL_TEST)
    assert pq.read_schema(paths["train"]).equals(real, check_metadata=False)


def test_uids_unique_over_both_splits_and_extra_info_mirrors_prompt(tmp_path):
    paths = write_synthetic_rlla(tmp_path, n_train=50, n_test=20, seed=3)
    train, test = pd.read_parquet(paths["train"]), pd.read_parquet(paths["test"])
    uids = [e["index"] for e in train["extra_info"]] + [e["index"] for e in test["extra_info"]]
    assert sorted(uids) == list(range(70))
    for _, row in train.iterrows():
        system, user = row["prompt"]
        assert (system["role"], user["role"]) == ("system", "user")
        e = row["extra_info"]
        assert e["instruction"] == system["content"] and e["input"] == user["content"]
        assert e["output"] == row["reward_model"]["ground_truth"]


def test_calibration_split_is_held_out_phrasing_apart_from_train_and_test(tmp_path):
    """n_calib: prompts from the test split's held-out templates whose prompt texts are in neither
    train nor test (the budget's threshold then never sees a prompt it is scored on), in test's mix
    of families and vague requests; uids after test's; the same file from the same seed; train and
    test as without it."""
    mix = SyntheticOptions(p_search=0.3, p_calculate=0.3, p_answer=0.4, low_gain=0.5)  # the demo's
    paths = write_synthetic_rlla(tmp_path / "a", n_train=200, n_test=400, seed=1, options=mix, n_calib=400)
    plain = write_synthetic_rlla(tmp_path / "b", n_train=200, n_test=400, seed=1, options=mix)
    frames = {split: pd.read_parquet(path) for split, path in paths.items()}
    calib = frames["calib"]
    assert len(calib) == 400 and {e["split"] for e in calib["extra_info"]} == {"calib"}
    texts = {split: set(prompt_texts(f)) for split, f in frames.items()}
    assert not texts["calib"] & texts["test"] and not texts["calib"] & texts["train"]
    assert not set(user_texts(calib)) & set(user_texts(frames["train"]))  # held-out templates only
    for split in ("test", "calib"):  # the same mix: a threshold set on one transfers to the other
        vague = sum(map(is_vague_request, user_texts(frames[split])))
        families = Counter(ground_truth_family(gt) for gt in _gts(frames[split]))
        assert abs(vague - 0.5 * 0.6 * 400) <= 25 and abs(families["answer"] - 0.4 * 400) <= 25, split
    assert min(e["index"] for e in calib["extra_info"]) >= 600
    for split in ("train", "test"):
        pd.testing.assert_frame_equal(frames[split], pd.read_parquet(plain[split]))
    again = write_synthetic_rlla(tmp_path / "c", n_train=200, n_test=400, seed=1, options=mix, n_calib=400)
    pd.testing.assert_frame_equal(calib, pd.read_parquet(again["calib"]))


def test_deterministic_by_seed():
    a, b = generate_rlla_rows(40, seed=7), generate_rlla_rows(40, seed=7)
    assert a.to_json() == b.to_json()
    c = generate_rlla_rows(40, seed=8)
    assert _gts(a) != _gts(c)


@pytest.mark.parametrize("p", [(0.5, 0.3, 0.2), (1.0, 0.0, 0.0), (0.2, 0.2, 0.6)])
def test_family_proportions(p):
    n = 200
    df = generate_rlla_rows(n, seed=1, p_search=p[0], p_calculate=p[1], p_answer=p[2])
    counts = Counter(ground_truth_family(g) for g in _gts(df))
    for fam, share in zip(("search", "calculate", "answer"), p):
        assert abs(counts.get(fam, 0) - share * n) <= 1, (fam, counts)
    assert set(counts) <= {"search", "calculate", "answer"}


def test_bad_proportions_rejected():
    with pytest.raises(ValueError, match="proportions"):
        generate_rlla_rows(5, seed=0, p_search=-1)
    with pytest.raises(ValueError, match="proportions"):
        generate_rlla_rows(5, seed=0, p_search=0, p_calculate=0, p_answer=0)


def test_ground_truth_scores_maximum():
    df = generate_rlla_rows(300, seed=2)
    for gt in _gts(df):
        score = compute_score(gt, gt)
        if "<tool_call>" in gt:
            assert (score.format, score.correctness) == (1.0, 3.0), gt
        else:
            assert (score.format, score.correctness) == (1.0, 0.0), gt
        assert format_ok(gt, gt)


def _listed(system: str) -> list[str]:
    return [line.split("Name: ", 1)[1] for line in system.split("\n") if ". Name: " in line]


def test_target_tool_listed_with_two_of_each_family_and_exact_params_copied_from_request():
    from src.datamodules.synthetic_text import request_class

    df = generate_rlla_rows(300, seed=4, low_gain=0.5)
    n_exact = 0
    for _, row in df.iterrows():
        system, user = row["prompt"][0]["content"], row["prompt"][1]["content"]
        listed = _listed(system)
        assert len(listed) == 4 and len(set(listed)) == len(listed)
        assert Counter(TOOLS[n].family for n in listed) == {"search": 2, "calculate": 2}
        assert system == build_system_prompt([TOOLS[n] for n in listed])
        gt = row["reward_model"]["ground_truth"]
        if "<tool_call>" not in gt:
            assert request_class(user) == "answer", user
            continue
        (call,) = parse_tool_block(gt)
        assert call["name"] in listed
        assert set(call["parameters"]) == set(TOOLS[call["name"]].parameters)
        if request_class(user) == "exact":
            n_exact += 1
            for value in call["parameters"].values():
                assert str(value) in user, (value, user)
        else:  # a vague request names no value of the call
            assert request_class(user) == "vague"
            assert not any(str(v) in user for v in call["parameters"].values()), user
    assert n_exact > 50


def test_test_split_templates_and_texts_disjoint_from_training(tmp_path):
    from src.datamodules.synthetic import SyntheticOptions, generate_rows_with_templates
    from src.datamodules.synthetic_text import template_ids

    assert not template_ids("train") & template_ids("test")
    mix = SyntheticOptions(p_search=0.3, p_calculate=0.3, p_answer=0.4, low_gain=0.5)
    train, train_templates = generate_rows_with_templates(3000, 0, mix, split="train")
    test, test_templates = generate_rows_with_templates(300, 1, mix, split="test")
    assert set(train_templates) <= template_ids("train") and set(test_templates) <= template_ids("test")
    assert not set(train_templates) & set(test_templates)
    texts = lambda df: {p[1]["content"] for p in df["prompt"]}
    assert len(texts(train)) >= 1500, len(texts(train))  # compositional: thousands of distinct requests
    assert not texts(train) & texts(test)
    # the written files: the test file shares no user text with the train file
    paths = write_synthetic_rlla(tmp_path, n_train=800, n_test=200, seed=2, options=mix)
    files = {k: pd.read_parquet(v) for k, v in paths.items()}
    assert not texts(files["train"]) & texts(files["test"])


def test_every_family_route_lists_at_least_two_tools_of_its_family():
    from src.router.families import ToolFamilies
    from src.router.routes import Route, route_system_prompt

    df = generate_rlla_rows(200, seed=9, low_gain=0.5)
    families = ToolFamilies()
    for prompt in df["prompt"]:
        system = prompt[0]["content"]
        for route, family in ((Route.SEARCH, "search"), (Route.CALCULATE, "calculate")):
            routed = _listed(route_system_prompt(system, route, families, mode="only_family"))
            assert sum(TOOLS[n].family == family for n in routed) >= 2, (route, routed)
            assert all(TOOLS[n].family == family for n in routed)


def test_rows_pass_schema_extraction():
    df = generate_rlla_rows(50, seed=0)
    records, skipped = extract_records(df, "synthetic")
    assert len(records) == 50 and not skipped
    assert records[0].messages[1]["content"].startswith("**Dialogue Records History**\n<user> ")


def test_system_prompt_keeps_rlla_sections_in_order():
    text = build_system_prompt([TOOLS["weather_lookup"], TOOLS["calculator"]])
    heads = ["**Available Tools**", "**Steps for Each Turn**", "**Output Format**", "**Important Notes**"]
    positions = [text.index(h) for h in heads]
    assert positions == sorted(positions)
    assert "1. Name: weather_lookup\nDescription: " in text
    params = text.split("2. Name: calculator\n")[1].split("\n")[1]
    assert json.loads(params.removeprefix("Parameters: ")) == TOOLS["calculator"].parameters


def test_tool_catalogue_families_and_param_form():
    fams = Counter(t.family for t in TOOLS.values())
    assert fams["search"] >= 5 and fams["calculate"] >= 5 and fams["other"] >= 2
    for name, tool in TOOLS.items():
        assert tool.name == name
        for spec in tool.parameters.values():
            assert set(spec) == {"description", "type", "default"}


def test_prompts_short_under_tiny_bpe():
    tiny = pytest.importorskip("src.models.tiny")
    df = generate_rlla_rows(400, seed=11)
    corpus = [m["content"] for p in df["prompt"] for m in p] + _gts(df)
    tok = tiny.build_tiny_tokenizer(corpus, vocab_size=4096)
    lengths = [
        len(tok.apply_chat_template(list(p), add_generation_prompt=True, tokenize=True, return_dict=False))
        for p in generate_rlla_rows(300, seed=12)["prompt"]
    ]
    assert max(lengths) < 450, max(lengths)  # four tools listed; a family route shows two


def test_cli_writes_files(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "scripts/make_synthetic_data.py",
            str(tmp_path),
            "--n-train",
            "12",
            "--n-test",
            "4",
            "--seed",
            "5",
            "--p-search",
            "1",
            "--p-calculate",
            "0",
            "--p-answer",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["train"]["rows"] == 12 and summary["test"]["rows"] == 4
    assert summary["train"]["families"] == {"search": 12}
    assert (tmp_path / "train.parquet").is_file() and (tmp_path / "test.parquet").is_file()
    bad = subprocess.run(
        [sys.executable, "scripts/make_synthetic_data.py", str(tmp_path / "x"), "--p-search", "-1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert bad.returncode == 2 and "proportions" in bad.stderr


def test_low_gain_rows_are_vague_requests_and_every_row_lists_both_tool_families():
    from src.datamodules.synthetic import is_vague_request

    df = generate_rlla_rows(200, seed=5, p_search=0.3, p_calculate=0.3, p_answer=0.4, low_gain=0.5)
    kinds = Counter()
    for _, row in df.iterrows():
        system, user = row["prompt"][0]["content"], row["prompt"][1]["content"]
        listed = {
            TOOLS[line.split("Name: ", 1)[1]].family for line in system.split("\n") if ". Name: " in line
        }
        assert {"search", "calculate"} <= listed
        family = ground_truth_family(row["reward_model"]["ground_truth"])
        kinds[(family, is_vague_request(user))] += 1
    assert kinds[("search", True)] == kinds[("search", False)] == 30
    assert kinds[("calculate", True)] == kinds[("calculate", False)] == 30
    assert kinds[("answer", False)] == 80 and not kinds[("answer", True)]
    n_texts = len({p[1]["content"] for p in df["prompt"]})
    assert n_texts >= 150, n_texts
    with pytest.raises(ValueError, match="low_gain"):
        generate_rlla_rows(5, seed=0, low_gain=1.5)


def test_every_held_out_phrasing_belongs_to_an_intent_with_training_phrasings():
    """Held-out answer and vague requests are new phrasings of intents training prompts have (the
    router must read meaning, not meet an intent no training prompt ever had): templates come in
    consecutive triples, one intent each (same slot, same kind of reply), the third held out."""
    import re

    from src.datamodules.synthetic_text import _ANSWER_TEMPLATES, _VAGUE_TEMPLATES, _split_indices

    assert len(_ANSWER_TEMPLATES) % 3 == 0 and len(_ANSWER_TEMPLATES) >= 30
    test = _split_indices(len(_ANSWER_TEMPLATES), "test")
    assert test == list(range(2, len(_ANSWER_TEMPLATES), 3))
    for k in range(0, len(_ANSWER_TEMPLATES), 3):
        triple = _ANSWER_TEMPLATES[k : k + 3]
        assert len({tuple(re.findall(r"{\w+}", request)) for request, _ in triple}) == 1, triple
        assert len({response.split()[0] for _, response in triple}) == 1, triple
    for family, templates in _VAGUE_TEMPLATES.items():
        test = _split_indices(len(templates), "test")
        assert len(templates) % 3 == 0 and test == list(range(2, len(templates), 3)), family
