"""Curriculum + ``rollout=vllm`` with a real vLLM (colocated, CPU): one engine serves the lessons'
evaluations and the training rollouts, and its weights follow training.

A 2-step curriculum job runs in process (tiny model, lessons evaluated before every step). The real
engine of ``rollout.engines.vllm`` is wrapped only to watch it: every build, every weight push, and
at every greedy (evaluation) call the HF greedy output of the LIVE actor on the same prompts. vLLM
holds its own copy of the weights, so its greedy output equals the live actor's only if the
pipeline pushed the trained weights before the evaluation.

Runs in the vLLM venv (``make test-vllm``); skipped where vLLM is not importable. One engine start."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf, open_dict

pytest.importorskip("vllm", reason="vLLM not importable: run in the vLLM venv (make test-vllm)")
pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("one_torch_thread")]

BUILT: list[WatchedEngine] = []


class WatchedEngine:
    """The real vLLM engine, unchanged; records builds, pushes and greedy calls against HF."""

    needs_weight_sync = True

    def __init__(self, engine, live_actor, tokenizer):
        self.engine, self.live, self.tokenizer = engine, live_actor, tokenizer
        self.initial = copy.deepcopy(live_actor)  # the weights before training
        self.pushes = 0
        # (vLLM greedy, HF greedy of the live actor, HF greedy of the initial actor)
        self.evals: list[tuple[list[list[int]], ...]] = []

    def __getattr__(self, name):  # sleep / wake / settings: the real engine's
        return getattr(self.engine, name)

    def update_weights(self, state_dict=None) -> None:
        self.pushes += 1
        self.engine.update_weights(state_dict)

    def generate(self, prompt_ids, sampling, row_keys=None):
        out = self.engine.generate(prompt_ids, sampling, row_keys)
        if sampling.temperature == 0.0:  # a lesson's evaluation
            from src.rollout.factory import build_hf_engine

            live, initial = (
                build_hf_engine(m, self.tokenizer).generate(prompt_ids, sampling).token_lists()
                for m in (self.live, self.initial)
            )
            self.evals.append((out.token_lists(), live, initial))
        return out


def watched_vllm_engine(*, actor, tokenizer, model_path, micro_batch_size, **settings):
    from src.rollout.factory import build_vllm_engine

    real = build_vllm_engine(actor, tokenizer, model_path, micro_batch_size=micro_batch_size, **settings)
    BUILT.append(WatchedEngine(real, actor, tokenizer))
    return BUILT[-1]


def test_curriculum_evaluations_use_the_one_vllm_engine_with_the_trained_weights(cache_dir, tmp_path):
    from src.config.job import compose_job
    from src.jobs.train import train

    cfg = compose_job(
        [
            "experiment=curriculum",
            "rollout=vllm",
            "rollout.engines.vllm.max_model_len=1024",
            "rollout.engines.vllm.kv_cache_memory_gib=0.25",
            "rollout.engines.vllm.enforce_eager=true",
            f"cache_dir={cache_dir}",
            f"run_dir={tmp_path / 'run'}",
            "model.warm_start=null",
            "trainer.max_steps=2",
            "trainer.save_freq=100",
            "sampling.n_prompts=2",
            "sampling.n_generations_per_prompt=2",
            "sampling.max_new_tokens=8",
            "curriculum.eval_frequency=1",
            "curriculum.eval_prompts=2",
            "curriculum.lessons.hard.sampling.max_new_tokens=8",
            # a large step, so that the live actor's greedy output moves (else a stale engine passes)
            "algorithm.optim.lr=3e-2",
            "algorithm.entropy_coeff=0.1",  # a gradient whatever the rewards (tiny groups often tie)
        ]
    )
    with open_dict(cfg):  # the vllm node itself, only its builder wrapped
        node = OmegaConf.to_container(cfg.rollout.engines.vllm)
        cfg.rollout.engines.watched = {**node, "_target_": f"{__name__}.watched_vllm_engine"}
        cfg.rollout.engine = "watched"
    BUILT.clear()
    train(cfg)

    assert len(BUILT) == 1, "curriculum evaluations and training rollouts must share one vLLM engine"
    engine = BUILT[0]
    assert engine.pushes == 3  # at fit start and after each of the 2 optimizer steps
    # lessons evaluated before step 0 and before step 1 (after the first optimizer step's push)
    assert len(engine.evals) >= 2
    # precondition: training moved some evaluation's greedy output (else a stale engine passes)
    assert any(live != initial for _, live, initial in engine.evals)
    for vllm_tokens, live_tokens, _ in engine.evals:
        assert vllm_tokens == live_tokens, "an evaluation sampled from weights other than the trained ones"
