"""Result and configuration types shared by the rule rewards (XML and harmony)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardConfig:
    """ToolRL's reward variants as booleans (all off by default).

    with_length         WITHLENGTH: add the <think>/analysis word-count reward (0..1).
    schedule_length     SCHEDULELENGTH: the length target grows from 384 to 640 words over steps.
    correct_max1        CORRECTMAX1: correctness in [-1, 1] instead of [-3, 3].
    max1_step30_max3    MAX1STEP30MAX3: correctness range /3 before step 30; format range /2 from step 30.
    schedule_reward     SCHEDULEREWARD: ranges interpolate with the step (format from [-2, 2], correctness from [-2, 2]).
    refined             REFINEDREWARD: name/key lists must match exactly (no partial credit).
    coarse              COARSEREWARD: any difference from the ground-truth calls gets the minimum.
    intermediate        INTERMEDIATEREWARD: a call counts only when it matches a ground-truth call exactly.
    """

    with_length: bool = False
    schedule_length: bool = False
    correct_max1: bool = False
    max1_step30_max3: bool = False
    schedule_reward: bool = False
    refined: bool = False
    coarse: bool = False
    intermediate: bool = False


@dataclass(frozen=True)
class RewardBreakdown:
    """One scored response: total = format + correctness + length."""

    total: float
    format: float
    correctness: float
    length: float
