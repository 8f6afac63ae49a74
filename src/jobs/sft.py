"""Supervised fine-tuning on RLLA ground truths (``experiment=sft``) and the cached SFT warm starts:
``model.warm_start: sft`` (RLLA ground truths; the router demo) and ``model.warm_start: rlvcr_sft``
(scripted multi-step episodes in the RLVCR step format; ``experiment=rlvcr``).

With ``sft.route_augment`` every row is shown under all three route-conditioned prompts with the
target a route-following actor writes (``src.jobs.route_sft``), so the warm-started model does
what the route says and the router's choice decides reward and cost. Progress (step, loss, ETA)
is logged every ``sft.log_every`` steps by ``SFTProgressLog``. SIGINT / SIGTERM save the fit's
whole state beside the model it would write, and the same command resumes it
(``src.jobs.sft_resume``): the result is the uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from src.callbacks.checkpointing import Preempted, StopOnSignal
from src.config.validate import ConfigError
from src.jobs.sft_resume import EndlessShuffle, interrupted_path, resumable_step

log = logging.getLogger(__name__)

# in the warm starts' cache key: an entry trained with another data order is not this one
ORDER_VERSION = "endless-shuffle-v1"


class SFTModule(pl.LightningModule):
    """Next-token cross-entropy on target tokens only (labels -100 elsewhere).

    ``decay_steps``: when set, the learning rate warms up over the first 5% of the steps and then
    follows a cosine to 0 at ``decay_steps`` (short runs end at a much lower loss than with a
    constant rate); None keeps it constant.
    """

    def __init__(self, model, lr: float = 1e-3, weight_decay: float = 0.0, decay_steps: int | None = None):
        super().__init__()
        self.model, self.lr, self.weight_decay, self.decay_steps = model, lr, weight_decay, decay_steps

    def training_step(self, batch, batch_idx):
        from src.models.loading import decoder_of

        # The LM head runs only where there is a target: prompts are most of each sequence.
        hidden = decoder_of(self.model)(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        labels = batch["labels"][:, 1:]
        keep = labels != -100
        logits = self.model.get_output_embeddings()(hidden[:, :-1][keep])
        loss = torch.nn.functional.cross_entropy(logits.float(), labels[keep])
        self.log("train/sft_loss", loss, prog_bar=True, on_step=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if self.decay_steps is None:
            return opt
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, functools.partial(warmup_cosine, total=self.decay_steps)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # an interrupted SFT resumes with the RNG state it stopped with (dropout, if any)
        from lightning.fabric.utilities.seed import _collect_rng_states

        checkpoint["sft_rng_states"] = _collect_rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from lightning.fabric.utilities.seed import _set_rng_states

        _set_rng_states(checkpoint["sft_rng_states"])


def warmup_cosine(step: int, total: int) -> float:
    """LR multiplier at optimizer ``step``: linear warm-up over 5% of ``total``, then cosine to 0."""
    warm = max(1, total // 20)
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


def _encode(tokenizer, messages: list[dict], target: str, max_len: int) -> dict[str, list[int]] | None:
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    answer = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    if len(prompt) + len(answer) > max_len:
        return None
    return {"input_ids": prompt + answer, "labels": [-100] * len(prompt) + answer}


def sft_examples(
    records: list[dict[str, Any]],
    route_augment: bool,
    families=None,
    prompt_mode: str = "emphasis",
    misrouted_tool: str = "first",
) -> list[tuple[list[dict], str]]:
    """(messages, target) pairs. Plain: each row's prompt and ground truth. ``route_augment``: each
    row under all three route prompts with route-following targets (``src.jobs.route_sft``;
    ``misrouted_tool`` as ``sft.misrouted_tool``)."""
    if not route_augment:
        return [(r["messages"], r["ground_truth"]) for r in records]
    from src.jobs.route_sft import route_following_examples
    from src.router.families import ToolFamilies

    return route_following_examples(records, families or ToolFamilies(), prompt_mode, misrouted_tool)


def _collate(pad_id: int):
    def collate(items):
        width = max(len(i["input_ids"]) for i in items)
        ids = torch.full((len(items), width), pad_id, dtype=torch.long)
        labels = torch.full((len(items), width), -100, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for k, it in enumerate(items):
            n = len(it["input_ids"])
            ids[k, :n], labels[k, :n], mask[k, :n] = (
                torch.tensor(it["input_ids"]),
                torch.tensor(it["labels"]),
                1,
            )
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate


def _records(cfg: DictConfig, tokenizer) -> list[dict[str, Any]]:
    from src.jobs.build import build_data_group_datamodule

    dm = build_data_group_datamodule(cfg, tokenizer)
    dm.setup("fit")
    return list(dm.train_dataset)


def _save_atomically(model, tokenizer, out_dir: Path) -> None:
    """Write the model + tokenizer to ``out_dir`` via a temp dir and one rename (no half-written cache)."""
    from src.atomic_files import atomic_dir

    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


def _sft_trainer(cfg: DictConfig, save_to: Path | None) -> tuple[pl.Trainer, StopOnSignal]:
    """The SFT trainer and its signal stop (which saves the resumable state to ``save_to``)."""
    from src.callbacks.checkpointing import AtomicCheckpointIO

    from src.jobs.build import build_callbacks

    s = cfg.sft
    callbacks = build_callbacks(cfg, {"save_to": lambda: save_to}, group="sft_callbacks")
    stopper = next((cb for cb in callbacks if isinstance(cb, StopOnSignal)), None)
    if stopper is None:  # Lightning would add its own periodic ModelCheckpoint
        raise ConfigError(["sft_callbacks: the SFT fit needs its StopOnSignal (stop_on_signal)"])
    trainer = pl.Trainer(
        max_steps=s.max_steps,
        max_epochs=-1,
        accelerator=cfg.trainer.accelerator,
        devices=1,
        precision=cfg.trainer.precision,
        logger=pl.loggers.TensorBoardLogger(save_dir=str(cfg.run_dir), name="tensorboard_sft", version=""),
        enable_checkpointing=True,  # StopOnSignal is its only checkpoint callback: no periodic saves
        enable_model_summary=False,
        # every step: Lightning also logs a step off its schedule when a signal stops the fit
        # (should_stop), which a resumed run's TensorBoard would keep as a point the uninterrupted
        # run never wrote; with every step logged the stop's point is a scheduled one
        log_every_n_steps=1,
        gradient_clip_val=1.0,
        default_root_dir=str(cfg.run_dir),
        plugins=[AtomicCheckpointIO()],
        callbacks=callbacks,
    )
    return trainer, stopper


def _resume_point(out_dir: Path | None, max_steps: int) -> tuple[Path | None, int]:
    """(where an interruption saves, steps an earlier interrupted run of this fit already did)."""
    if out_dir is None:
        return None, 0
    save_to = interrupted_path(out_dir)
    done = resumable_step(save_to)
    if done is not None:
        log.info(
            "resuming SFT from %s at step %d of %d (an earlier run was interrupted)", save_to, done, max_steps
        )
    return save_to, done or 0


def train_on_examples(
    cfg: DictConfig, model, tokenizer, examples: list[dict[str, list[int]]], out_dir: Path | None
) -> tuple[dict[str, float], dict[str, Any]]:
    """SFT ``model`` on ``{"input_ids", "labels"}`` examples with ``cfg.sft``; save to ``out_dir`` when
    given. A signal saves the resumable state beside ``out_dir`` (``src.jobs.sft_resume``), which the
    next call for the same ``out_dir`` continues from."""
    s = cfg.sft
    if not examples:
        raise ValueError("SFT: no training examples (all longer than sft.max_length?)")
    save_to, done = _resume_point(out_dir, int(s.max_steps))
    loader = DataLoader(
        examples,
        batch_size=s.batch_size,
        sampler=EndlessShuffle(len(examples), sft_seed(cfg), start=done * int(s.batch_size)),
        collate_fn=_collate(tokenizer.pad_token_id),
        generator=torch.Generator().manual_seed(sft_seed(cfg)),  # not the global RNG the model may use
    )
    trainer, stopper = _sft_trainer(cfg, save_to)
    log.info("SFT: %d examples, %d steps of batch %d", len(examples), s.max_steps, s.batch_size)
    module = SFTModule(model, lr=s.lr, decay_steps=s.max_steps if s.get("lr_decay", False) else None)
    # weights_only=False: the file is this fit's own save, and holds numpy's RNG state
    ckpt = str(save_to) if done else None
    trainer.fit(module, train_dataloaders=loader, ckpt_path=ckpt, weights_only=False)
    if stopper.stopped_by is not None and trainer.global_step < s.max_steps:
        log.warning(
            "SFT stopped by %s after step %d of %d: %s",
            signal.Signals(stopper.stopped_by).name,
            trainer.global_step,
            s.max_steps,
            f"saved {save_to}; the same command resumes from it"
            if stopper.saved_step is not None
            else "nothing saved; the next run trains it again",
        )
        raise Preempted(stopper.stopped_by)
    if out_dir is not None:
        _save_atomically(model, tokenizer, out_dir)
        save_to.unlink(missing_ok=True)
    metrics = {k: float(v) for k, v in trainer.logged_metrics.items()}
    return metrics, {"trainer": trainer, "module": module}


def fit_sft(
    cfg: DictConfig, model_path: Path, out_dir: Path | None
) -> tuple[dict[str, float], dict[str, Any]]:
    """Run SFT from ``model_path``; save the result to ``out_dir`` (atomically) when given."""
    from src.models.loading import load_causal_lm, load_tokenizer
    from src.rollout.factory import make_families

    s = cfg.sft
    tokenizer = load_tokenizer(model_path)
    model = load_causal_lm(model_path, cfg.model.dtype)
    pairs = sft_examples(
        _records(cfg, tokenizer),
        s.route_augment,
        make_families(cfg),
        cfg.router.get("prompt_mode", "emphasis"),
        s.misrouted_tool,
    )
    encoded = [e for e in (_encode(tokenizer, m, t, s.max_length) for m, t in pairs) if e is not None]
    if len(encoded) < len(pairs):
        log.warning(
            "SFT: dropped %d of %d examples longer than sft.max_length=%d",
            len(pairs) - len(encoded),
            len(pairs),
            s.max_length,
        )
    return train_on_examples(cfg, model, tokenizer, encoded, out_dir)


def run_sft(cfg: DictConfig):
    """``experiment=sft``: fine-tune the configured model and save it under the run dir."""
    from src.jobs.build import dataclass_from
    from src.models.loading import resolve_model_path
    from src.models.tiny import TinyModelSpec

    base = resolve_model_path(cfg.model.path, cfg.cache_dir, dataclass_from(TinyModelSpec, cfg.model.tiny))
    return fit_sft(cfg, base, Path(cfg.run_dir) / "model")


def _warm_start_dir(cfg: DictConfig, kind: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cfg.cache_dir) / "warm_start" / f"{kind}-{digest}"


def _cached(out: Path) -> bool:
    """A complete cached warm start at ``out`` (a broken one is removed, to be rebuilt)."""
    from src.atomic_files import discard_if_broken, hf_model_dir_intact

    return discard_if_broken(out, hf_model_dir_intact)


def sft_seed(cfg: DictConfig) -> int:
    """The seed of the SFT's data order: ``sft.seed``, or the run's ``seed`` when that is null.

    A run manifest saved before ``sft.seed`` existed has no such key; its SFT used the run's seed,
    so the key's absence reads as null (``replay_router --inputs-from warm_start`` on such a run)."""
    seed = cfg.sft.get("seed")
    return int(cfg.seed if seed is None else seed)


