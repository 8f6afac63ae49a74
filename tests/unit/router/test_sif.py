"""SIF pooling (src.router.head, router.pooling=sif): the vectorised math against plain loops."""

import collections

import pytest
import torch

from src.router.head import (
    RouterHead,
    UnseenRule,
    common_component,
    prompt_representation,
    remove_component,
    sif_token_weights,
    tail_mask,
    token_counts,
    unseen_words,
    word_starts,
)


def test_token_counts_match_a_counter_over_each_prompts_tail():
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, 20, (int(n),), generator=g).tolist()
        for n in torch.randint(1, 30, (40,), generator=g)
    ]
    want = collections.Counter(t for p in prompts for t in p[-7:])
    got = token_counts(prompts, 20, tail_tokens=7)
    assert got.tolist() == [float(want.get(i, 0)) for i in range(20)]


def test_token_counts_name_the_prompt_with_an_id_outside_the_vocabulary():
    with pytest.raises(ValueError, match="prompt 1"):
        token_counts([[1, 2], [3, 25]], 20, tail_tokens=4)


def test_sif_weights_are_a_over_a_plus_frequency():
    counts = torch.tensor([0.0, 1.0, 3.0, 6.0], dtype=torch.float64)
    got = sif_token_weights(counts, 0.05)
    want = [0.05 / (0.05 + c / 10.0) for c in counts.tolist()]
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    assert got[0] == 1.0  # a token never seen in training keeps full weight
    with pytest.raises(ValueError, match="a must be > 0"):
        sif_token_weights(counts, 0.0)
    with pytest.raises(ValueError, match="every count is 0"):
        sif_token_weights(torch.zeros(3), 0.1)


def test_unseen_tokens_weigh_what_unseen_weight_says_and_pool_as_if_absent():
    """router.sif_unseen_weight: a token with count 0 weighs it (seen tokens keep a / (a + p)); at 0
    a prompt pools as the same prompt without its unseen tokens (the window holds them all here)."""
    counts = torch.tensor([0.0, 1.0, 3.0, 0.0, 6.0], dtype=torch.float64)
    plain = sif_token_weights(counts, 0.05)
    for unseen in (0.0, 0.25):
        got = sif_token_weights(counts, 0.05, unseen)
        assert got[[0, 3]].tolist() == [unseen, unseen]
        assert got[[1, 2, 4]].tolist() == plain[[1, 2, 4]].tolist()
    with pytest.raises(ValueError, match="unseen_weight must be >= 0"):
        sif_token_weights(counts, 0.05, -0.1)
    weight = sif_token_weights(counts, 0.05, 0.0).float()
    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([[1, 0, 2, 3, 4, 1]])
    h = torch.randn(1, 6, 8, generator=g)
    u = torch.nn.functional.normalize(torch.randn(8, generator=g), dim=0)
    mask = torch.ones_like(ids)
    got = prompt_representation(h, mask, "sif", 16, weight[ids], u)
    seen = torch.tensor([0, 2, 4, 5])  # positions of ids 1, 2, 4, 1
    want = prompt_representation(h[:, seen], mask[:, seen], "sif", 16, weight[ids[:, seen]], u)
    assert torch.allclose(got, want, atol=1e-6)
    assert not torch.allclose(got, prompt_representation(h, mask, "sif", 16, plain.float()[ids], u))


def test_common_component_is_the_dominant_direction_by_power_iteration():
    g = torch.Generator().manual_seed(1)
    direction = torch.randn(16, generator=g)
    direction /= direction.norm()
    x = torch.randn(200, 16, generator=g) * 0.3 + torch.randn(200, 1, generator=g) * 3.0 * direction
    u = common_component(x)
    v = torch.randn(16, dtype=torch.float64, generator=g)
    gram = x.double().T @ x.double()
    for _ in range(500):  # plain power iteration on the uncentred Gram matrix
        v = gram @ v
        v /= v.norm()
    assert float(u.norm()) == pytest.approx(1.0, abs=1e-6)
    assert abs(float(u.double() @ v)) == pytest.approx(1.0, abs=1e-6)
    assert float(u[u.abs().argmax()]) > 0  # sign fixed: the same vector on every call
    assert torch.equal(common_component(-x), u)


def test_remove_component_leaves_rows_orthogonal_and_zero_leaves_them_alone():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 8, generator=g)
    u = torch.randn(8, generator=g)
    u /= u.norm()
    out = remove_component(x, u)
    assert (out @ u).abs().max() < 1e-6
    for row, got in zip(x, out):
        assert torch.allclose(got, row - (row @ u) * u, atol=1e-6)
    assert torch.equal(remove_component(x, torch.zeros(8)), x)


@pytest.mark.parametrize("left_pad", [True, False])
def test_sif_pooling_matches_a_loop_over_each_rows_last_tokens(left_pad):
    g = torch.Generator().manual_seed(3)
    lengths, width, hidden, tail = [9, 3, 6], 9, 4, 5
    h = torch.randn(3, width, hidden, generator=g)
    weight = torch.rand(3, width, generator=g) + 0.1
    mask = torch.zeros(3, width)
    for i, n in enumerate(lengths):
        if left_pad:
            mask[i, width - n :] = 1
        else:
            mask[i, :n] = 1
    u = torch.randn(hidden, generator=g)
    u /= u.norm()
    got = prompt_representation(h, mask, "sif", tail, weight, u)
    for i, n in enumerate(lengths):
        real = [j for j in range(width) if mask[i, j] == 1][-tail:]
        w = weight[i, real]
        pooled = (w[:, None] * h[i, real]).sum(0) / w.sum()
        assert torch.allclose(got[i], pooled - (pooled @ u) * u, atol=1e-6)
    assert torch.equal(
        tail_mask(mask, tail).sum(1), torch.tensor([min(n, tail) for n in lengths], dtype=torch.float32)
    )


