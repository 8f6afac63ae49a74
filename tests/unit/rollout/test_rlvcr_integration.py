"""RLVCR augmenter on hand-built episodes with the real tiny model, engine and scorer."""

from __future__ import annotations

import math

import pytest
import torch

import src.rollout.rlvcr.augment as rlvcr
from src.algorithms.rlvcr import (
    make_level_scores,
    penalised_rewards,
    qualifying_episodes,
    scatter_step_advantages,
)
from src.config.schema import AlgorithmConfig
from src.rollout.batch import CollectRequest, RolloutBatch, assemble_sequences
from src.rollout.engines.hf import HFGenerateEngine
from src.rollout.episodes.loop import Episode, StepRecord, action_from_text
from src.rollout.rlvcr.augment import RlvcrAugmenter, RlvcrCollector, algorithm_settings, check_settings
from src.rollout.rlvcr.steps import parse_step


# ---------------------------------------------------------------------------- pure parts
def grpo_loop(rewards, uids, eps=1e-6):
    out = []
    for r, u in zip(rewards, uids):
        g = [x for x, v in zip(rewards, uids) if v == u]
        mean = sum(g) / len(g)
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1)) if len(g) > 1 else 1.0
        out.append((r - mean) / (std + eps))
    return out


def test_scatter_matches_loop_on_random_spans():
    gen = torch.Generator().manual_seed(0)
    for _ in range(8):
        n, t = 3, 17
        mask = (torch.rand(n, t, generator=gen) > 0.3).long()
        traj = torch.randn(n, generator=gen)
        rows, starts, ends = [], [], []
        for r in range(n):  # disjoint spans per row
            cut = sorted(torch.randint(0, t + 1, (4,), generator=gen).tolist())
            for a, b in ((cut[0], cut[1]), (cut[2], cut[3])):
                rows.append(r), starts.append(a), ends.append(b)
        step_adv = torch.randn(len(rows), generator=gen)
        out = scatter_step_advantages(
            mask, traj, torch.tensor(rows), torch.tensor(starts), torch.tensor(ends), step_adv
        )
        ref = torch.zeros(n, t)
        for r in range(n):
            for j in range(t):
                v = float(traj[r])
                for s in range(len(rows)):
                    if rows[s] == r and starts[s] <= j < ends[s]:
                        v = float(step_adv[s])
                ref[r, j] = v * float(mask[r, j])
        torch.testing.assert_close(out, ref)


def test_scatter_rejects_overlapping_spans():
    with pytest.raises(ValueError, match="overlap"):
        scatter_step_advantages(
            torch.ones(1, 5),
            torch.zeros(1),
            torch.tensor([0, 0]),
            torch.tensor([0, 2]),
            torch.tensor([3, 4]),
            torch.ones(2),
        )


def test_qualifying_modes_and_penalty():
    r = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.2])
    g = torch.tensor([0, 0, 0, 1, 1])
    assert qualifying_episodes(r, g, "threshold", 0.0).tolist() == [True, False, True, True, True]
    assert qualifying_episodes(r, g, "threshold", 0.4).tolist() == [True, False, True, False, False]
    # group 0 mean 0.5: 1.0 and 0.5 qualify; group 1 is all equal -> whole group qualifies
    assert qualifying_episodes(r, g, "group_mean").tolist() == [True, False, True, True, True]
    assert qualifying_episodes(r, g, "all").all()
    with pytest.raises(ValueError, match="qualify"):
        qualifying_episodes(r, g, "best")
    torch.testing.assert_close(
        penalised_rewards(r, torch.tensor([0.0, 1.0, 0.5, 0, 0]), -0.2),
        torch.tensor([1.0, -0.2, 0.4, 0.2, 0.2]),
    )