def _sft_key(cfg: DictConfig) -> dict[str, Any]:
    """``cfg.sft`` for a cache key, less ``seed`` (the key holds the effective seed, so ``sft.seed=0``
    and a null one in a ``seed=0`` run find the same warm start), and less ``misrouted_tool`` at its
    default ``first`` (the targets every warm start had before the key existed, so those cached
    warm starts stay valid)."""
    sft = OmegaConf.to_container(cfg.sft, resolve=True)
    sft.pop("seed", None)
    if sft.get("misrouted_tool") == "first":
        del sft["misrouted_tool"]
    return sft


def sft_warm_start_dir(cfg: DictConfig, base: Path) -> Path:
    """Where the SFT warm start of ``base`` for this data, SFT config and seed is cached."""
    return _warm_start_dir(
        cfg,
        "sft",
        {
            "base": str(base),
            "sft": _sft_key(cfg),
            "data": OmegaConf.to_container(cfg.data, resolve=True),
            "seed": sft_seed(cfg),
            "order": ORDER_VERSION,
        },
    )


def ensure_sft_warm_start(cfg: DictConfig, base: Path) -> Path:
    """The cached SFT warm start of ``base`` for this data and SFT config (built on first use)."""
    out = sft_warm_start_dir(cfg, base)
    if _cached(out):
        return out
    log.info("building the SFT warm start at %s (cached for later runs)", out)
    fit_sft(cfg, base, out)
    return out


