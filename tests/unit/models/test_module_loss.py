"""The module's loss path on the real tiny model: micro-batching is exact, log-probs are taken at
the sampling temperature, and no pass runs whose result is already known."""

import copy

import pytest
import torch

from src.config.sampling import SamplingParams
from src.config.schema import AlgorithmGroupConfig, RouterHeadConfig
from src.models.module import ToolRouterModule
from src.rollout.batch import PromptBatch, RolloutBatch, assemble_sequences
from src.rollout.engines.hf import HFGenerateEngine

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_module(tiny, **algo) -> ToolRouterModule:
    model = copy.deepcopy(tiny[0]).eval()  # eval: no dropout, so two passes are comparable
    cfg = AlgorithmGroupConfig(use_kl_loss=False, **algo)
    module = ToolRouterModule(model, cfg, RouterHeadConfig())
    module.manual_backward = lambda loss: loss.backward()  # no Trainer here: plain autograd
    return module


def prompts(tok) -> list[list[int]]:
    texts = ["call the weather tool for Oslo", "hi", "convert 5 km to miles please", "what is 2+2"]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def random_rollout(tiny, seed: int = 0) -> RolloutBatch:
    """8 rows (4 prompts x 2), random responses with uneven lengths and two empty rows."""
    _, tok = tiny
    g = torch.Generator().manual_seed(seed)
    n, width = 8, 6
    responses = torch.randint(5, 200, (n, width), generator=g)
    lengths = torch.tensor([6, 0, 3, 5, 1, 0, 4, 6])
    response_mask = (torch.arange(width)[None] < lengths[:, None]).long()
    rows = [p for p in prompts(tok) for _ in range(2)]
    ids, attn = assemble_sequences(rows, responses, response_mask, tok.pad_token_id)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=response_mask.float(),
        rewards=torch.randn(n, generator=g),
        uids=[i // 2 for i in range(n)],
        # behaviour log-probs away from the current policy's, so the clip engages
        rollout_log_probs=-3 + torch.randn(n, width, generator=g),
    )


def minibatch_gradient(module: ToolRouterModule, rb: RolloutBatch, micro: int) -> list[torch.Tensor]:
    module.algo.micro_batch_size = micro
    module.actor.zero_grad()
    inputs = module._loss_inputs(rb, n_minibatches=2)
    module._minibatch_backward(rb, torch.arange(len(rb)), inputs, None)
    return [p.grad.clone() for p in module.actor.parameters() if p.grad is not None]


@pytest.mark.parametrize("mode", MODES)
def test_micro_batched_gradient_equals_one_batch_gradient(tiny, mode):
    module = make_module(tiny, loss_agg_mode=mode, old_log_prob_source="rollout", entropy_coeff=0.01)
    rb = random_rollout(tiny)
    whole = minibatch_gradient(module, rb, micro=8)
    for micro in (3, 1):  # uneven micro-batches; some hold only empty rows
        parts = minibatch_gradient(module, rb, micro=micro)
        assert len(parts) == len(whole) > 0
        for a, b in zip(parts, whole):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert max(float(g.abs().max()) for g in whole) > 0


