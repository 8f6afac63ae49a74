"""Differential tests: the linear-time parsers give exactly what the old (regex) ones gave.

The oracles are verbatim copies of the code before the rewrite (reference_rlla.py,
reference_harmony.py, reference_usage.py). Inputs: real ground truths when the shared data is
present (synthetic RLLA rows otherwise), thousands of random perturbations of them, and tag soup;
kept to a few kilobytes because the old layout regexes are quadratic to cubic.
"""

from __future__ import annotations

import logging
import random
from dataclasses import astuple, fields

import pytest
import reference_harmony
import reference_rlla
import reference_usage
from fuzz_text import (
    HARMONY_FRAGMENTS,
    XML_FRAGMENTS,
    mutate,
    real_xml_ground_truths,
    soup,
    synthetic_ground_truths,
)

from src.datamodules.gpt_oss import ConversionError, convert_ground_truth
from src.formats import harmony
from src.rewards import gpt_oss, rlla
from src.rewards.rlla import RewardConfig, matches_layout
from src.router import usage

FLAGS = [f.name for f in fields(RewardConfig)]
STEPS = (0, 29, 30, 75, 105, 150, 1000)
MAX_LEN = 4000  # the reference regexes are cubic: keep their inputs small


@pytest.fixture(scope="module")
def xml_ground_truths(request) -> list[str]:
    """Real ground truths (test rows + SFT outputs) when present, else 300 synthetic rows."""
    try:
        return real_xml_ground_truths(request.getfixturevalue("shared_data"))
    except pytest.skip.Exception:
        return synthetic_ground_truths(random.Random(0), 300)


@pytest.fixture(scope="module")
def harmony_ground_truths(xml_ground_truths) -> list[str]:
    out = []
    for gt in xml_ground_truths:
        try:
            out.append(convert_ground_truth(gt))
        except ConversionError:
            continue  # the rows with <tool_call> quoted in the reasoning
    return out


@pytest.fixture(autouse=True)
def _quiet_errors():
    """Unparseable ground truths log an error per call; thousands of them would flood the log."""
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def _responses(rng: random.Random, gts: list[str], fragments: tuple[str, ...], n: int) -> list[str]:
    out = []
    for i in range(n):
        if i % 5 == 4:
            text = soup(rng, fragments, rng.randrange(1, 40))
        else:
            text = mutate(rng.choice(gts), rng, fragments, gts) if i % 7 else rng.choice(gts)
        out.append(text[:MAX_LEN])
    return out


def _config(rng: random.Random) -> RewardConfig:
    return RewardConfig(**{k: rng.random() < 0.4 for k in FLAGS})


def test_rlla_scores_match_the_regex_reference(xml_ground_truths):
    gts = xml_ground_truths
    rng = random.Random(12)
    responses = _responses(rng, gts, XML_FRAGMENTS, 4000)
    n_format_ok = 0
    for response in responses:
        gt = rng.choice(gts) if rng.random() < 0.3 else mutate(rng.choice(gts), rng, XML_FRAGMENTS, gts)
        cfg, step = _config(rng), rng.choice(STEPS)
        assert rlla.compute_score(response, gt, step, cfg) == reference_rlla.compute_score(
            response, gt, step, cfg
        ), (response, gt, cfg, step)
        # unstripped text too: Python's ``$`` also matches before one final newline
        ok = rlla.format_ok(response, gt)
        assert ok == reference_rlla.format_ok(response, gt), (response, gt)
        n_format_ok += ok
    assert n_format_ok > 100  # the perturbations keep enough valid layouts to test both answers


def test_rlla_scores_match_on_every_ground_truth_against_every_layout(xml_ground_truths):
    """Each ground truth's own text, scored against ground truths of all four layouts."""
    gts = xml_ground_truths
    layouts = {("<response>" in g, "<tool_call>" in g): g for g in gts}
    for response in gts:
        for gt in layouts.values():
            assert rlla.compute_score(response, gt) == reference_rlla.compute_score(response, gt)


def test_harmony_parse_matches_the_reference(harmony_ground_truths):
    gts = harmony_ground_truths
    rng = random.Random(13)
    for text in _responses(rng, gts, HARMONY_FRAGMENTS, 3000):
        new, old = harmony.parse_harmony(text), reference_harmony.parse_harmony(text)
        assert [astuple(b) for b in new.blocks] == [astuple(b) for b in old.blocks], text
        assert new.stray == old.stray, text
        assert _calls_or_error(harmony.parse_harmony_tool_calls, text) == _calls_or_error(
            reference_harmony.parse_harmony_tool_calls, text
        ), text


def _calls_or_error(parse, text: str):
    try:
        return parse(text)
    except ValueError as err:
        return str(err)


def test_harmony_scores_match_the_reference_parser(harmony_ground_truths, monkeypatch):
    """gpt_oss.compute_score over the new parser == over the reference parser."""
    gts = harmony_ground_truths
    rng = random.Random(14)
    cases = [
        (text, rng.choice(gts), rng.choice(STEPS), _config(rng))
        for text in _responses(rng, gts, HARMONY_FRAGMENTS, 1500)
    ]
    new = [gpt_oss.compute_score(*case) for case in cases]
    monkeypatch.setattr(gpt_oss, "parse_harmony", reference_harmony.parse_harmony)
    monkeypatch.setattr(gpt_oss, "tool_calls_of", reference_harmony.tool_calls_of)
    monkeypatch.setattr(gpt_oss, "block_tool_call", reference_harmony.block_tool_call)
    assert new == [gpt_oss.compute_score(*case) for case in cases]


def test_xml_tool_usage_matches_the_reference(xml_ground_truths):
    gts = xml_ground_truths
    rng = random.Random(15)
    for text in _responses(rng, gts, XML_FRAGMENTS, 3000):
        assert usage.xml_call_lines(text) == reference_usage.xml_call_lines(text), text


def test_harmony_tool_usage_matches_the_reference(harmony_ground_truths):
    gts = harmony_ground_truths
    rng = random.Random(16)
    for text in _responses(rng, gts, HARMONY_FRAGMENTS, 2000):
        assert usage._harmony_calls(text) == reference_usage._harmony_calls(text), text


@pytest.mark.parametrize("seed", range(4))
def test_layout_matcher_equals_the_lazy_regex(seed):
    """matches_layout == re.search('^L0.*?L1...Lk$', DOTALL) on random strings over the literals."""
    import re

    rng = random.Random(seed)
    alphabet = ("a", "b", "ab", "ba", "\n", "a\n", "b\n")
    for _ in range(3000):
        literals = [rng.choice(alphabet) for _ in range(rng.randrange(2, 5))]
        text = soup(rng, alphabet, rng.randrange(0, 12))
        pattern = "^" + ".*?".join(re.escape(lit) for lit in literals) + "$"
        expected = re.search(pattern, text, re.DOTALL) is not None
        assert matches_layout(text, literals) == expected, (text, literals)


def test_layout_needs_two_literals():
    with pytest.raises(ValueError, match="at least two literals"):
        matches_layout("abc", ["a"])