# ---------------------------------------------------------------------------- RLVCR step-format warm start
def episode_sft_examples(cfg: DictConfig, tokenizer) -> list[dict[str, list[int]]]:
    """``sft.episodes`` scripted episodes of ``cfg.env`` in the RLVCR step format as SFT examples:
    the whole episode's ids, labels on the step tokens only (see ``src.rollout.episodes.scripted_agent``)."""
    from src.rollout.episodes.loop import EpisodeSettings
    from src.rollout.episodes.scripted_agent import level_counts, scripted_episodes
    from src.rollout.factory import env_factory, episode_templates

    s = cfg.sft
    env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    episodes = scripted_episodes(
        env_factory(env_cfg),
        tokenizer,
        episode_templates(env_cfg),
        int(s.episodes),
        sft_seed(cfg),
        EpisodeSettings(
            token_budget=int(env_cfg["token_budget"]),
            turn_cap=int(env_cfg["turn_cap"]),
            env_workers=int(s.get("episode_workers", 2)),
        ),
    )
    examples = [dict(zip(("input_ids", "labels"), e.sft_example())) for e in episodes]
    kept = [e for e in examples if len(e["input_ids"]) <= s.max_length]
    if len(kept) < len(examples):
        log.warning(
            "episode SFT: dropped %d of %d episodes longer than sft.max_length=%d",
            len(examples) - len(kept),
            len(examples),
            s.max_length,
        )
    log.info("episode SFT: %d episodes, step levels %s", len(kept), level_counts(episodes))
    return kept


