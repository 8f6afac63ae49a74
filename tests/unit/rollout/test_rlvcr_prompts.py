import pytest

from src.rollout.rlvcr.steps import (
    LEVEL_INSTRUCTIONS,
    build_level_prompt,
    extract_level_thinking,
    forced_prefix,
    level_tag,
    parse_step,
)


def test_each_level_has_its_own_instruction():
    assert sorted(LEVEL_INSTRUCTIONS) == [1, 2, 3, 4]
    assert len(set(LEVEL_INSTRUCTIONS.values())) == 4
    assert all(f"level {k}" in LEVEL_INSTRUCTIONS[k].lower() for k in range(1, 5))


@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_prompt_keeps_history_and_ends_with_forced_prefix(level):
    history = "Task: put a mug in the sink.\nObservation: you are in the kitchen."
    prompt = build_level_prompt(history, level)
    assert prompt.startswith(history)
    assert LEVEL_INSTRUCTIONS[level] in prompt
    assert prompt.endswith(forced_prefix(level))
    assert forced_prefix(level) == (f"<level>{level}</level>" + ("" if level == 1 else "<think>"))


def test_extract_cuts_generated_action_off():
    gen = " The mug is on the table, take it. </think><action>take mug</action>"
    want = "<level>3</level><think>The mug is on the table, take it.</think>"
    assert extract_level_thinking(gen, 3) == want
    # no </think>: cut at <action>, the think block is closed for the model
    want = "<level>2</level><think>check state</think>"
    assert extract_level_thinking("check state<action>x</action>", 2) == want
    # ran out of tokens mid-thought: everything is thinking
    want = "<level>4</level><think>goal is, state is</think>"
    assert extract_level_thinking("goal is, state is", 4) == want


def test_extract_accepts_echoed_prefix_and_whole_original_steps():
    step = "junk <level>3</level><think>I need to look around first</think><action>look around</action>"
    assert extract_level_thinking(step, 3) == "<level>3</level><think>I need to look around first</think>"
    ctx = extract_level_thinking(step, 3)
    p = parse_step(ctx + "<action>look around</action>")
    assert not p.malformed and p.level == 3


def test_level_1_context_is_just_the_tag():
    got = extract_level_thinking("anything at all<action>go</action>", 1)
    assert got == level_tag(1) == "<level>1</level>"
    assert not parse_step(level_tag(1) + "<action>go</action>").malformed


@pytest.mark.parametrize("bad", [0, 5, "2"])
def test_unknown_level_is_rejected(bad):
    with pytest.raises(ValueError, match="level must be one of"):
        build_level_prompt("h", bad)
    with pytest.raises(ValueError, match="level must be one of"):
        extract_level_thinking("x", bad)
