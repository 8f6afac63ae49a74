import pytest
import torch
import transformers

from src.rollout.rlvcr.scoring import ScoringGroup, score_level_groups, score_levels

PAD = 0
ACTION_TAG = [5, 6]
LEVEL_TAGS = [[10, 1, 11], [10, 2, 11], [10, 3, 11], [10, 4, 11]]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
    )
    return transformers.Qwen2ForCausalLM(cfg).eval()


def random_group(gen, think_lens, action_len, history_len=7):
    ids = lambda n: torch.randint(12, 64, (n,), generator=gen).tolist()
    return ScoringGroup(
        history_ids=ids(history_len),
        thinking_ids=[LEVEL_TAGS[k] + ids(n) for k, n in enumerate(think_lens)],
        action_ids=ids(action_len),
    )


@torch.no_grad()
def reference(model, group):
    """Plain loop: one unbatched forward per level, scoring action tokens only."""
    logps, ents = [], []
    for thinking in group.thinking_ids:
        seq = list(group.history_ids) + list(thinking) + ACTION_TAG + list(group.action_ids)
        logits = model(input_ids=torch.tensor([seq])).logits[0].double()
        start = len(seq) - len(group.action_ids)
        lp_sum, ent_sum = 0.0, 0.0
        for pos in range(start, len(seq)):
            logp = torch.log_softmax(logits[pos - 1], -1)
            lp_sum += float(logp[seq[pos]])
            ent_sum += float(-(logp.exp() * logp).sum())
        logps.append(lp_sum / len(group.action_ids))
        ents.append(ent_sum / len(group.action_ids))
    return torch.tensor(logps, dtype=torch.float64), torch.tensor(ents, dtype=torch.float64)


def test_one_group_matches_per_sequence_loop(model):
    gen = torch.Generator().manual_seed(1)
    g = random_group(gen, think_lens=[0, 3, 9, 15], action_len=4)
    out = score_levels(model, PAD, g.history_ids, g.thinking_ids, ACTION_TAG, g.action_ids, LEVEL_TAGS)
    ref_lp, ref_ent = reference(model, g)
    assert out.action_logprob.shape == out.action_entropy.shape == (4,)
    torch.testing.assert_close(out.action_logprob.double(), ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.action_entropy.double(), ref_ent, atol=1e-5, rtol=1e-5)
    assert out.thinking_tokens.tolist() == [0, 3, 9, 15]  # level tags are not counted
    # entropy of a 64-way distribution lies in (0, log 64]
    assert bool((out.action_entropy > 0).all())
    assert bool((out.action_entropy <= torch.log(torch.tensor(64.0))).all())


def test_many_groups_in_one_forward_match_loop_and_chunks(model):
    gen = torch.Generator().manual_seed(2)
    groups = [
        random_group(gen, [0, 2, 5, 8], action_len=1, history_len=3),
        random_group(gen, [0, 6, 1, 20], action_len=6, history_len=12),
        random_group(gen, [0, 4, 4, 4], action_len=3, history_len=1),
    ]
    calls = []
    handle = model.register_forward_hook(lambda m, a, kw_out: calls.append(1))
    try:
        out = score_level_groups(model, groups, ACTION_TAG, LEVEL_TAGS, PAD)
    finally:
        handle.remove()
    assert len(calls) == 1  # all 12 rows in a single forward
    assert out.action_logprob.shape == (3, 4)
    for i, g in enumerate(groups):
        ref_lp, ref_ent = reference(model, g)
        torch.testing.assert_close(out.action_logprob[i].double(), ref_lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.action_entropy[i].double(), ref_ent, atol=1e-5, rtol=1e-5)
    chunked = score_level_groups(model, groups, ACTION_TAG, LEVEL_TAGS, PAD, max_rows=5)
    torch.testing.assert_close(chunked.action_logprob, out.action_logprob, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked.action_entropy, out.action_entropy, atol=1e-5, rtol=1e-5)


class FullLogitsOnly(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` (the full-logits fallback path)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


def test_full_logits_fallback_gives_the_same_scores(model):
    gen = torch.Generator().manual_seed(3)
    groups = [random_group(gen, [0, 3, 7, 11], action_len=5, history_len=9) for _ in range(2)]
    fast = score_level_groups(model, groups, ACTION_TAG, LEVEL_TAGS, PAD)
    slow = score_level_groups(FullLogitsOnly(model), groups, ACTION_TAG, LEVEL_TAGS, PAD)
    torch.testing.assert_close(fast.action_logprob, slow.action_logprob, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.action_entropy, slow.action_entropy, atol=1e-5, rtol=1e-5)


def test_bad_groups_raise_clear_errors(model):
    gen = torch.Generator().manual_seed(4)
    g = random_group(gen, [0, 1, 2, 3], action_len=2)
    with pytest.raises(ValueError, match=r"group 0, level 2: thinking ids do not start with the level tag"):
        score_levels(
            model,
            PAD,
            g.history_ids,
            [g.thinking_ids[0], [99]] + g.thinking_ids[2:],
            ACTION_TAG,
            g.action_ids,
            LEVEL_TAGS,
        )
    with pytest.raises(ValueError, match="group 0: empty action_ids"):
        score_levels(model, PAD, g.history_ids, g.thinking_ids, ACTION_TAG, [], LEVEL_TAGS)
    with pytest.raises(ValueError, match="expected 4 thinking lists"):
        score_levels(model, PAD, g.history_ids, g.thinking_ids[:3], ACTION_TAG, g.action_ids, LEVEL_TAGS)
