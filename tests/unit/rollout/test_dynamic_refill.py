"""Dynamic sampling's refill loop with a scripted collector: which groups live is set per prompt,
so the loop's choices (drop, refill, bound, padding, order) and the joined router part are checked
against what the script says; then through ``RolloutPipeline`` (seeds of the refill collects)."""

from __future__ import annotations

import pytest
import torch

from src.datamodules.position import refill_seed
from src.rollout.batch import RolloutBatch, RouterRollout, generated_rows, join, step_draw, take_rows
from src.rollout.dynamic_refill import DynamicSampling, refill
from src.rollout.pipeline import DataSource, NoBuffer, RolloutPipeline

G, PAD = 4, 0


def _record(uid: int, actor_live: bool, router_live: bool | None = None) -> dict:
    live = actor_live if router_live is None else router_live
    return {"uid": uid, "actor_live": actor_live, "router_live": live, "prompt_ids": [uid] * (1 + uid % 3)}


def _left(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def scripted_batch(records: list[dict], call: int) -> RolloutBatch:
    """G rows per record; a live group's rewards vary, a dead one's are all equal. Responses of
    1 + call % 3 tokens, so parts joined later differ in width."""
    t = 1 + call % 3
    n = len(records) * G
    p_ids, p_mask = _left([r["prompt_ids"] for r in records])
    ids = p_ids.repeat_interleave(G, 0)
    mask = p_mask.repeat_interleave(G, 0)
    resp = torch.arange(n * t).reshape(n, t) + 1000 * (call + 1)
    actor = torch.tensor([float(j) if r["actor_live"] else 1.0 for r in records for j in range(G)])
    router = torch.tensor([-float(j) if r["router_live"] else -3.0 for r in records for j in range(G)])
    cost = (torch.arange(n) % 3 != 0).float()
    return RolloutBatch(
        input_ids=torch.cat([ids, resp], 1),
        attention_mask=torch.cat([mask, torch.ones(n, t, dtype=torch.long)], 1),
        response_mask=torch.ones(n, t, dtype=torch.long),
        rewards=actor,
        uids=[r["uid"] for r in records for _ in range(G)],
        rollout_log_probs=-resp.float() / 1e4,
        temperatures=torch.full((n,), 0.3),
        router=RouterRollout(
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            prompt_index=torch.arange(len(records)).repeat_interleave(G),
            action=torch.arange(n) % 3,
            log_prob=-torch.arange(n).float(),
            cost=cost,
            target=torch.arange(n) % 2,
            task_reward=router + float(call) * cost,  # r_router = r_task − λ·cost: the router values
            lam=torch.full((n,), float(call)),
        ),
        rows=[{"uid": r["uid"], "j": j, "call": call} for r in records for j in range(G)],
        metrics={"timing/generation_s": 1.0, "rollout/generated_tokens": float(n * t)},
    )


class ScriptedData:
    """Refill k of every step: the next prompts of ``pool[k]`` whose uid the step has not seen."""

    def __init__(self, pool: dict[int, list[dict]]):
        self.pool, self.calls = pool, []

    def __call__(self, step, k, n, exclude):
        self.calls.append((step, k, n, set(exclude)))
        return [r for r in self.pool.get(k, []) if r["uid"] not in exclude][:n]


def _run(draw_records, pool, on="actor", bound=2):
    data = ScriptedData(pool)
    collects = []

    def collect(records, k):
        collects.append(k)
        return scripted_batch(records, k)

    ds = DynamicSampling(on, bound, 1e-6, data, PAD)
    first = scripted_batch(draw_records, 0)
    batch, scalars = refill(first, 7, collect, ds)
    return first, batch, scalars, data, collects


def _groups(rb: RolloutBatch) -> list[int]:
    return list(dict.fromkeys(rb.uids))


def test_dead_groups_are_replaced_from_refills_in_order_and_the_draw_stays_the_on_policy_sample():
    draw = [_record(1, True), _record(2, False), _record(3, True), _record(4, False)]
    pool = {
        1: [_record(2, True), _record(11, False), _record(12, True)],
        2: [_record(21, True), _record(22, True)],
    }
    first, batch, scalars, data, collects = _run(draw, pool)
    # refill 1 skips uid 2 (the step has it): 11 dead, 12 live -> 3 live; refill 2's 21 fills it
    assert collects == [1, 2] and [c[:3] for c in data.calls] == [(7, 1, 4), (7, 2, 4)]
    assert data.calls[1][3] == {1, 2, 3, 4, 11, 12}
    assert _groups(batch) == [1, 3, 12, 21] and len(batch) == 4 * G
    assert scalars == {
        "train/dynamic_groups_kept_frac": 0.5,
        "train/dynamic_extra_batches": 2.0,
        "train/dynamic_groups_final": 4.0,
    }
    assert step_draw(batch) is first and step_draw(first) is first
    assert [(r["uid"], r["refill"], r["trained"]) for r in generated_rows(batch)][::G] == [
        (1, 0, True), (2, 0, False), (3, 0, True), (4, 0, False), (11, 1, False), (12, 1, True), (21, 2, True),
        (22, 2, False),  # generated, logged, not needed
    ]  # fmt: skip
    assert batch.metrics["timing/generation_s"] == 3.0  # the three collects' seconds


def test_the_bound_holds_and_a_batch_with_no_live_group_trains_on_the_draw():
    draw = [_record(u, False) for u in range(1, 5)]
    pool = {k: [_record(10 * k + i, False) for i in range(4)] for k in range(1, 6)}
    first, batch, scalars, _, collects = _run(draw, pool, bound=3)
    assert collects == [1, 2, 3]  # max_extra_batches collects, not one more
    assert _groups(batch) == [1, 2, 3, 4] and torch.equal(batch.rewards, first.rewards)
    assert scalars["train/dynamic_groups_final"] == 0.0 and scalars["train/dynamic_extra_batches"] == 3.0
    _, _, scalars, _, collects = _run(draw, pool, bound=0)
    assert collects == [] and scalars["train/dynamic_extra_batches"] == 0.0


def test_short_after_the_bound_pads_with_the_draws_dead_groups_and_a_dry_pool_stops_early():
    draw = [_record(1, False), _record(2, True), _record(3, False), _record(4, False)]
    _, batch, scalars, _, collects = _run(draw, {1: [_record(9, True)]}, bound=2)
    assert collects == [1]  # refill 2 found no prompt: the loop stops instead of collecting nothing
    assert _groups(batch) == [1, 2, 3, 9] and scalars["train/dynamic_groups_final"] == 2.0


def test_all_live_draw_is_trained_on_as_it_is():
    draw = [_record(u, True) for u in range(1, 5)]
    first, batch, scalars, _, collects = _run(draw, {})
    assert collects == [] and torch.equal(batch.input_ids, first.input_ids) and batch.router is first.router
    assert scalars["train/dynamic_groups_kept_frac"] == 1.0


@pytest.mark.parametrize(("on", "want"), [("actor", [1, 3]), ("router", [2, 3]), ("either", [1, 2, 3])])
def test_on_picks_the_reward_whose_spread_keeps_a_group(on, want):
    draw = [
        _record(1, True, False),
        _record(2, False, True),
        _record(3, True, True),
        _record(4, False, False),
    ]
    pool = {1: [_record(u, True, True) for u in (50, 51, 52)]}
    _, batch, scalars, _, _ = _run(draw, pool, on=on, bound=1)
    assert scalars["train/dynamic_groups_kept_frac"] == len(want) / 4
    assert _groups(batch) == want + [50, 51, 52][: 4 - len(want)]


def test_take_rows_of_a_join_keeps_every_rows_prompt_response_and_router_part():
    parts = [
        scripted_batch([_record(1, True), _record(5, False)], 0),
        scripted_batch([_record(2, True), _record(6, True), _record(9, False)], 1),
    ]
    joined = join(parts, PAD)
    rows = torch.tensor([4, 5, 6, 7, 12, 13, 14, 15, 19])
    got = take_rows(joined, rows)
    flat = [(p, i) for p in parts for i in range(len(p))]
    for out_row, src_row in enumerate(rows.tolist()):
        part, i = flat[src_row]

        def used(ids, mask):
            return ids[mask.bool()].tolist()

        assert used(got.input_ids[out_row], got.attention_mask[out_row]) == used(
            part.input_ids[i], part.attention_mask[i]
        )
        assert got.rewards[out_row] == part.rewards[i] and got.uids[out_row] == part.uids[i]
        r, pr = got.router, part.router
        k = int(r.prompt_index[out_row])
        assert used(r.prompt_ids[k], r.prompt_mask[k]) == used(
            pr.prompt_ids[pr.prompt_index[i]], pr.prompt_mask[pr.prompt_index[i]]
        )
        for name in ("action", "log_prob", "reward", "cost", "target", "task_reward", "lam"):
            assert getattr(r, name)[out_row] == getattr(pr, name)[i], name
    assert len(got.router.prompt_ids) == 3  # prompts 5, 6 and 9's: the others' rows were not taken
    assert set(got.router.lam.tolist()) == {0.0, 1.0}  # each row keeps the λ its collect scored it with
    with pytest.raises(ValueError, match="with and without a router"):
        join([parts[0], RolloutBatch(**{**parts[1].__dict__, "router": None})], PAD)


class _Collector:
    def __init__(self):
        self.engine = type("E", (), {"needs_weight_sync": False})()
        self.requests = []

    def collect(self, request):
        self.requests.append(request)
        return scripted_batch(request.records, len(self.requests) - 1)


def test_pipeline_seeds_refill_k_by_seed_step_and_k_and_logs_the_scalars():
    from types import SimpleNamespace

    collector = _Collector()
    data = ScriptedData({1: [_record(7, True)], 2: [_record(8, True)]})
    pipeline = RolloutPipeline(
        lambda module: collector, DataSource(), NoBuffer(), None, seed=3,
        dynamic=DynamicSampling("actor", 2, 1e-6, data, PAD),
    )  # fmt: skip
    pipeline.start(SimpleNamespace(actor=torch.nn.Linear(2, 2)), step=0)
    batch, scalars = pipeline.rollout([_record(1, True), _record(2, False)], step=5, lam=0.5)
    assert [r.generator.initial_seed() for r in collector.requests[1:]] == [refill_seed(3, 5, 1)]
    assert {r.step for r in collector.requests} == {5} and {r.lam for r in collector.requests} == {0.5}
    assert _groups(batch) == [1, 7] and scalars["train/dynamic_extra_batches"] == 1.0
