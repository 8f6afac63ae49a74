"""The rollout pipeline owns one engine and one weight-sync point, curriculum included.

A real curriculum job (in process, tiny model, 3 steps, lessons evaluated every step) runs with a
recording engine: a real ``HFGenerateEngine`` that samples from its OWN copy of the actor, as vLLM
does, so it is only right if the pipeline pushes the weights. It records every build, every
``update_weights`` and, at every ``generate``, whether its weights equal the live actor's.
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from src.config.job import compose_job
from src.rollout.engines.hf import HFGenerateEngine
from src.rollout.factory import build_hf_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BUILT: list[RecordingEngine] = []


def fingerprint(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


class RecordingEngine(HFGenerateEngine):
    """HF generate on a private copy of the actor; weights arrive only through ``update_weights``."""

    needs_weight_sync = True

    def __init__(self, live_actor, base: HFGenerateEngine):
        super().__init__(
            copy.deepcopy(live_actor), base.pad_token_id, base.eos_token_ids, settings=base.settings
        )
        self.live = live_actor
        self.updates: list[float] = []
        self.calls: list[tuple[float, bool]] = []  # (temperature, own weights == live weights)

    def update_weights(self, state_dict=None) -> None:
        self.model.load_state_dict(state_dict)
        self.updates.append(fingerprint(self.model))

    def generate(self, prompt_ids, sampling, row_keys=None):
        same = all(torch.equal(a, b) for a, b in zip(self.model.parameters(), self.live.parameters()))
        self.calls.append((sampling.temperature, same))
        return super().generate(prompt_ids, sampling, row_keys)


def recording_engine(*, actor, tokenizer, model_path, micro_batch_size, **settings):
    del model_path
    base = build_hf_engine(actor, tokenizer, micro_batch_size=micro_batch_size, **settings)
    engine = RecordingEngine(actor, base)
    BUILT.append(engine)
    return engine


def test_curriculum_and_training_share_one_engine_synced_after_every_step(cache_dir, tmp_path):
    from src.jobs.train import train

    cfg = compose_job(
        [
            "experiment=curriculum",
            f"cache_dir={cache_dir}",
            f"run_dir={tmp_path / 'run'}",
            "model.warm_start=null",
            "trainer.max_steps=3",
            "trainer.save_freq=100",
            "sampling.n_prompts=2",
            "sampling.n_generations_per_prompt=2",
            "sampling.max_new_tokens=8",
            "curriculum.eval_frequency=1",
            "curriculum.eval_prompts=2",
            "curriculum.lessons.hard.sampling.max_new_tokens=8",
            "algorithm.optim.lr=1e-3",
            "algorithm.optim.weight_decay=0.5",  # moves the weights even when every reward ties
        ]
    )
    with open_dict(cfg):
        cfg.rollout.engines.recording = OmegaConf.create({"_target_": f"{__name__}.recording_engine"})
        cfg.rollout.engine = "recording"
    BUILT.clear()
    _, parts = train(cfg)

    assert len(BUILT) == 1, "curriculum and training rollouts must share one engine"
    engine = BUILT[0]
    # fit start (a resume lands here too) and after each of the 3 optimizer steps
    assert len(engine.updates) == 4
    assert len(set(engine.updates)) == 4, "training moved the weights, and every sync carried them"
    assert engine.updates[-1] == pytest.approx(fingerprint(parts["module"].actor))
    evals = [same for temp, same in engine.calls if temp == 0.0]
    train_calls = [same for temp, same in engine.calls if temp > 0.0]
    assert len(evals) >= 3 and len(train_calls) == 3  # lessons evaluated at steps 0, 1, 2
    assert all(evals) and all(train_calls), "every generate saw the live actor's weights"


class _Recorder:
    """A collector answering with a fixed batch; it records the requests it got."""

    def __init__(self, engine, batch):
        self.engine, self.batch, self.requests = engine, batch, []

    def collect(self, request):
        self.requests.append(request)
        return self.batch


class _SharedActorEngine(HFGenerateEngine):
    """The HF engine samples from the trainer's own actor: the pipeline must not push weights to it."""

    def __init__(self):
        super().__init__(torch.nn.Linear(1, 1), 0, [1])
        self.pushed = 0

    def update_weights(self, state_dict=None) -> None:
        self.pushed += 1


class _Pool:
    def __init__(self):
        self.pushes: list[int] = []

    def push_weights(self, state_dict, version):
        self.pushes.append(version)


def _batch():
    from src.rollout.batch import RolloutBatch

    ids = torch.ones(2, 3, dtype=torch.long)
    return RolloutBatch(ids, ids, ids[:, 1:], torch.zeros(2), [0, 0], torch.zeros(2, 2))


def test_pipeline_seeds_each_step_and_leaves_a_shared_actor_engine_alone():
    from types import SimpleNamespace

    from src.rollout.pipeline import DataSource, NoBuffer, RolloutPipeline, step_seed

    engine = _SharedActorEngine()
    collector = _Recorder(engine, _batch())
    pipeline = RolloutPipeline(lambda module: collector, DataSource(), NoBuffer(), None, seed=3)
    module = SimpleNamespace(actor=torch.nn.Linear(2, 2))
    pipeline.start(module, step=0)
    batch, scalars = pipeline.rollout([{"uid": 0}], step=5, lam=0.25)
    pipeline.sync_weights(module, step=6)
    assert batch is collector.batch and scalars == {}
    request = collector.requests[0]
    assert (request.records, request.step, request.lam, request.sampling) == ([{"uid": 0}], 5, 0.25, None)
    assert request.generator.initial_seed() == step_seed(3, 5)
    assert engine.pushed == 0  # needs_weight_sync is False: it already samples from the actor
    with pytest.raises(ValueError, match="eval sampling"):
        pipeline.evaluate([{"uid": 0}], step=5, lam=0.0)


def test_worker_replay_pushes_at_start_and_every_k_steps():
    from types import SimpleNamespace

    from src.replay.buffer import ReplayBuffer, WorkerReplay

    pool = _Pool()
    replay = WorkerReplay(ReplayBuffer(8, 1.0, 2, 2, pad_id=0), 1, lambda: pool, sync_every=3)
    module = SimpleNamespace(state_dict=dict)
    replay.start(module, step=4)  # a resume at step 4: the workers need the restored weights
    for step in range(4, 10):
        replay.sync(module, step)
    assert pool.pushes == [4, 6, 9]


def test_pipeline_state_round_trips_and_refuses_another_kind_of_source_or_buffer():
    """A checkpoint's curriculum or replay state resumed into a run without them is an error naming
    the part, not a silent restart from scratch; the same kind loads."""
    from src.rollout.pipeline import DataSource, NoBuffer, RolloutPipeline

    class _Lessons(DataSource):
        def __init__(self):
            self.evaluated_at = 0

        def state_dict(self):
            return {"status": {}, "evaluated_at": self.evaluated_at}

        def load_state_dict(self, state):
            self.evaluated_at = state["evaluated_at"]

    saved = RolloutPipeline(None, _Lessons(), NoBuffer(), None)
    saved.source.evaluated_at = 4
    resumed = RolloutPipeline(None, _Lessons(), NoBuffer(), None)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.source.evaluated_at == 4
    with pytest.raises(ValueError, match="rollout source state .*DataSource"):
        RolloutPipeline(None, DataSource(), NoBuffer(), None).load_state_dict(saved.state_dict())
