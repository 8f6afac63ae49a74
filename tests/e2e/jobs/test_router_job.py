"""experiment=router_grpo plumbing: the router scalars, λ in the checkpoint, exact restore on resume."""

import pytest
import torch
from jobhelpers import scalars

ROUTER_TAGS = [
    "train/lambda",
    "train/cost_mean",
    "train/reward_router_mean",
    "train/route_frac_answer",
    "train/route_frac_search",
    "train/route_frac_calculate",
    "train/tool_call_rate",
    "train/router_entropy",
]


def test_router_scalars_are_logged(router_run):
    run_dir = router_run
    series = scalars(run_dir)
    for tag in ROUTER_TAGS:
        assert tag in series, f"{tag} missing"
    fracs = [series[f"train/route_frac_{r}"][0][1] for r in ("answer", "search", "calculate")]
    assert sum(fracs) == pytest.approx(1.0, abs=1e-6)


def test_checkpoint_holds_lambda_and_resume_restores_it_exactly(router_run_with_resume):
    run_dir, first = router_run_with_resume
    lam = first["state_dict"]["lagrange.lam"]
    assert first["global_step"] == 4
    # λ's window (cost sum, reward sum, count, steps) is module state, checkpointed with λ
    assert float(first["state_dict"]["lagrange.window"][3]) == 4
    assert float(lam) >= 0.0
    series = scalars(run_dir)["train/lambda"]
    # lambda is logged with the step it was used in; the first resumed step used the checkpoint's
    first_resumed = [v for s, v in series if s == min(s for s, _ in series if s >= 4)]
    assert first_resumed and first_resumed[-1] == float(lam)
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 6
    assert float(last["state_dict"]["lagrange.window"][3]) == 6


