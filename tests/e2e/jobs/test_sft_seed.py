"""``sft.seed``: the SFT's data-order seed apart from the run's, so runs can share one warm start."""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from src.config.job import compose_job
from src.jobs.sft import sft_seed, sft_warm_start_dir


def _dir(*overrides: str, cache: Path) -> Path:
    cfg = compose_job(["experiment=router_grpo", f"cache_dir={cache}", *overrides])
    return sft_warm_start_dir(cfg, Path("/models/base"))


def test_a_fixed_sft_seed_shares_the_warm_start_between_run_seeds(tmp_path):
    own = {n: _dir(f"seed={n}", cache=tmp_path) for n in (0, 1, 2)}
    assert len(set(own.values())) == 3  # null: each run seed fits its own
    pinned = {n: _dir(f"seed={n}", "sft.seed=0", cache=tmp_path) for n in (0, 1, 2)}
    assert set(pinned.values()) == {own[0]}  # the same fit as a seed-0 run's, so the same cache entry
    assert _dir("seed=0", "sft.seed=1", cache=tmp_path) == own[1]
    cfg = compose_job(["experiment=router_grpo", "seed=3"])
    assert sft_seed(cfg) == 3 and sft_seed(OmegaConf.merge(cfg, {"sft": {"seed": 0}})) == 0


def test_a_manifest_from_before_sft_seed_finds_its_warm_start(tmp_path):
    """A run's saved config without ``sft.seed`` (manifests written before it existed) used the run's
    seed: the same cache entry as today's null."""
    cfg = compose_job(["experiment=router_grpo", "seed=2", f"cache_dir={tmp_path}"])
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["sft"]["seed"]
    old = OmegaConf.create(old)
    assert sft_seed(old) == 2
    assert sft_warm_start_dir(old, Path("/models/base")) == sft_warm_start_dir(cfg, Path("/models/base"))


def _fit(tiny_model_dir, tmp_path, run_seed: int, seed: int | None) -> dict[str, torch.Tensor]:
    from src.jobs.sft import train_on_examples
    from src.models.loading import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)
    texts = ["hello there", "what is 2 + 2", "look up the weather", "a short poem", "convert 3 km"]
    examples = [{"input_ids": ids, "labels": ids} for ids in (tok(t)["input_ids"] for t in texts * 2)]
    cfg = compose_job(
        ["experiment=sft", f"seed={run_seed}", f"run_dir={tmp_path / f'r{run_seed}-{seed}'}",
         "sft.max_steps=3", "sft.batch_size=2", "sft.lr=1e-2", "sft.log_every=10",
         f"sft.seed={'null' if seed is None else seed}"]
    )  # fmt: skip
    torch.manual_seed(0)
    train_on_examples(cfg, model, tok, examples, None)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_data_order_follows_the_sft_seed(tiny_model_dir, tmp_path):
    """A run seed 1 with ``sft.seed=0`` fits exactly what a run seed 0 fits; its own seed differs."""
    base = _fit(tiny_model_dir, tmp_path, 0, None)
    pinned = _fit(tiny_model_dir, tmp_path, 1, 0)
    own = _fit(tiny_model_dir, tmp_path, 1, None)
    assert all(torch.equal(base[k], pinned[k]) for k in base)
    assert not all(torch.equal(base[k], own[k]) for k in base)
