import pytest

from src.datamodules.gpt_oss import GPT_OSS_TOKEN_IDS, HARMONY_SPECIAL_TOKENS
from src.models.tiny import TAG_TOKENS
from src.models.tokens import harmony_token_ids


def test_tiny_tokenizer_holds_every_harmony_and_tag_token_as_one_token(tiny):
    _, tok = tiny
    ids = harmony_token_ids(tok)
    assert set(ids) == set(HARMONY_SPECIAL_TOKENS) and len(set(ids.values())) == 6
    for tag in TAG_TOKENS:
        assert len(tok.encode(tag, add_special_tokens=False)) == 1
    # decoding keeps harmony tokens (they reach the reward)
    text = "<|start|>assistant<|channel|>final<|message|>hi<|return|>"
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text


class _FakeGptOss:
    """Stands in for o200k_harmony: a vocabulary that maps each control token to one id."""

    def __init__(self, ids):
        self.ids = ids

    def encode(self, text, add_special_tokens=False):
        return [self.ids[text]] if text in self.ids else [1, 2]


def test_gpt_oss_ids_must_match_the_seed_table():
    assert harmony_token_ids(_FakeGptOss(dict(GPT_OSS_TOKEN_IDS))) == {
        t: GPT_OSS_TOKEN_IDS[t] for t in HARMONY_SPECIAL_TOKENS
    }
    shifted = dict(GPT_OSS_TOKEN_IDS, **{"<|call|>": 5})
    with pytest.raises(ValueError, match="unexpected harmony ids"):
        harmony_token_ids(_FakeGptOss(shifted))
    with pytest.raises(ValueError, match="single tokens"):
        harmony_token_ids(_FakeGptOss({}))