def fit_episode_sft(
    cfg: DictConfig, model_path: Path, out_dir: Path | None
) -> tuple[dict[str, float], dict[str, Any]]:
    """SFT from ``model_path`` on scripted step-format episodes; save to ``out_dir`` when given."""
    from src.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(model_path)
    model = load_causal_lm(model_path, cfg.model.dtype)
    return train_on_examples(cfg, model, tokenizer, episode_sft_examples(cfg, tokenizer), out_dir)


def ensure_episode_warm_start(cfg: DictConfig, base: Path) -> Path:
    """The cached RLVCR step-format warm start of ``base`` (built on first use).

    Keyed by the base model, ``cfg.sft``, ``cfg.env``, the seed and the text of the scripted agent and
    the episode templates, so editing what the demonstrations look like rebuilds it.
    """
    from src.rollout.episodes import scripted_agent
    from src.rollout.factory import episode_templates

    env_cfg = OmegaConf.to_container(cfg.env, resolve=True)
    agent_src = Path(scripted_agent.__file__).read_text()
    out = _warm_start_dir(
        cfg,
        "rlvcr_sft",
        {
            "base": str(base),
            "sft": _sft_key(cfg),
            "env": env_cfg,
            "templates": dataclasses.asdict(episode_templates(env_cfg)),
            "seed": sft_seed(cfg),
            "order": ORDER_VERSION,
            "agent": hashlib.sha1(agent_src.encode()).hexdigest(),
        },
    )
    if _cached(out):
        return out
    log.info("building the RLVCR step-format warm start at %s (cached for later runs)", out)
    fit_episode_sft(cfg, base, out)
    return out
