"""Curriculum state: activation through dependencies, graduation, plateaus, weights, checks."""

from __future__ import annotations

import pytest

from src.datamodules.curriculum import (
    ACTIVE,
    GRADUATED,
    LOCKED,
    CurriculumState,
    LessonDependency,
    LessonRule,
    check_lessons,
)


def two_lessons(**easy) -> CurriculumState:
    return CurriculumState.from_rules(
        [
            LessonRule("easy", start_threshold=-10, stop_threshold=2.0, **easy),
            LessonRule("hard", dependencies=(LessonDependency("easy", 1.0),), start_threshold=-10, stop_threshold=3.0),
        ]
    )


def test_easy_gates_hard_until_its_threshold():
    s = two_lessons()
    assert s.to_evaluate() == ["easy"]
    assert s.update({"easy": 0.0}) == [("easy", ACTIVE)]
    assert s.status["hard"] == LOCKED and s.weights() == {"easy": 1.0, "hard": 0.0}
    assert s.update({"easy": 1.2}) == []  # dependency met now, but hard has no eval yet
    assert s.to_evaluate() == ["easy", "hard"]
    assert s.update({"easy": 1.3, "hard": -1.0}) == [("hard", ACTIVE)]
    w = s.weights()
    assert w["easy"] > 0 and w["hard"] > w["easy"]  # hard has more left to learn
    assert abs(sum(w.values()) - 1) < 1e-12


def test_graduation_by_threshold_unlocks_dependants_in_the_same_update():
    s = CurriculumState.from_rules(
        [
            LessonRule("easy", stop_threshold=2.0),
            LessonRule("hard", dependencies=(LessonDependency("easy", 5.0),)),
        ]
    )
    s.update({"easy": 0.0})
    changes = s.update({"easy": 2.5, "hard": -3.0})
    assert ("easy", GRADUATED) in changes and ("hard", ACTIVE) in changes
    assert s.weights() == {"easy": 0.0, "hard": 1.0}


def test_plateau_graduates():
    s = two_lessons(plateau_window=4, plateau_threshold=0.05)
    for r in (0.0, 0.5, 0.51, 0.52):
        s.update({"easy": r})
    assert s.status["easy"] == ACTIVE  # window (0.0, 0.5 | 0.51, 0.52): still improving
    s.update({"easy": 0.52})  # window (0.5, 0.51 | 0.52, 0.52): halves differ by 0.015
    assert s.status["easy"] == GRADUATED


def test_all_graduated_keeps_sampling():
    s = CurriculumState.from_rules([LessonRule("a", stop_threshold=0.0), LessonRule("b", stop_threshold=0.0)])
    s.update({"a": 1.0, "b": 1.0})
    s.update({"a": 1.0, "b": 1.0})
    assert s.status == {"a": GRADUATED, "b": GRADUATED}
    assert s.weights() == {"a": 0.5, "b": 0.5}


def test_state_round_trip():
    s = two_lessons()
    s.update({"easy": 0.0})
    s.update({"easy": 1.5, "hard": 0.0})
    t = two_lessons()
    t.load_state_dict(s.state_dict())
    assert t.status == s.status and t.history == s.history and t.weights() == s.weights()


def test_cycles_and_unknown_ids_are_named():
    with pytest.raises(ValueError, match="dependency cycle A -> B -> A"):
        check_lessons(
            [
                LessonRule("A", dependencies=(LessonDependency("B", 0.0),)),
                LessonRule("B", dependencies=(LessonDependency("A", 0.0),)),
            ]
        )
    with pytest.raises(ValueError, match="A.dependencies: unknown lesson 'Z'"):
        check_lessons([LessonRule("A", dependencies=(LessonDependency("Z", 0.0),))])
    with pytest.raises(ValueError, match="defined twice"):
        check_lessons([LessonRule("A"), LessonRule("A")])


def test_multi_call_rows_score_full_marks_on_their_own_ground_truth():
    from src.datamodules.synthetic import generate_multi_call_rows
    from src.rewards.rlla import compute_score

    df = generate_multi_call_rows(20, seed=3, start_index=1000)
    assert list(df.extra_info.map(lambda e: e["index"])) == list(range(1000, 1020))
    for rm in df.reward_model:
        gt = rm["ground_truth"]
        assert gt.count("\n{") == 2  # two calls in one block
        assert compute_score(gt, gt).total == 4.0
