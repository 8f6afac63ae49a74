"""Trainer weights as an inference engine expects them: plain Hugging Face names, LoRA merged in.

Pure tensor code: a PEFT state dict (``base_model.model.<name>.base_layer.weight`` plus
``lora_A``/``lora_B`` factors) becomes ``<name>.weight = W + scaling * B @ A``.
"""

from __future__ import annotations

import math

import torch

PEFT_PREFIX = "base_model.model."


def lora_scaling_of(model) -> float | None:
    """alpha / r of a PEFT LoRA model's default adapter (alpha / sqrt(r) with rsLoRA); None otherwise."""
    config = getattr(model, "peft_config", {}).get("default")
    if config is None:
        return None
    r = config.r
    return config.lora_alpha / (math.sqrt(r) if getattr(config, "use_rslora", False) else r)


def _lora_factor(name: str) -> tuple[str, str] | None:
    """'x.q_proj.lora_A.default.weight' -> ('x.q_proj', 'A'); None for a non-LoRA name."""
    for factor in ("A", "B"):
        marker = f".lora_{factor}."
        if marker in name:
            return name.split(marker)[0], factor
    return None


def merged_weights(
    state_dict: dict[str, torch.Tensor], lora_scaling: float | None
) -> dict[str, torch.Tensor]:
    """PEFT or plain state dict -> {hf_name: tensor} with every LoRA pair merged into its base weight.

    Args:
        state_dict: the actor's ``state_dict()``; LoRA factors A [r, in] and B [out, r].
        lora_scaling: alpha / r (``lora_scaling_of``); needed when LoRA factors are present.
    """
    plain: dict[str, torch.Tensor] = {}
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for raw, tensor in state_dict.items():
        name = raw.removeprefix(PEFT_PREFIX)
        lora = _lora_factor(name)
        if lora is not None:
            factors.setdefault(lora[0], {})[lora[1]] = tensor
            continue
        if ".original_module." in name:  # PEFT keeps the untrained copy of modules_to_save
            continue
        name = name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        plain[name] = tensor
    if factors and lora_scaling is None:
        raise ValueError("LoRA factors in the state dict but no lora_scaling to merge them with")
    for module, ab in factors.items():
        if set(ab) != {"A", "B"} or f"{module}.weight" not in plain:
            raise ValueError(f"LoRA module {module!r}: needs lora_A, lora_B and its base weight")
        base = plain[f"{module}.weight"]
        delta = (ab["B"].float() @ ab["A"].float()) * lora_scaling
        plain[f"{module}.weight"] = (base.float() + delta).to(base.dtype)
    return plain


def safetensors_ready(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU tensors that safetensors accepts: tied weights (embeddings = lm_head)
    share storage, which it refuses, so a second name for the same storage gets its own copy."""
    tensors, seen = {}, set()
    for k, v in weights.items():
        v = v.detach().cpu().contiguous()
        tensors[k] = v.clone() if v.data_ptr() in seen else v
        seen.add(v.data_ptr())
    return tensors


def weights_to_bytes(weights: dict[str, torch.Tensor]) -> bytes:
    """{name: tensor} -> safetensors bytes: what crosses vLLM's RPC (msgpack turns tensors into lists)."""
    from safetensors.torch import save

    return save(safetensors_ready(weights))
