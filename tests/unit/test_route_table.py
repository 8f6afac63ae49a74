"""``route_table`` against a plain per-prompt loop: with ``samples`` K each entry is the mean of the
K responses of that prompt and route, whichever copy of the batch they came from."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from src.datamodules.schema import read_rlla_parquet
from src.datamodules.synthetic import generate_rlla_rows, write_rlla_parquet
from src.jobs.route_eval import ROUTES, ResponseDraws, route_table
from src.rewards.dispatch import score
from src.router.routes import ToolFamilies


class _ScriptedPolicy:
    """Answers copy k of prompt i under route r with the ground truth when (i + k + r) is even, else
    with nothing; counts the generate calls. Route probabilities fixed per prompt."""

    families = ToolFamilies()

    def __init__(self, records):
        self.records = records
        self.index = {r.uid: i for i, r in enumerate(records)}
        self.calls, self.temperatures = 0, []

    def route_probs(self, messages):
        return torch.tensor([[0.5, 0.3, 0.2]] * len(messages))

    def respond_batch(self, messages, sources, routes, settings):
        self.calls += 1
        self.temperatures.append(settings.temperature)
        uids = [self._uid(m) for m in messages]
        n = len(set(uids))
        out = []
        for j, (uid, route) in enumerate(zip(uids, routes)):
            good = (self.index[uid] + j // n + ROUTES.index(route)) % 2 == 0
            truth = self.records[self.index[uid]].ground_truth
            out.append(SimpleNamespace(response=truth if good else "", cost=float(j // n)))
        return out

    def _uid(self, messages):
        return next(r.uid for r in self.records if r.messages == messages)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "rows.parquet"
    write_rlla_parquet(generate_rlla_rows(7, seed=3, split="test"), path)
    return read_rlla_parquet(path)[0]


@pytest.mark.parametrize("samples", [0, 1, 3])
def test_each_entry_is_the_mean_of_its_prompts_samples(records, samples):
    policy = _ScriptedPolicy(records)
    table = route_table(policy, records, batch_size=4, draws=ResponseDraws(samples, 0.7))
    repeats = max(samples, 1)
    assert policy.calls == 2 * len(ROUTES)  # one generate call per chunk and route, K copies in it
    assert set(policy.temperatures) == {0.7 if samples else 0.0}
    assert list(table.uid) == [r.uid for r in records]
    for i, rec in enumerate(records):
        for r, route in enumerate(ROUTES):
            rewards, costs = [], []
            for k in range(repeats):
                good = (i + k + r) % 2 == 0
                rewards.append(
                    score(rec.data_source, rec.ground_truth if good else "", rec.ground_truth, step=0).total
                )
                costs.append(float(k))
            assert table[f"reward_{route}"].iloc[i] == pytest.approx(np.mean(rewards), abs=1e-12)
            assert table[f"cost_{route}"].iloc[i] == pytest.approx(np.mean(costs), abs=1e-12)
    if samples == 3:  # the copies disagree, so a table that kept one copy would fail above
        assert table["reward_answer"].nunique() > 1


def test_sampling_needs_a_temperature(records):
    with pytest.raises(ValueError, match="temperature > 0"):
        ResponseDraws(2, 0.0)
    with pytest.raises(ValueError, match="need a temperature"):
        route_table(_ScriptedPolicy(records), records, draws=ResponseDraws(2))
