"""Load the actor LM and tokenizer: the embedded tiny model by default, any HF model dir by path."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from src.config.schema import LoraSettings
from src.models.tiny import TinyModelSpec, ensure_tiny_model

log = logging.getLogger(__name__)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_model_path(path: str | None, cache_dir: str, tiny: TinyModelSpec | None = None) -> Path:
    """``path`` of None/'tiny' means the embedded default (built and cached on first use)."""
    if path in (None, "", "tiny"):
        return ensure_tiny_model(cache_dir, tiny)
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model.path={path!r} does not exist (downloads are not done at run time)")
    check_model_config(p)
    return p


def check_model_config(model_dir: Path) -> None:
    """A model directory's ``config.json`` must be a JSON object; the error names the file."""
    import json

    config = model_dir / "config.json"
    if not model_dir.is_dir() or not config.is_file():
        raise FileNotFoundError(f"model.path: {config} not found (not a Hugging Face model directory)")
    try:
        parsed = json.loads(config.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"model.path: {config} is not valid JSON ({e})") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"model.path: {config} holds {type(parsed).__name__}, not a JSON object")


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if tok.chat_template is None:
        raise ValueError(f"tokenizer at {path} has no chat template; RLLA prompts need one")
    return tok


def load_causal_lm(
    path: Path, dtype: str = "float32", lora: LoraSettings | None = None, gradient_checkpointing: bool = False
):
    """An HF causal LM from ``path``, optionally wrapped with LoRA adapters (peft)."""
    from transformers import AutoModelForCausalLM

    if dtype not in _DTYPES:
        raise ValueError(f"model.dtype={dtype!r}; expected one of {sorted(_DTYPES)}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_DTYPES[dtype])
    model.train()  # from_pretrained returns eval mode; the trainer owns the mode from here
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if lora is not None and lora.enable:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )
    return model


def decoder_of(model):
    """The transformer body (no LM head) of a causal LM, through a peft wrapper if any."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(base, "model", None)
    if body is None:
        body = base.get_decoder()
    return body


# Model types whose forward returns the input embedding table's rows, unscaled, as hidden state 0
# (Gemma's, for one, are scaled: read through its forward).
LAYER_0_IS_THE_TABLE = ("llama", "mistral", "qwen2", "qwen3")


def input_embedding_rows(model, input_ids: torch.Tensor) -> torch.Tensor | None:
    """The hidden states [B, L, H] at layer 0 of ``input_ids`` [B, L], read from the model's input
    embedding table without running its layers: equal, bit for bit, to ``hidden_states[0]`` of its
    forward. None where that does not hold or cannot be read so: another model type, or weights
    sharded by FSDP2 / ZeRO-3 (gathered only inside the model's own forward)."""
    from src.rollout.engines.hf import sharding_of

    if getattr(getattr(model, "config", None), "model_type", None) not in LAYER_0_IS_THE_TABLE:
        return None
    if sharding_of(model) is not None:
        return None
    return model.get_input_embeddings()(input_ids)