def sampled_rollout(tiny, module: ToolRouterModule, temperature: float, per_row: bool) -> RolloutBatch:
    _, tok = tiny
    engine = HFGenerateEngine(module.actor, tok.pad_token_id, [tok.eos_token_id])
    torch.manual_seed(0)
    ps = prompts(tok)
    out = engine.generate(
        ps, SamplingParams(n_generations_per_prompt=2, temperature=temperature, top_p=1.0, max_new_tokens=8)
    )
    rows = [p for p in ps for _ in range(2)]
    ids, attn = assemble_sequences(rows, out.response_ids, out.response_mask, tok.pad_token_id)
    n = len(rows)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=out.response_mask.float(),
        rewards=torch.arange(n, dtype=torch.float32),
        uids=[i // 2 for i in range(n)],
        rollout_log_probs=out.log_probs,
        temperatures=torch.full((n,), temperature) if per_row else None,
    )


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_log_probs_at_the_sampling_temperature(tiny, temperature, per_row):
    # per_row=False: the default (sampling.temperature) applies; True: RolloutBatch.temperatures,
    # with a deliberately wrong default to show the per-row value wins
    default = 1.0 / temperature if per_row and temperature != 1.0 else temperature
    module = make_module(tiny, temperature=default, ppo_epochs=2, ppo_mini_batch_size=4)
    rb = sampled_rollout(tiny, module, temperature, per_row)
    mask = rb.response_mask.bool()
    chunks = module._minibatches(len(rb))
    inputs = module._loss_inputs(rb, len(chunks))
    width = rb.response_mask.shape[1]
    # new log-probs at T match the engine's sampling log-probs (top_p = 1)
    new, _ = module._token_stats(module.actor, rb.input_ids, rb.attention_mask, width, inputs.temperatures)
    assert (new - rb.rollout_log_probs)[mask].abs().max() < 1e-4
    # first PPO epoch, before any optimizer step: the ratio is 1
    first = chunks[0]
    first_mask = inputs.mask[first]
    _, parts = module._micro_loss(
        rb, first, inputs, module.loss_module.normaliser(first_mask), first_mask.sum()
    )
    assert parts["train/ratio_mean"].item() == pytest.approx(1.0, abs=1e-6)
    ratio = torch.exp(new[first] - inputs.old_log_probs[first])[mask[first]]
    assert (ratio - 1).abs().max() < 1e-5
    if temperature != 1.0:  # scoring at T = 1 would not be: the test can see the defect
        at_one, _ = module._token_stats(module.actor, rb.input_ids, rb.attention_mask, width, None)
        assert (at_one - rb.rollout_log_probs)[mask].abs().max() > 1e-2


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_one_epoch_one_minibatch_ratio_is_exactly_one_without_an_old_pass(tiny, temperature):
    module = make_module(tiny, temperature=temperature)
    rb = sampled_rollout(tiny, module, temperature, per_row=False)
    chunks = module._minibatches(len(rb))
    assert len(chunks) == 1
    inputs = module._loss_inputs(rb, len(chunks))
    assert inputs.old_log_probs is None
    mask = inputs.mask
    _, parts = module._micro_loss(rb, chunks[0], inputs, module.loss_module.normaliser(mask), mask.sum())
    assert parts["train/ratio_mean"].item() == 1.0
    assert parts["train/pg_clipfrac"].item() == 0.0


def count_forwards(module: ToolRouterModule) -> list[int]:
    calls = [0]
    module.actor.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize(
    ("algo", "n_minibatches", "passes"),
    [
        ({}, 1, 0),  # one epoch, one minibatch: old = detached new, KL off: nothing before training
        ({"old_log_prob_source": "rollout"}, 4, 0),  # several minibatches, the engine's log-probs
        ({"micro_batch_size": 3}, 4, 3),  # several minibatches: one exact no-grad pass (8 rows / 3)
    ],
)
def test_no_pass_runs_whose_result_is_known(tiny, algo, n_minibatches, passes):
    module = make_module(tiny, **algo)
    rb = random_rollout(tiny)
    calls = count_forwards(module)
    inputs = module._loss_inputs(rb, n_minibatches)
    assert calls[0] == passes
    assert inputs.ref_log_probs is None  # KL off: no reference pass either


def test_batches_are_prompt_batches_and_a_module_without_pipeline_cannot_step(tiny):
    module = make_module(tiny)
    records = [{"uid": "a"}, {"uid": "b"}]
    batch = module.on_after_batch_transfer(records, 0)
    assert isinstance(batch, PromptBatch) and batch.records == records
    assert module.on_after_batch_transfer(batch, 0) is batch
    with pytest.raises(RuntimeError, match="no rollout pipeline"):
        module.validation_step(batch, 0)
    with pytest.raises(RuntimeError, match="no rollout pipeline"):
        module.pipeline_rollout(batch)


def test_the_engine_generates_outside_the_trainers_autocast(tiny):
    """A bf16-mixed trainer runs training_step and validation_step under autocast; the rollout and
    the validation rollouts run in the model's own dtype (a captured decode graph must not hold
    autocast's casts)."""
    module, seen = make_module(tiny), []

    class Pipeline:
        def rollout(self, *args):
            seen.append(torch.is_autocast_enabled("cpu"))
            return "rollouts", {}

    module.pipeline = Pipeline()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert module.pipeline_rollout(PromptBatch([{"uid": "a"}])) == ("rollouts", {})
        assert torch.is_autocast_enabled("cpu")
    assert seen == [False]


def test_non_finite_metrics_are_logged_and_named_in_a_warning(tiny, caplog):
    """No metric is filtered out: NaN / inf reach the logger, with a warning naming them and the step."""
    import logging
    import math

    module = make_module(tiny)
    optimizer = torch.optim.AdamW(module.actor.parameters(), lr=1e-5)
    module._optimizers = lambda: (optimizer, None)  # no Trainer here
    logged: list[dict] = []
    module.log_dict = lambda metrics, **kw: logged.append(dict(metrics)) if kw.get("logger") else None
    rb = random_rollout(tiny)
    rb.metrics = {"rollout/odd": math.inf}
    with caplog.at_level(logging.WARNING, logger="src.models.module"):
        module._log_step(rb, {"train/pg_loss": math.nan, "train/entropy": 1.0}, 0.1, {})
    (metrics,) = logged
    assert math.isnan(metrics["train/pg_loss"]) and metrics["rollout/odd"] == math.inf
    assert metrics["train/entropy"] == 1.0 and "train/response_mask_frac" in metrics
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "train/pg_loss is nan at step 0" in warned and "rollout/odd is inf at step 0" in warned
    assert "train/entropy" not in warned