def test_unfitted_sif_head_is_the_tail_mean_and_needs_token_ids():
    g = torch.Generator().manual_seed(4)
    torch.manual_seed(0)
    head = RouterHead(8, 16, pooling="sif", tail_tokens=3, vocab_size=30)
    h, mask = torch.randn(2, 6, 8, generator=g), torch.ones(2, 6)
    ids = torch.randint(0, 30, (2, 6), generator=g)
    assert torch.allclose(head.represent(h, mask, ids), prompt_representation(h, mask, "tail", 3), atol=1e-6)
    with pytest.raises(ValueError, match="pass prompt_ids"):
        head(h, mask)
    with pytest.raises(ValueError, match="sif_weight: shape"):
        head.set_sif(torch.ones(29), torch.zeros(8))
    with pytest.raises(ValueError, match="vocab_size"):
        RouterHead(8, pooling="sif")
    weight = torch.rand(30, generator=g)
    head.set_sif(weight, torch.zeros(8))
    got = head.represent(h, mask, ids)
    w = weight[ids[:, -3:]]
    assert torch.allclose(got, (w[..., None] * h[:, -3:]).sum(1) / w.sum(1, keepdim=True), atol=1e-6)
    assert {"sif_weight", "sif_component"} <= set(head.state_dict())  # checkpointed with the head


def _unseen_words_by_loop(unseen, start):
    """Plain reference: walk each row, flag every position of a word with an unseen token."""
    out = torch.zeros_like(unseen)
    for b in range(unseen.shape[0]):
        words, current = [], []
        for j in range(unseen.shape[1]):
            if start[b, j] and current:
                words.append(current)
                current = []
            current.append(j)
        words.append(current)
        for w in words:
            if any(bool(unseen[b, j]) for j in w):
                out[b, w] = True
    return out


def test_unseen_words_match_a_loop_over_each_rows_words():
    g = torch.Generator().manual_seed(5)
    for _ in range(20):
        unseen = torch.rand(4, 11, generator=g) < 0.15
        start = torch.rand(4, 11, generator=g) < 0.4
        assert torch.equal(unseen_words(unseen, start), _unseen_words_by_loop(unseen, start))
    # every token its own word: the tokens themselves; no word start at all: the whole row
    unseen = torch.tensor([[False, True, False, False]])
    assert torch.equal(unseen_words(unseen, torch.ones_like(unseen)), unseen)
    assert unseen_words(unseen, torch.zeros_like(unseen)).all()


def test_word_starts_read_byte_level_sentencepiece_and_wordpiece_vocabularies():
    byte_level = ["F", "ind", "Ġso", "me", "Ġ", "de", "ails", ".", "<|im_end|>", "Ċ", None]
    want = [False, False, True, False, True, False, False, True, True, True, True]
    assert word_starts(byte_level).tolist() == want
    assert word_starts(["▁Find", "ing", "▁", "1", "<0x0A>"]).tolist() == [True, False, True, False, True]
    assert word_starts(["find", "##ing", "[PAD]", "##s"]).tolist() == [True, False, True, False]


def test_word_unit_weighs_a_new_words_known_pieces_as_unseen_and_leaves_seen_words_alone():
    """A word with an unseen piece pools as if absent (weight 0) in every piece, within the tail;
    a prompt whose window has no unseen piece pools exactly as under the token unit."""
    g = torch.Generator().manual_seed(6)
    torch.manual_seed(0)
    word = RouterHead(8, 16, pooling="sif", tail_tokens=5, vocab_size=10, unseen=UnseenRule(0.0, "word"))
    torch.manual_seed(0)
    token = RouterHead(8, 16, pooling="sif", tail_tokens=5, vocab_size=10, unseen=UnseenRule(0.0))
    seen = torch.tensor([True] * 8 + [False] * 2)  # ids 8 and 9 never occur in the training windows
    start = torch.tensor([True, True, True, False, False, True, True, False, False, False])
    weight = torch.where(seen, torch.rand(10, generator=g) + 0.1, torch.zeros(10))
    component = torch.zeros(8)
    token.set_sif(weight, component)
    word.set_sif(weight, component, seen=seen, word_start=start)
    assert {"sif_seen", "sif_word_start"} <= set(word.state_dict())
    h = torch.randn(2, 7, 8, generator=g)
    mask = torch.ones(2, 7)
    # row 0: ids 2 (start) 3 8: a word with an unseen piece; row 1: every piece seen
    ids = torch.tensor([[0, 1, 5, 2, 3, 8, 6], [0, 1, 5, 2, 3, 4, 6]])
    got, plain = word.represent(h, mask, ids), token.represent(h, mask, ids)
    assert torch.equal(got[1], plain[1])
    w = weight[ids[0, -5:]].clone()
    w[1:4] = 0  # positions of the word 2 3 8 inside the tail
    assert torch.allclose(got[0], (w[:, None] * h[0, -5:]).sum(0) / w.sum(), atol=1e-6)
    # an unseen piece outside the tail does not reach into it: id 9 then 3 (a continuation) in the tail
    ids2 = torch.tensor([[2, 9, 3, 3, 5, 6, 1]])
    assert torch.equal(word.represent(h[:1], mask[:1], ids2), token.represent(h[:1], mask[:1], ids2))
    with pytest.raises(ValueError, match="sif_unseen_unit"):
        RouterHead(8, pooling="sif", vocab_size=10, unseen=UnseenRule(0.0, "piece"))