def test_route_confusion_text_is_written_every_val_check_interval(router_run):
    """``train/route_confusion`` (README "The router demo") in the run's TensorBoard event files:
    after steps 2 and 4 of the first run and 6 of the resumed one (val_check_interval 2), each at
    the logger step of the last step it covers (1, 3, 5), where that step's scalars are."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps, texts = [], []
    for events in sorted((router_run / "tensorboard").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"tensors": 0})
        acc.Reload()
        if "train/route_confusion/text_summary" in acc.Tags()["tensors"]:
            for event in acc.Tensors("train/route_confusion/text_summary"):
                steps.append(event.step)
                texts.append(event.tensor_proto.string_val[0].decode())
    assert sorted(steps) == [1, 3, 5]
    assert all("route_acc_answer" in t and "search" in t for t in texts)


def test_sif_pooling_is_fitted_on_the_training_prompts_and_kept_over_resume(router_run_with_resume):
    """router.pooling=sif (the demo's): before the first step the head's token weights are
    a / (a + p) of the training prompts' pooled windows, its component a unit vector, and (the word
    unit) which tokens those windows hold and which tokens begin a word; the resumed run keeps them
    all (the checkpoint's, not a refit)."""
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy
    from src.jobs.router_pooling import vocabulary_word_starts
    from src.router.head import sif_token_weights, token_counts

    run_dir, first = router_run_with_resume
    policy = load_router_policy(run_dir, device="cpu")
    cfg = policy.config.router
    assert cfg.pooling == "sif"
    records = read_rlla_parquet(data_files(policy.config)[0][0])[0]
    ids = [policy.prompt_ids(r.messages) for r in records]
    weight = first["state_dict"]["router_head.sif_weight"]
    counts = token_counts(ids, weight.numel(), int(cfg.tail_tokens))
    want = sif_token_weights(counts, float(cfg.sif_a), float(cfg.sif_unseen_weight))
    assert torch.allclose(weight, want.to(weight.dtype))
    assert cfg.sif_unseen_weight == 0.0  # the demo's: tokens absent from the training tails weigh 0
    assert bool((weight[counts == 0] == 0).all()) and bool((weight[counts > 0] > 0).all())
    assert float(weight.min()) < 0.5  # frequent tokens weigh less
    component = first["state_dict"]["router_head.sif_component"]
    assert float(component.norm()) == pytest.approx(1.0, abs=1e-5)
    # the demo's unit: a word with a piece absent from the training tails is unseen as a whole
    assert cfg.sif_unseen_unit == "word"
    assert torch.equal(first["state_dict"]["router_head.sif_seen"], counts > 0)
    starts = first["state_dict"]["router_head.sif_word_start"]
    assert torch.equal(starts, vocabulary_word_starts(policy.tokenizer, weight.numel()))
    space = policy.tokenizer.convert_tokens_to_ids(["Ġ"])[0]  # the bare space mark before new letters
    assert bool(starts[space]) and not bool(starts[policy.tokenizer.convert_tokens_to_ids(["ails"])[0]])
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    for name in ("sif_weight", "sif_component", "sif_seen", "sif_word_start"):
        key = f"router_head.{name}"
        assert torch.equal(last["state_dict"][key], first["state_dict"][key])


def test_router_on_base_embeddings_keeps_the_base_models_table(tmp_path):
    """router.input=base_embeddings: the run's head holds the base model's input embedding table (the
    model before the SFT warm start, the same for every seed), not the warm start's, in every
    checkpoint; the router still learns from the job's rewards."""
    from jobhelpers import ROUTER_RUN_OVERRIDES, run_train

    from src.jobs.inference import load_router_policy
    from src.jobs.router_pooling import base_input_embeddings
    from src.jobs.warm_start import base_model_dir

    run_dir = tmp_path / "run"
    overrides = [
        *ROUTER_RUN_OVERRIDES,
        f"run_dir={run_dir}",
        "router.input=base_embeddings",
        "router.hidden_layer=0",
    ]
    last_ckpt = run_dir / "checkpoints" / "last.ckpt"
    run_train(*overrides, "trainer.max_steps=2")
    first = torch.load(last_ckpt, map_location="cpu", weights_only=False)["state_dict"]
    run_train(*overrides, "trainer.max_steps=3", "resume=true")
    last = torch.load(last_ckpt, map_location="cpu", weights_only=False)["state_dict"]
    policy = load_router_policy(run_dir, device="cpu")
    base = base_input_embeddings(base_model_dir(policy.config))
    assert torch.equal(first["router_head.base_embedding"], base)
    assert torch.equal(last["router_head.base_embedding"], base)
    # the actor starts from the warm start, and the head trains
    assert not torch.equal(first["actor.model.embed_tokens.weight"], base)
    assert not torch.equal(first["router_head.mlp.1.weight"], last["router_head.mlp.1.weight"])


def test_router_head_average_is_checkpointed_and_routes_inference(router_run_with_resume):
    """router.ema_decay (the demo's 0.99): every checkpoint holds the head's Polyak average, one
    update per step, resumed with the run; it trails the live weights, and inference (infer.py,
    evaluate.py) routes with it, not with the live head."""
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy
    from src.rollout.engines.types import left_pad

    run_dir, first = router_run_with_resume
    assert int(first["state_dict"]["router_head.ema_updates"]) == 4
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    state = last["state_dict"]
    assert int(state["router_head.ema_updates"]) == 6
    assert not torch.equal(state["router_head.ema_1_weight"], state["router_head.mlp.1.weight"])

    policy = load_router_policy(run_dir, device="cpu")
    assert policy.config.router.ema_decay == 0.99
    batch = [r.messages for r in read_rlla_parquet(data_files(policy.config)[1][0])[0][:6]]
    ids, mask = left_pad([policy.prompt_ids(m) for m in batch], policy.tokenizer.pad_token_id)
    with torch.no_grad():
        averaged = torch.softmax(policy.module.router_logits(ids, mask, averaged=True), -1)
        live = torch.softmax(policy.module.router_logits(ids, mask), -1)
    torch.testing.assert_close(policy.route_probs(batch), averaged)
    assert not torch.allclose(averaged, live)


def test_validation_reads_the_router_alone_on_the_whole_held_out_split(router_run):
    """``trainer.limit_val_batches`` (4 batches of 8 prompts here) bounds the generated validation
    rollouts, not the router's own reading: ``val/routing_*`` are the metrics of every held-out
    prompt, as the per-prompt table in ``rollouts/val/`` recomputes them, and the last validation's
    table is what ``scripts/evaluate.py --routing`` reads off the final checkpoint."""
    import pandas as pd

    from src.analysis import held_out_routing
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy
    from src.jobs.routing_report import records_labels, records_probs
    from src.router.routing_eval import routing_metrics

    val = router_run / "rollouts" / "val"
    # val_check_interval 2: after steps 1 and 3 (the first run) and 5 (the resumed run), named by the
    # step they followed, which is the step TensorBoard logs them at
    steps = (1, 3, 5)
    assert sorted(p.name for p in val.iterdir()) == sorted(
        [f"rollouts_{s:08d}.parquet" for s in steps] + [f"routes_{s:08d}.parquet" for s in steps]
    )
    policy = load_router_policy(router_run, device="cpu")
    records = read_rlla_parquet(data_files(policy.config)[1][0])[0]
    routes = pd.read_parquet(val / "routes_00000005.parquet")
    assert len(records) == 256 and list(routes.uid) == [r.uid for r in records]
    assert list(routes.weak_label) == records_labels(policy, records)
    assert len(pd.read_parquet(val / "rollouts_00000005.parquet")) == 4 * 8  # generated: the limit

    probs = torch.tensor(routes[["p_answer", "p_search", "p_calculate"]].to_numpy())
    torch.testing.assert_close(records_probs(policy, records).double(), probs, atol=1e-6, rtol=0)
    assert list(routes.route) == [("answer", "search", "calculate")[int(i)] for i in probs.argmax(-1)]
    series = scalars(router_run)
    for mode, greedy in (("greedy", True), ("sampled", False)):
        expected = routing_metrics(probs, list(routes.weak_label), greedy)
        assert expected["tool_rate"] > 0
        by_step = held_out_routing(router_run, greedy)
        assert list(by_step.index) == list(steps)
        assert [step for step, _ in series[f"val/routing_{mode}/tool_rate"]] == list(steps)  # files = TB
        for name, value in expected.items():
            logged = series[f"val/routing_{mode}/{name}"][-1][1]  # the last validation's
            assert logged == pytest.approx(value, abs=1e-6), f"val/routing_{mode}/{name}"
            assert by_step.loc[steps[-1], name] == pytest.approx(value, abs=1e-12)

    # data.synthetic.n_calib: the p_route threshold is set on the calibration split, then routes the
    # held-out prompts (val/routing_budgeted/*, the table's route_budgeted column)
    from src.datamodules.prepare import calibration_files
    from src.router.routing_eval import budget_routes, calibrate_tool_threshold

    d, budget = policy.config.data, float(policy.config.router.budget)
    calib = read_rlla_parquet(
        calibration_files(d.kind, d.calib_files, d.synthetic, policy.config.cache_dir)[0]
    )[0]
    assert len(calib) == 64 and not {r.uid for r in calib} & {r.uid for r in records}
    threshold = calibrate_tool_threshold(records_probs(policy, calib).double(), budget)
    assert series["val/routing_budgeted/threshold"][-1][1] == pytest.approx(threshold, abs=1e-6)
    budgeted = budget_routes(probs, threshold)
    assert list(routes.route_budgeted) == [("answer", "search", "calculate")[int(i)] for i in budgeted]
    rate = float((budgeted != 0).double().mean())
    assert series["val/routing_budgeted/tool_rate"][-1][1] == pytest.approx(rate, abs=1e-6)
