"""Supervised fine-tuning on RLLA ground truths (``experiment=sft``) and the cached SFT warm start
that the router demo starts from.

With ``sft.route_augment`` every row is also shown under route-conditioned prompts (see
``src.rollout.route_prompts``): the ANSWER route paired with a direct answer, and the tool routes
paired with the ground truth, so the warm-started model follows route instructions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

log = logging.getLogger(__name__)

DIRECT_ANSWER_XML = ("<think> No tools are available for this turn, so I answer directly. </think>\n"
                     "<response> I can't use tools right now; here is my best direct answer. </response>")


class SFTModule(pl.LightningModule):
    """Next-token cross-entropy on target tokens only (labels -100 elsewhere)."""

    def __init__(self, model, lr: float = 1e-3, weight_decay: float = 0.0):
        super().__init__()
        self.model, self.lr, self.weight_decay = model, lr, weight_decay

    def training_step(self, batch, batch_idx):
        from src.models.loading import decoder_of

        # The LM head runs only where there is a target: prompts are most of each sequence.
        hidden = decoder_of(self.model)(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        labels = batch["labels"][:, 1:]
        keep = labels != -100
        logits = self.model.get_output_embeddings()(hidden[:, :-1][keep])
        loss = torch.nn.functional.cross_entropy(logits.float(), labels[keep])
        self.log("train/sft_loss", loss, prog_bar=True, on_step=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def _encode(tokenizer, messages: list[dict], target: str, max_len: int) -> dict[str, list[int]] | None:
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    answer = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    if len(prompt) + len(answer) > max_len:
        return None
    return {"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}


def sft_examples(records: list[dict[str, Any]], route_augment: bool, families=None) -> list[tuple[list[dict], str]]:
    """(messages, target) pairs. Plain: each row's prompt and ground truth."""
    if not route_augment:
        return [(r["messages"], r["ground_truth"]) for r in records]
    from src.datamodules.gpt_oss import convert_ground_truth
    from src.rewards.dispatch import response_format
    from src.rewards.tool_families import tool_descriptions, weak_label
    from src.rollout.route_prompts import route_messages
    from src.rollout.routes import Route

    pairs = []
    for r in records:
        fmt = response_format(r["data_source"])
        system = next(m["content"] for m in r["messages"] if m["role"] == "system")
        label = weak_label(r["ground_truth"], families, fmt=fmt, descriptions=tool_descriptions(system))
        direct = DIRECT_ANSWER_XML if fmt == "xml" else convert_ground_truth(DIRECT_ANSWER_XML)

        def route(action, messages=r["messages"], fmt=fmt):
            return route_messages(messages, action, families, fmt=fmt)

        if label == "ANSWER":
            pairs += [(route(Route.ANSWER), r["ground_truth"]), (route(Route.SEARCH), r["ground_truth"]),
                      (route(Route.CALCULATE), r["ground_truth"])]
        else:
            own = Route.CALCULATE if label == "CALCULATE" else Route.SEARCH
            pairs += [(route(own), r["ground_truth"]), (route(Route.ANSWER), direct)]
    return pairs


def _collate(pad_id: int):
    def collate(items):
        width = max(len(i["input_ids"]) for i in items)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        labels = torch.full((len(items), width), -100, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for k, it in enumerate(items):
            n = len(it["input_ids"])
            ids[k, :n], labels[k, :n], mask[k, :n] = torch.tensor(it["input_ids"]), torch.tensor(it["labels"]), 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate


def _records(cfg: DictConfig, tokenizer) -> list[dict[str, Any]]:
    from src.train import build_datamodule

    dm = build_datamodule(cfg, tokenizer)
    dm.setup("fit")
    return list(dm.train_dataset)


def fit_sft(cfg: DictConfig, model_path: Path, out_dir: Path | None) -> tuple[dict[str, float], dict[str, Any]]:
    """Run SFT from ``model_path``; save the result to ``out_dir`` (atomically) when given."""
    from src.models.loading import load_causal_lm, load_tokenizer
    from src.rollout.factory import make_families

    s = cfg.sft
    tokenizer = load_tokenizer(model_path)
    model = load_causal_lm(model_path, cfg.model.dtype)
    pairs = sft_examples(_records(cfg, tokenizer), s.route_augment, make_families(cfg))
    encoded = [e for e in (_encode(tokenizer, m, t, s.max_length) for m, t in pairs) if e is not None]
    if len(encoded) < len(pairs):
        log.warning("SFT: dropped %d of %d examples longer than sft.max_length=%d",
                    len(pairs) - len(encoded), len(pairs), s.max_length)
    loader = DataLoader(encoded, batch_size=s.batch_size, shuffle=True, collate_fn=_collate(tokenizer.pad_token_id),
                        generator=torch.Generator().manual_seed(cfg.seed))
    trainer = pl.Trainer(max_steps=s.max_steps, max_epochs=-1, accelerator=cfg.trainer.accelerator, devices=1,
                         precision=cfg.trainer.precision, logger=pl.loggers.TensorBoardLogger(
                             save_dir=str(cfg.run_dir), name="tensorboard_sft", version=""),
                         enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=10,
                         gradient_clip_val=1.0, default_root_dir=str(cfg.run_dir))
    module = SFTModule(model, lr=s.lr)
    trainer.fit(module, train_dataloaders=loader)
    if out_dir is not None:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".sft-"))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    metrics = {k: float(v) for k, v in trainer.logged_metrics.items()}
    return metrics, {"trainer": trainer, "module": module}


def run_sft(cfg: DictConfig):
    """``experiment=sft``: fine-tune the configured model and save it under the run dir."""
    from src.models.loading import resolve_model_path
    from src.models.tiny import TinyModelSpec
    from src.train import _dataclass_from

    base = resolve_model_path(cfg.model.path, cfg.cache_dir, _dataclass_from(TinyModelSpec, cfg.model.tiny))
    return fit_sft(cfg, base, Path(cfg.run_dir) / "model")


def ensure_sft_warm_start(cfg: DictConfig, base: Path) -> Path:
    """The cached SFT warm start of ``base`` for this data and SFT config (built on first use)."""
    key = json.dumps({"base": str(base), "sft": OmegaConf.to_container(cfg.sft, resolve=True),
                      "data": OmegaConf.to_container(cfg.data, resolve=True), "seed": cfg.seed}, sort_keys=True)
    out = Path(cfg.cache_dir) / "warm_start" / f"sft-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    if (out / "config.json").exists():
        return out
    log.info("building the SFT warm start at %s (cached for later runs)", out)
    fit_sft(cfg, base, out)
    return out
