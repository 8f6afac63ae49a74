"""Checks that a tokenizer can carry the formats the data uses."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def harmony_token_ids(tokenizer) -> dict[str, int]:
    """Id of each harmony control token; raises when one does not encode as a single token.

    For a GPT-OSS tokenizer (o200k_harmony, recognised by holding ``<|start|>`` at its published
    id) every id must equal the seed's table, so the model sees exactly the ids it was trained on.
    """
    from src.datamodules.gpt_oss import GPT_OSS_TOKEN_IDS, HARMONY_SPECIAL_TOKENS

    ids = {}
    for token in HARMONY_SPECIAL_TOKENS:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(
                f"harmony token {token!r} encodes as {len(encoded)} tokens {encoded}; the tokenizer "
                "must hold the six harmony control tokens as single tokens"
            )
        ids[token] = encoded[0]
    if ids["<|start|>"] == GPT_OSS_TOKEN_IDS["<|start|>"]:
        wrong = {
            t: (ids[t], GPT_OSS_TOKEN_IDS[t])
            for t in HARMONY_SPECIAL_TOKENS
            if ids[t] != GPT_OSS_TOKEN_IDS[t]
        }
        if wrong:
            raise ValueError(f"GPT-OSS tokenizer with unexpected harmony ids (got, expected): {wrong}")
    return ids