def test_the_augmenter_reads_the_algorithm_configs_own_keys():
    keys = {
        "step_advantage_w": 0.5,
        "thinking_cost_alpha": 0.2,
        "cost_max": 32.0,
        "rlvcr_mode": "neg_entropy",
        "rlvcr_qualify": "group_mean",
        "rlvcr_format_penalty": 0.1,
        "rlvcr_think_max_new_tokens": 8,
        "adv_eps": 1e-5,
    }
    s = algorithm_settings(keys)
    assert {k: getattr(s, k) for k in keys} == keys
    with pytest.raises(Exception, match="unrelated"):  # a key the schema lacks, named
        algorithm_settings({**keys, "unrelated": 3})
    with pytest.raises(ValueError, match="rlvcr_qualify"):
        check_settings(AlgorithmConfig(rlvcr_qualify="nope"))
    assert algorithm_settings({}).rlvcr_mode == "neg_entropy"  # seed 002: entropy


# ---------------------------------------------------------------------------- augmenter, real model
def build_episode(tok, turns: list[str], reward: float) -> Episode:
    """ChatML episode: each turn is a generated assistant message (mask 1, eos included) followed by
    an observation turn (mask 0), as the episode collector lays it out."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    prompt = tok.apply_chat_template(
        [{"role": "system", "content": "Play the game."}, {"role": "user", "content": "OBSERVATION:\nstart"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    ids, mask, steps = [], [], []
    for j, text in enumerate(turns):
        gen = enc(text) + [tok.eos_token_id]
        start = len(ids)
        ids += gen
        mask += [1] * len(gen)
        steps.append(
            StepRecord(
                action_start=start,
                action_end=len(ids),
                action_text=action_from_text(text),
                generated_text=text + tok.eos_token,
            )
        )
        if j < len(turns) - 1:
            obs = enc(f"\n<|im_start|>user\nOBSERVATION:\nresult {j}<|im_end|>\n<|im_start|>assistant\n")
            ids += obs
            mask += [0] * len(obs)
    return Episode(
        prompt_ids=prompt,
        response_ids=ids,
        response_mask=mask,
        reward=reward,
        score=reward,
        num_steps=len(turns),
        seed=0,
        temperature=1.0,
        exit_status="submitted",
        steps=steps,
        budget_exhausted=False,
    )


def make_batch(tok, episodes, uids) -> RolloutBatch:
    t = max(len(e.response_ids) for e in episodes)
    resp = torch.full((len(episodes), t), tok.pad_token_id, dtype=torch.long)
    rmask = torch.zeros((len(episodes), t), dtype=torch.long)
    for i, e in enumerate(episodes):
        resp[i, : len(e.response_ids)] = torch.tensor(e.response_ids)
        rmask[i, : len(e.response_mask)] = torch.tensor(e.response_mask)
    ids, attn = assemble_sequences([e.prompt_ids for e in episodes], resp, rmask, tok.pad_token_id)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=rmask,
        rewards=torch.tensor([e.reward for e in episodes]),
        uids=uids,
        rollout_log_probs=torch.zeros(rmask.shape),
        rows=[{"step": 0} for _ in episodes],
        episodes=episodes,
    )


def _is_slice(part: list[int], whole: list[int]) -> bool:
    return any(whole[i : i + len(part)] == part for i in range(len(whole) - len(part) + 1))


class CountingEngine(HFGenerateEngine):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = []

    def generate(self, prompt_ids, sampling):
        self.calls.append((len(prompt_ids), sampling))
        return super().generate(prompt_ids, sampling)


GOOD_2 = "<level>2</level><think>check the file</think><action>cat strategy.py</action>"
GOOD_1 = "<level>1</level><action>submit</action>"
GOOD_4 = (
    "<level>4</level><think>the opponent copies me so I should cooperate</think><action>validate</action>"
)
BAD = "just some text without tags"


@pytest.fixture(scope="module")
def setup(tiny):
    model, tok = tiny
    episodes = [
        build_episode(tok, [GOOD_2, GOOD_1], reward=1.0),  # qualifies: 2 + 3 alternative generations
        build_episode(tok, [BAD, GOOD_4], reward=0.0),  # reward 0: trajectory advantage only
        build_episode(tok, [GOOD_4, BAD], reward=0.5),  # qualifies; the malformed step does not
        build_episode(tok, [GOOD_1], reward=-1.0),  # alone in its group: trajectory advantage 0
    ]
    uids = ["a", "a", "a", "b"]
    return model, tok, episodes, uids


def run_augmenter(setup, monkeypatch, **settings):
    model, tok, episodes, uids = setup
    recorded = {}
    real = rlvcr.score_level_groups

    def spy(model_, groups, *a, **kw):
        recorded["groups"] = groups
        recorded["scores"] = real(model_, groups, *a, **kw)
        return recorded["scores"]

    monkeypatch.setattr(rlvcr, "score_level_groups", spy)
    engine = CountingEngine(model, tok.pad_token_id, [tok.eos_token_id])
    st = AlgorithmConfig(rlvcr_think_max_new_tokens=6, **settings)
    batch = make_batch(tok, episodes, uids)
    torch.manual_seed(0)
    out = RlvcrAugmenter(tok, engine, model, st).augment(batch)
    return out, engine, recorded, st


def test_token_advantages_land_on_step_tokens(setup, monkeypatch):
    model, tok, episodes, uids = setup
    model.train()
    batch, engine, rec, st = run_augmenter(setup, monkeypatch, rlvcr_format_penalty=0.5)
    assert model.training  # scoring restores the mode
    adv = batch.token_advantages
    assert adv.shape == batch.response_mask.shape and torch.isfinite(adv).all()
    assert (adv[batch.response_mask == 0] == 0).all()

    # one generation call: ep0 step0 (level 2 -> 3, 4), ep0 step1 (level 1 -> 2, 3, 4), ep2 step0 (4 -> 2, 3)
    assert [c[0] for c in engine.calls] == [7]
    assert engine.calls[0][1].max_new_tokens == 6
    qualifying = [(0, 0), (0, 1), (2, 0)]
    groups = rec["groups"]
    assert len(groups) == len(qualifying)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    for g, (e, j) in zip(groups, qualifying):
        ep, st_ = episodes[e], episodes[e].steps[j]
        assert list(g.history_ids) == ep.prompt_ids + ep.response_ids[: st_.action_start]
        turn = ep.response_ids[st_.action_start : st_.action_end]
        assert list(g.action_ids) == enc(parse_step(st_.generated_text).action)  # no drift in this text
        assert _is_slice(list(g.action_ids), turn)  # ... and they are the generated ids
        assert list(g.action_prefix_ids) == enc("<action>")
        assert list(g.thinking_ids[0]) == enc("<level>1</level>")
    assert list(groups[0].thinking_ids[1]) == enc("<level>2</level><think>check the file</think>")

    # trajectory advantage: GRPO over uid groups on reward - penalty * malformed fraction
    pen = [1.0, 0.0 - 0.5 * 0.5, 0.5 - 0.5 * 0.5, -1.0]
    traj = grpo_loop(pen, uids)
    # thinking advantage from the recorded scores, by a plain loop
    scores = make_level_scores(rec["scores"].action_logprob, rec["scores"].action_entropy, st.rlvcr_mode)
    costs = rec["scores"].thinking_tokens.float()
    levels = [2, 1, 4]
    for i, ((e, j), lv) in enumerate(zip(qualifying, levels)):
        r = [float(scores[i, k]) + st.thinking_cost_alpha * (0.5 - float(costs[i, k]) / st.cost_max) for k in range(4)]
        mu = sum(r) / 4
        sd = math.sqrt(sum((x - mu) ** 2 for x in r) / 3)
        think = (r[lv - 1] - mu) / (sd + st.adv_eps) if max(r) - min(r) > 1e-6 else 0.0
        span = episodes[e].steps[j]
        got = adv[e, span.action_start : span.action_end]
        torch.testing.assert_close(got, torch.full_like(got, traj[e] + st.step_advantage_w * think), atol=1e-4, rtol=1e-4)
    # non-qualifying steps (episode 1, episode 2's malformed step, episode 3) carry the trajectory advantage
    for e, j in [(1, 0), (1, 1), (2, 1), (3, 0)]:
        span = episodes[e].steps[j]
        got = adv[e, span.action_start : span.action_end]
        torch.testing.assert_close(got, torch.full_like(got, traj[e]), atol=1e-5, rtol=1e-5)
    assert float(adv[3].abs().max()) == 0.0

    m = batch.metrics
    # 7 steps, 5 parsed: levels 2, 1, 4, 4, 1
    assert m["rlvcr/level_frac_1"] == pytest.approx(2 / 5) and m["rlvcr/level_frac_4"] == pytest.approx(2 / 5)
    assert m["rlvcr/level_frac_2"] == pytest.approx(1 / 5) and m["rlvcr/level_frac_3"] == 0.0
    assert m["rlvcr/unparsed_frac"] == pytest.approx(2 / 7)
    assert m["rlvcr/qualifying_steps"] == 3.0 and m["rlvcr/qualifying_episodes"] == 2.0
    assert all(math.isfinite(v) for v in m.values())
    assert [r["rlvcr_malformed_steps"] for r in batch.rows] == [0, 1, 1, 0]


def test_group_mean_qualify_and_no_qualifying_step(setup, monkeypatch):
    _, tok, episodes, uids = setup
    # group a mean = 0.5: episodes 0 and 2 qualify as with the positive threshold; episode 3 is its
    # group's mean, so it qualifies too (level 1 -> 3 more generations)
    batch, engine, rec, _ = run_augmenter(setup, monkeypatch, rlvcr_qualify="group_mean")
    assert len(rec["groups"]) == 4 and [c[0] for c in engine.calls] == [10]
    assert float(batch.token_advantages[3].abs().max()) > 0  # traj 0 + w * thinking advantage
    # threshold above every reward: no generation, no scoring, pure trajectory advantage
    batch, engine, rec, st = run_augmenter(setup, monkeypatch, rlvcr_qualify_threshold=5.0)
    assert engine.calls == [] and "groups" not in rec
    traj = torch.tensor(grpo_loop([e.reward for e in episodes], uids))
    torch.testing.assert_close(batch.token_advantages, traj[:, None] * batch.response_mask.float())
    assert batch.metrics["rlvcr/qualifying_steps"] == 0.0


def test_collector_wrapper_augments_inner_batch(setup, monkeypatch):
    model, tok, episodes, uids = setup

    class Inner:
        engine = "the engine"

        def collect(self, request: CollectRequest):
            assert request.step == 0
            return make_batch(tok, episodes, uids)

    aug = RlvcrAugmenter(
        tok,
        HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id]),
        model,
        AlgorithmConfig(rlvcr_think_max_new_tokens=4),
    )
    wrapped = RlvcrCollector(Inner(), aug)
    assert wrapped.engine == "the engine"
    batch = wrapped.collect(CollectRequest([], step=0))
    assert batch.token_advantages is not None and "rlvcr/level_frac_1" in batch.metrics


def test_missing_episodes_is_a_clear_error(setup):
    model, tok, episodes, uids = setup
    batch = make_batch(tok, episodes, uids)
    batch.episodes = None
    aug = RlvcrAugmenter(
        tok, HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id]), model, AlgorithmConfig()
    )
    with pytest.raises(ValueError, match="episodes"):
        aug.augment(batch)


def test_score_malformed_steps_scores_them_as_level_1(setup, monkeypatch):
    _, tok, episodes, _ = setup
    batch, engine, rec, _ = run_augmenter(setup, monkeypatch, rlvcr_score_malformed_steps=True)
    # episode 2's malformed step now qualifies too (level 1 -> 3 generations): 7 + 3 prompts
    assert [c[0] for c in engine.calls] == [10] and len(rec["groups"]) == 4
    bad = rec["groups"][3]
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    assert list(bad.action_ids) == enc(BAD) and list(bad.thinking_ids[0]) == enc("<level>1</level>")
    assert batch.metrics["rlvcr/unparsed_frac"] == pytest.approx(2 / 7)  # the declared levels are reported


def test_scored_step_rules():
    from src.rollout.rlvcr.augment import scored_step
    from src.rollout.rlvcr.steps import parse_step

    assert scored_step(parse_step(GOOD_2), "x", False) == (2, "check the file", "cat strategy.py")
    assert scored_step(parse_step(BAD), BAD, False) == (None, "", "")
    assert scored_step(parse_step(BAD), BAD, True) == (1, "", BAD)
    assert scored_step(parse_step("<level>3</level><action>ls</action>"), "ls", True) == (3, "", "ls")
    assert scored_step(parse_step("<level>3</level>"), "", True) == (None, "", "")


def test_rlvcr_templates_ask_for_the_step_format():
    from src.rollout.rlvcr.augment import rlvcr_episode_templates

    t = rlvcr_episode_templates()
    assert "<level>k</level>" in t.system and "{observation}" in t.next_step
    head, body, tail = t.observation_parts("out")
    assert body == "out" and "<action>" in tail
    assert rlvcr_episode_templates(system="S").system == "S"


def test_budget_cut_turn_is_neither_scored_nor_penalised(setup, monkeypatch):
    model, tok, episodes, uids = setup
    import copy

    eps = copy.deepcopy(episodes)
    eps[0].steps[1].executed = False  # as if the token budget had cut the second turn
    batch, engine, rec, _ = run_augmenter((model, tok, eps, uids), monkeypatch, rlvcr_format_penalty=1.0)
    assert len(rec["groups"]) == 2 and [c[0] for c in engine.calls] == [4]
    span = eps[0].steps[1]
    traj = grpo_loop([1.0, 0.0 - 0.5, 0.5 - 0.5, -1.0], uids)
    got = batch.token_advantages[0, span.action_start : span.action_end]
    torch.testing.assert_close(got, torch.full_like(got, traj[0]), atol=1e-5, rtol=1e-5)


def test_generation_prompt_keeps_history_ids(setup, monkeypatch):
    model, tok, episodes, uids = setup
    seen = []

    class Recording(HFGenerateEngine):
        def generate(self, prompt_ids, sampling):
            seen.extend(prompt_ids)
            return super().generate(prompt_ids, sampling)

    aug = RlvcrAugmenter(
        tok,
        Recording(model, tok.pad_token_id, [tok.eos_token_id]),
        model,
        AlgorithmConfig(rlvcr_think_max_new_tokens=2),
    )
    aug.augment(make_batch(tok, episodes, uids))
    ep, step = episodes[0], episodes[0].steps[0]
    history = ep.prompt_ids + ep.response_ids[: step.action_start]
    first = seen[0]  # episode 0, step 0 (level 2): level 3 is generated first
    assert first[: len(history)] == history
    assert tok.decode(first[len(history) :]).endswith("<level>3</level><think>")
    assert "Thinking level 3" in tok.decode(first[len(history) :])


def test_factory_wraps_the_episode_collector_for_rlvcr(tiny):
    from pathlib import Path

    from src.config.job import compose_job
    from src.rollout.episodes.collector import EpisodeCollector
    from src.rollout.factory import make_episode_collector

    model, tok = tiny
    configs = Path(__file__).resolve().parents[3] / "configs"
    cfg = compose_job(["experiment=rlvcr"], configs)
    plain = compose_job(["experiment=rlvcr", "algorithm=grpo", "env.step_format=plain"], configs)
    bad = compose_job(["experiment=rlvcr", "env.step_format=fancy"], configs)

    class Module:
        actor = model

    engine = HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id])
    wrapped = make_episode_collector(cfg, tok, engine, Module())
    assert isinstance(wrapped, RlvcrCollector) and wrapped.engine is engine
    assert "<level>k</level>" in wrapped.inner.templates.system
    s = wrapped.augmenter.settings
    assert (s.rlvcr_qualify, s.rlvcr_score_malformed_steps, s.rlvcr_think_max_new_tokens) == ("group_mean", False, 16)
    inner = make_episode_collector(plain, tok, engine, Module())
    assert isinstance(inner, EpisodeCollector) and "<level>" not in inner.templates.system
    with pytest.raises(ValueError, match="step_format"):
        make_episode_collector(bad, tok, engine, Module())


def test_scoring_uses_the_generated_action_ids_not_a_re_encoding(setup, monkeypatch):
    """Token drift: the turn spells ``cat`` as three generated ids; decode -> encode would give one.
    The scorer must see the generated ids, after the ``<action>`` tag."""
    model, tok, _, _ = setup
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    vocab = tok.get_vocab()
    spelled = [vocab["c"], vocab["a"], vocab["t"]] + enc(" strategy.py")
    canonical = enc("cat strategy.py")
    assert spelled != canonical and tok.decode(spelled) == tok.decode(canonical)  # a real drift case
    head = enc("<level>2</level><think>check the file</think><action>")
    episode = build_episode(tok, [GOOD_1], reward=1.0)
    episode.response_ids = head + spelled + enc("</action>") + [tok.eos_token_id]
    episode.response_mask = [1] * len(episode.response_ids)
    episode.steps[0].action_end = len(episode.response_ids)
    episode.steps[0].action_text = "cat strategy.py"
    batch, _, rec, _ = run_augmenter((model, tok, [episode], ["a"]), monkeypatch, rlvcr_qualify="all")
    (group,) = rec["groups"]
    assert list(group.action_ids) == spelled
    assert list(group.action_prefix_ids) == enc("<action>")
    assert batch.token_advantages.shape == batch.response_mask.shape


class _PieceTokenizer:
    """A tokenizer over fixed string pieces: decode joins them (BPE merges across a tag, simulated)."""

    def __init__(self, pieces):
        self.pieces = list(pieces)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids)

    def encode(self, text):
        return [self.pieces.index(text)] if text in self.pieces else [-1]


def test_action_tokens_when_the_first_token_holds_the_end_of_the_tag():
    from src.rollout.rlvcr.steps import decode_with_offsets, generated_action_tokens

    tok = _PieceTokenizer(["<level>1</level>", "<action", ">ls", " -la", "</action>", "<eos>"])
    turn = [0, 1, 2, 3, 4, 5]
    text, offsets = decode_with_offsets(tok, turn, drop_ids={5})
    assert text == "<level>1</level><action>ls -la</action>" and offsets[5][0] == offsets[5][1]
    got = generated_action_tokens(text, offsets, turn, "ls -la", tok.encode)
    assert got.action_ids == [2, 3] and (got.start, got.end) == (2, 4)
    assert got.prefix_ids == tok.encode("<action")  # prefix + action ids spell the generated text
    # a first action token that reaches back before the tag cannot be scored after a prefix
    tok2 = _PieceTokenizer(["<level>1</level><action>ls", " -la", "</action>"])
    text2, offsets2 = decode_with_offsets(tok2, [0, 1, 2], drop_ids=set())
    assert generated_action_tokens(text2, offsets2, [0, 1, 2], "ls -la", tok2.encode) is None
    # no tag at all (a malformed step scored by the command the env ran): the tag is the prefix
    tok3 = _PieceTokenizer(["just", " ls", "<action>"])
    text3, offsets3 = decode_with_offsets(tok3, [0, 1], drop_ids=set())
    got3 = generated_action_tokens(text3, offsets3, [0, 1], "ls", tok3.encode)
    assert got3.action_ids == [1] and got3.prefix_ids == [2]