@pytest.mark.parametrize("layer", [0, -1])
def test_router_reads_the_configured_hidden_layer(tiny, layer):
    """``router.hidden_layer`` 0 pools the input embeddings, -1 the last layer's (normed) states."""
    model, tok = copy.deepcopy(tiny[0]).eval(), tiny[1]
    cfg = RouterHeadConfig(enable=True, pooling="tail", tail_tokens=4, hidden_layer=layer)
    algo = AlgorithmGroupConfig(use_kl_loss=False)
    module = ToolRouterModule(model, algo, cfg)
    rows = prompts(tok)
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = (ids != tok.pad_token_id).long()
    for i, r in enumerate(rows):  # left padding, even where a prompt holds the pad id
        mask[i] = (torch.arange(width) >= width - len(r)).long()
    with torch.no_grad():
        got = module.router_logits(ids, mask)
        if layer == 0:
            hidden = model.get_input_embeddings()(ids)
        else:
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            hidden = model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
            hidden = hidden.hidden_states[-1]
        want = module.router_head(hidden, mask)
    torch.testing.assert_close(got, want)
    other = 0 if layer == -1 else -1
    module.router_cfg.hidden_layer = other
    with torch.no_grad():
        assert not torch.allclose(module.router_logits(ids, mask), got)  # the layer matters


def test_layer_0_is_read_from_the_table_bit_for_bit_where_the_forward_returns_it(tiny):
    """The router's layer 0 without the actor's layers: the table's rows equal ``hidden_states[0]``
    of the forward exactly, gradient included; a model type that may scale them (Gemma) runs the
    forward (sharded weights too: tests/e2e/jobs/test_strategies_job.py compares FSDP2 and ZeRO-3,
    which run it, with DDP, which reads the table)."""
    from src.models.loading import input_embedding_rows

    model, tok = copy.deepcopy(tiny[0]).train(), tiny[1]
    rows = prompts(tok)
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.stack([(torch.arange(width) >= width - len(r)).long() for r in rows])
    table = model.get_input_embeddings().weight
    got = input_embedding_rows(model, ids)
    (grad_got,) = torch.autograd.grad(got.sin().sum(), table)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    want = model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True).hidden_states[0]
    (grad_want,) = torch.autograd.grad(want.sin().sum(), table)
    assert torch.equal(got, want) and torch.equal(grad_got, grad_want)
    model.config.model_type = "gemma"
    assert input_embedding_rows(model, ids) is None


def test_router_on_base_embeddings_reads_the_frozen_table_not_the_actor(tiny):
    """``router.input=base_embeddings``: the head pools its own frozen copy of the base model's
    input embeddings, so the actor's embeddings (moved by a warm start or by RL) do not change the
    router's logits, while a different table does; the table is a checkpointed buffer, no parameter."""
    model, tok = copy.deepcopy(tiny[0]).eval(), tiny[1]
    base = model.get_input_embeddings().weight.detach().clone()
    cfg = RouterHeadConfig(
        enable=True, pooling="tail", tail_tokens=4, hidden_layer=0, input="base_embeddings"
    )
    module = ToolRouterModule(model, AlgorithmGroupConfig(use_kl_loss=False), cfg)
    head = module.router_head
    assert "base_embedding" in head.state_dict()
    assert all(p is not head.base_embedding for p in head.parameters())
    head.set_base_embedding(base)
    rows = prompts(tok)
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.stack([(torch.arange(width) >= width - len(r)).long() for r in rows])
    with torch.no_grad():
        got = module.router_logits(ids, mask)
        torch.testing.assert_close(got, head(base[ids], mask))  # the table's rows, as layer 0 reads them
        model.get_input_embeddings().weight.add_(torch.randn_like(base))  # the actor moves
        torch.testing.assert_close(module.router_logits(ids, mask), got)  # the router's input does not
        head.set_base_embedding(torch.randn_like(base))
        assert not torch.allclose(module.router_logits(ids, mask), got)  # the table is what it reads
    with pytest.raises(ValueError, match="shape"):
        head.set_base_embedding(base[:, :-1])
