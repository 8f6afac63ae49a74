import pytest

from src.rollout.rlvcr.steps import (
    action_span,
    format_penalty,
    format_step,
    parse_step,
    thinking_prefix,
    token_span_from_offsets,
)


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_well_formed_steps_round_trip(level):
    text = format_step(level, "look at the table first", "look around")
    p = parse_step(text)
    assert (p.level, p.action, p.malformed, p.reasons) == (level, "look around", False, [])
    assert p.think == ("" if level == 1 else "look at the table first")
    assert format_penalty(p, 5.0) == 0.0


def test_junk_before_and_whitespace_inside_is_tolerated():
    text = (
        "Sure, here you go:\n <level> 3 </level>\n<think>\n plan it \n</think>\n<action> go north </action>\n"
    )
    p = parse_step(text)
    assert (p.level, p.think, p.action, p.malformed) == (3, "plan it", "go north", False)


def test_level_1_with_think_block_is_malformed():
    p = parse_step("<level>1</level><think>hmm</think><action>go</action>")
    assert p.level == 1 and p.action == "go" and p.malformed
    assert any("level 1" in r for r in p.reasons)


def test_higher_level_without_thinking_is_malformed():
    p = parse_step("<level>3</level><action>go</action>")
    assert p.malformed and p.reasons == ["level 3 needs a non-empty <think> block"]
    p = parse_step("<level>2</level><think>  </think><action>go</action>")
    assert p.malformed and p.reasons == ["level 2 needs a non-empty <think> block"]


def test_missing_closing_tags_are_recovered_and_reported():
    p = parse_step("<level>2<think>check the door<action>open door")
    assert (p.level, p.think, p.action) == (2, "check the door", "open door")
    assert p.malformed
    assert set(p.reasons) == {"missing </level>", "missing </think>", "missing </action>"}


def test_unclosed_action_allowed_when_engine_strips_stop_string():
    text = "<level>2</level><think>ok</think><action>open door"
    assert parse_step(text).reasons == ["missing </action>"]
    p = parse_step(text, allow_unclosed_action=True)
    assert not p.malformed and p.action == "open door"


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<think>x</think><action>go</action>", "no <level> tag"),
        ("<level>7</level><think>x</think><action>go</action>", "level '7' is not one of [1, 2, 3, 4]"),
        ("<level>two</level><think>x</think><action>go</action>", "level 'two' is not one of [1, 2, 3, 4]"),
        ("<level>2</level><think>x</think>", "no <action> block"),
        ("<level>2</level><think>x</think><action>  </action>", "empty action"),
        (
            "<level>2</level><think>x</think><action>a</action><action>b</action>",
            "more than one <action> block",
        ),
        ("<level>2</level><think>x<action>a</action>y</think>", "<action> before </think>"),
    ],
)
def test_malformed_steps_name_their_reason(text, reason):
    p = parse_step(text)
    assert p.malformed and reason in p.reasons
    assert format_penalty(p, 2.0) == -2.0 and format_penalty(p, -2.0) == -2.0


def test_parse_rejects_non_strings():
    with pytest.raises(TypeError, match="expects str"):
        parse_step(None)


def test_thinking_prefix_and_action_span():
    text = "<level>3</level><think>first look</think><action>look around</action>tail"
    prefix = thinking_prefix(text)
    assert prefix == "<level>3</level><think>first look</think>"
    start, end = action_span(text)
    assert text[start:end] == "look around"
    assert prefix + "<action>" == text[:start]
    # no action: prefix is everything, span is None
    assert thinking_prefix("<level>1</level>") == "<level>1</level>"
    assert action_span("<level>1</level>") is None
    # unclosed action: span runs to the end of the text
    s, e = action_span("<action>go west")
    assert "<action>go west"[s:e] == "go west"


def test_token_span_from_offsets():
    text = "<action>go west</action>"
    # hand-made offsets: "<action>", "go", " west", "</action>", plus a zero-width special token
    offsets = [(0, 8), (8, 10), (10, 15), (15, 24), (24, 24)]
    assert token_span_from_offsets(offsets, action_span(text)) == (1, 3)
    assert token_span_from_offsets(offsets, (30, 40)) == (0, 0)
