"""Shared fixtures: the repo root, the real data directory (skip when absent), the cached tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CACHE = REPO / ".cache" / "toolrouter"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "rlla_4k" / "test.parquet").exists():
        pytest.skip("real data (../shared/data) not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return CACHE


@pytest.fixture(scope="session")
def tiny_model_dir(cache_dir) -> Path:
    from src.models.tiny import ensure_tiny_model

    return ensure_tiny_model(cache_dir)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    """(model, tokenizer) of the embedded default, fp32."""
    from src.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
