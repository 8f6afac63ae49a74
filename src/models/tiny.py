"""The embedded default model: a byte-level BPE tokenizer trained locally and a random-init
Qwen2 causal LM, built on first use and cached on disk. Nothing is downloaded.

The tokenizer carries a ChatML chat template and, as single tokens, the tags the RLLA XML
format, the GPT-OSS harmony format and the RLVCR step format use, so that a tiny model can
learn them as units.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Iterable

from src.config.schema import TinyModelSpec

log = logging.getLogger(__name__)

CHAT_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Harmony control tokens are special in GPT-OSS; they must stay single tokens here too.
HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>"]
# XML / RLVCR tags: added as normal (non-special) tokens so decoding keeps them.
TAG_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<response>",
    "</response>",
    "<level>",
    "</level>",
    "<action>",
    "</action>",
    "<obs>",
    "</obs>",
]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def spec_fingerprint(spec: TinyModelSpec) -> str:
    """The cache key of a ``TinyModelSpec`` (declared in ``src.config.schema``, the ``model.tiny`` node)."""
    from src.datamodules.synthetic import GENERATOR_VERSION

    key = {**asdict(spec), "corpus_version": GENERATOR_VERSION}
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]


def build_tiny_tokenizer(corpus: Iterable[str], vocab_size: int = 4096):
    """Train a byte-level BPE on ``corpus`` and wrap it as a HF fast tokenizer with ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=CHAT_SPECIAL_TOKENS + HARMONY_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"] + HARMONY_TOKENS,
    )
    fast.add_tokens(TAG_TOKENS)
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def default_corpus(n_rows: int, seed: int) -> list[str]:
    """Text the tiny tokenizer is trained on: synthetic RLLA rows in XML and harmony form."""
    from src.datamodules.synthetic import generate_rlla_rows

    df = generate_rlla_rows(n_rows, seed=seed, split="train")
    texts: list[str] = []
    for _, row in df.iterrows():
        for msg in row["prompt"]:
            texts.append(msg["content"])
        texts.append(row["reward_model"]["ground_truth"])
    try:  # harmony text, when the converter is available
        from src.datamodules.gpt_oss import convert_ground_truth

        texts += [convert_ground_truth(t) for t in df["reward_model"].map(lambda r: r["ground_truth"])]
    except ImportError:
        pass
    texts += [
        "You are playing a repeated game. Edit strategy.py with shell commands, then validate and submit.",
        "cat strategy.py\nvalidate\nsubmit\npython -c 'print(1)'\ndef row_strategy(history):\n    return 0\n",
    ]
    return texts


def build_tiny_model(tokenizer, spec: TinyModelSpec):
    """A random-init Qwen2ForCausalLM sized by ``spec`` for ``tokenizer``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(spec.seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def ensure_tiny_model(cache_dir: str | os.PathLike, spec: TinyModelSpec | None = None) -> Path:
    """Return the directory of the cached tiny model, building it first if needed.

    The directory name carries the spec's fingerprint, so a changed spec builds a new model.
    Written to a temporary directory and renamed, so a crash never leaves half a model.
    """
    from src.atomic_files import atomic_dir, discard_if_broken, hf_model_dir_intact

    spec = spec or TinyModelSpec()
    target = Path(cache_dir).expanduser() / f"tiny-qwen2-{spec_fingerprint(spec)}"
    if discard_if_broken(target, hf_model_dir_intact):
        return target
    log.info("building the embedded tiny model at %s", target)
    tokenizer = build_tiny_tokenizer(default_corpus(spec.corpus_rows, spec.seed), spec.vocab_size)
    model = build_tiny_model(tokenizer, spec)
    with atomic_dir(target) as tmp:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        (tmp / "tiny_spec.json").write_text(json.dumps(asdict(spec), indent=2))
    return target
