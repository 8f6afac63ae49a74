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
    lam = first["state_dict"]["lagrange_lambda"]
    assert first["global_step"] == 4
    callback_state = next(v for k, v in first["callbacks"].items() if "LagrangeCallback" in k)
    assert callback_state["steps"] == 4
    assert float(lam) >= 0.0
    series = scalars(run_dir)["train/lambda"]
    # lambda is logged with the step it was used in; the first resumed step used the checkpoint's
    first_resumed = [v for s, v in series if s == min(s for s, _ in series if s >= 4)]
    assert first_resumed and first_resumed[-1] == float(lam)
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 6
    assert next(v for k, v in last["callbacks"].items() if "LagrangeCallback" in k)["steps"] == 6
