"""Reading a run's artefacts for analysis: rollout logs, TensorBoard scalars, weak labels, and the
routing summaries and figures ``notebooks/routing_analysis.ipynb`` and ``scripts/evaluate.py`` show.

Tables are pandas frames; figures are ``matplotlib.figure.Figure`` objects built without pyplot,
so they render headless (Agg) and leave no global state behind.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

__all__ = [
    "ROUTES",
    "WEAK_LABELS",
    "confusion_table",
    "default_run_dir",
    "evaluation_summary",
    "held_out_routing",
    "last_steps_check",
    "load_manifest",
    "load_rollouts",
    "load_scalars",
    "plot_confusion",
    "plot_confusion_grid",
    "plot_lambda_cost",
    "plot_reward_by_route",
    "plot_route_accuracy",
    "plot_route_mix",
    "png_bytes",
    "reward_by_route",
    "route_accuracy",
    "route_accuracy_by_step",
    "route_mix_by_step",
    "weak_labels_for_run",
    "weak_labels_from_records",
    "with_weak_labels",
]

log = logging.getLogger(__name__)

ROUTES = ("answer", "search", "calculate")
WEAK_LABELS = ("ANSWER", "SEARCH", "CALCULATE", "MIXED")
_LABEL_OF_ROUTE = {"answer": "ANSWER", "search": "SEARCH", "calculate": "CALCULATE"}


# ---------------------------------------------------------------------------- locating and loading
def default_run_dir(start: str | Path | None = None, experiment: str = "router_grpo") -> Path | None:
    """The newest ``outputs/<experiment>/*`` run found from ``start`` (default cwd) or its parents.

    Runs are named by timestamp, so the newest is the last by name among those with a
    ``checkpoints`` or ``rollouts`` folder. None when there is none.
    """
    start = Path(start or Path.cwd()).resolve()
    for root in (start, *start.parents):
        runs = sorted(
            p
            for p in (root / "outputs" / experiment).glob("*")
            if (p / "checkpoints").is_dir() or (p / "rollouts").is_dir()
        )
        if runs:
            return runs[-1]
    return None


def load_manifest(run_dir: str | Path) -> dict[str, Any]:
    """``<run>/checkpoints/manifest.yaml`` as a dict ({} with a warning when absent)."""
    path = Path(run_dir) / "checkpoints" / "manifest.yaml"
    if not path.is_file():
        log.warning("%s not found: no config (budget, data files) for this run", path)
        return {}
    return yaml.safe_load(path.read_text()) or {}


def load_rollouts(run_dir: str | Path) -> pd.DataFrame:
    """All ``<run>/rollouts/step_*.parquet`` files concatenated (empty frame when none).

    Unreadable files are skipped and counted in one warning naming the first.
    """
    files = sorted((Path(run_dir) / "rollouts").glob("step_*.parquet"))
    frames, bad = [], []
    for f in files:
        try:
            frames.append(pd.read_parquet(f))
        except (OSError, ValueError) as err:
            bad.append(f"{f.name}: {err}")
    if bad:
        log.warning("skipped %d of %d rollout files (first: %s)", len(bad), len(files), bad[0])
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)


def held_out_routing(run_dir: str | Path, greedy: bool = True) -> pd.DataFrame:
    """The router alone on the held-out split at each validation, from ``rollouts/val/routes_*``:
    one row per validation step, one column per ``src.router.routing_eval.routing_metrics`` entry
    (greedy: argmax routes; else expected over the route distribution). Empty when none."""
    import torch

    from src.router.routing_eval import routing_metrics

    rows = {}
    for path in sorted((Path(run_dir) / "rollouts" / "val").glob("routes_*.parquet")):
        table = pd.read_parquet(path)
        probs = torch.tensor(table[["p_answer", "p_search", "p_calculate"]].to_numpy())
        rows[int(path.stem.split("_")[1])] = routing_metrics(probs, list(table.weak_label), greedy)
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("step")


def load_scalars(run_dir: str | Path, sub: str = "tensorboard") -> pd.DataFrame:
    """TensorBoard scalars of a run, wide: one row per step, one column per tag (empty when none).

    When a tag has several values at one step (a resumed run re-logging a step) the last wins.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = []
    for events in sorted((Path(run_dir) / sub).glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            rows += [(e.step, e.wall_time, tag, e.value) for e in acc.Scalars(tag)]
    if not rows:
        return pd.DataFrame()
    long = pd.DataFrame(rows, columns=["step", "wall_time", "tag", "value"]).sort_values("wall_time")
    wide = long.drop_duplicates(["step", "tag"], keep="last").pivot(
        index="step", columns="tag", values="value"
    )
    wide.columns.name = None
    return wide.sort_index()


# ---------------------------------------------------------------------------- weak labels
def weak_labels_from_records(records, families=None) -> dict[int, str]:
    """uid -> weak label ("ANSWER" | "SEARCH" | "CALCULATE" | "MIXED") of RLLA records
    (``src.datamodules.schema.RLLARecord``), from each ground truth's tool calls."""
    from src.formats.tools_block import tool_descriptions
    from src.rewards.dispatch import response_format
    from src.router.families import ToolFamilies
    from src.router.routes import weak_label

    families = families or ToolFamilies()
    return {
        r.uid: weak_label(
            r.ground_truth,
            families,
            fmt=response_format(r.data_source),
            descriptions=tool_descriptions(r.system),
        )
        for r in records
    }


def weak_labels_for_run(manifest: Mapping[str, Any]) -> dict[int, str]:
    """uid -> weak label for a run's training data, found through the manifest's config.

    Uses the configured train files (synthetic data is regenerated into the cache when missing).
    Returns {} with a warning when the data cannot be resolved, so callers degrade gracefully.
    """
    config = manifest.get("config") if isinstance(manifest, Mapping) else None
    if not config:
        log.warning("no config in the manifest: weak labels unavailable")
        return {}
    try:
        from omegaconf import OmegaConf

        from src.datamodules.schema import read_rlla_parquet
        from src.jobs.build import data_files
        from src.rollout.factory import make_families

        cfg = OmegaConf.create(dict(config))
        if cfg.data.get("kind") not in ("synthetic", "files"):
            log.warning(
                "data.kind=%s has no prompts with ground truths: no weak labels", cfg.data.get("kind")
            )
            return {}
        families = make_families(cfg)
        labels: dict[int, str] = {}
        for f in data_files(cfg)[0]:
            labels.update(weak_labels_from_records(read_rlla_parquet(f)[0], families))
        return labels
    except (OSError, ValueError, KeyError, AttributeError) as err:
        log.warning("could not read the run's training data for weak labels: %s", err)
        return {}


def with_weak_labels(rollouts: pd.DataFrame, labels: Mapping[int, str]) -> pd.DataFrame:
    """A copy of ``rollouts`` whose ``weak_label`` is filled from ``labels`` (by uid) where missing."""
    df = rollouts.copy()
    if df.empty:
        return df
    existing = df["weak_label"].tolist() if "weak_label" in df.columns else [None] * len(df)
    uids = df["uid"].tolist() if "uid" in df.columns else [None] * len(df)
    filled = [
        e if isinstance(e, str) else (labels.get(int(u)) if u is not None else None)
        for e, u in zip(existing, uids)
    ]
    df["weak_label"] = pd.Series(filled, index=df.index, dtype=object)  # None (not NaN) where unknown
    return df


# ---------------------------------------------------------------------------- tables
def route_mix_by_step(rollouts: pd.DataFrame) -> pd.DataFrame:
    """Fraction of rollouts per route at each step: index step, columns answer/search/calculate."""
    if rollouts.empty or "route" not in rollouts.columns:
        return pd.DataFrame(columns=list(ROUTES))
    counts = pd.crosstab(rollouts["step"], rollouts["route"])
    counts = counts.reindex(columns=list(ROUTES), fill_value=0)
    return counts.div(counts.sum(axis=1), axis=0)


def reward_by_route(rollouts: pd.DataFrame, columns=("reward_task", "reward_router", "cost")) -> pd.DataFrame:
    """Mean of the reward columns per route, with the count ``n``; routes in action order."""
    if rollouts.empty or "route" not in rollouts.columns:
        return pd.DataFrame(columns=["n", *columns])
    present = [c for c in columns if c in rollouts.columns]
    table = rollouts.groupby("route")[present].mean()
    table.insert(0, "n", rollouts.groupby("route").size())
    return table.reindex([r for r in ROUTES if r in table.index])


def confusion_table(
    frame: pd.DataFrame, label_col: str = "weak_label", route_col: str = "route"
) -> pd.DataFrame:
    """Counts of (weak label, route): rows ANSWER/SEARCH/CALCULATE/MIXED, columns the routes.

    Rows without a weak label are left out.
    """
    rows = list(WEAK_LABELS)
    if frame.empty or label_col not in frame.columns or route_col not in frame.columns:
        return pd.DataFrame(0, index=rows, columns=list(ROUTES))
    known = frame[frame[label_col].notna() & frame[route_col].notna()]
    table = pd.crosstab(known[label_col], known[route_col]) if len(known) else pd.DataFrame()
    table = table.reindex(index=rows, columns=list(ROUTES), fill_value=0).fillna(0).astype(int)
    table.index.name, table.columns.name = "weak_label", "route"
    return table


def route_accuracy(confusion: pd.DataFrame) -> tuple[float | None, int]:
    """(share of labelled non-MIXED rows routed to their label's route, that row count).

    Accuracy is None when no row is labelled ANSWER/SEARCH/CALCULATE.
    """
    hits = sum(
        int(confusion.loc[_LABEL_OF_ROUTE[r], r]) for r in ROUTES if _LABEL_OF_ROUTE[r] in confusion.index
    )
    n = int(confusion.drop(index="MIXED", errors="ignore").to_numpy().sum())
    return (hits / n if n else None), n


def evaluation_summary(rows: pd.DataFrame) -> dict[str, Any]:
    """Summary of per-row evaluation results (columns as written by ``scripts/evaluate.py``).

    Keys: n, reward {total, format, correctness, length} (means), route_mix {route: fraction},
    tool_call_rate, mean_cost, mean_response_length, weak_label_counts, route_vs_weak_label
    {accuracy, n_labelled, confusion {label: {route: count}}}.
    """
    n = len(rows)

    def mean(col: str) -> float | None:
        return float(rows[col].mean()) if n and col in rows.columns else None

    has_route = n and "route" in rows.columns and rows["route"].notna().any()
    route_mix = {r: float((rows["route"] == r).mean()) for r in ROUTES} if has_route else None
    confusion = confusion_table(rows) if has_route else None
    accuracy, n_labelled = route_accuracy(confusion) if confusion is not None else (None, 0)
    labels = rows["weak_label"].value_counts().to_dict() if n and "weak_label" in rows.columns else {}
    return {
        "n": n,
        "reward": {
            "total": mean("reward_task"),
            "format": mean("reward_format"),
            "correctness": mean("reward_correctness"),
            "length": mean("reward_length"),
        },
        "route_mix": route_mix,
        "tool_call_rate": mean("used_tool"),
        "mean_cost": mean("cost"),
        "mean_response_length": mean("response_length"),
        "weak_label_counts": {str(k): int(v) for k, v in labels.items()},
        "route_vs_weak_label": {
            "accuracy": accuracy,
            "n_labelled": n_labelled,
            "confusion": (
                {label: {r: int(confusion.loc[label, r]) for r in ROUTES} for label in confusion.index}
                if confusion is not None
                else None
            ),
        },
    }


# ---------------------------------------------------------------------------- figures
def _figure(width: float = 6.4, height: float = 3.6):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _integer_steps(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def png_bytes(fig) -> bytes:
    """The figure rendered to PNG (Agg canvas)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def plot_route_mix(mix: pd.DataFrame, scalars: pd.DataFrame | None = None):
    """Stacked route fractions per step (rollout logs); TB ``train/route_frac_*`` when no logs."""
    fig = _figure()
    ax = fig.add_subplot()
    if mix.empty and scalars is not None and not scalars.empty:
        cols = {r: f"train/route_frac_{r}" for r in ROUTES if f"train/route_frac_{r}" in scalars.columns}
        mix = scalars[list(cols.values())].rename(columns={v: k for k, v in cols.items()})
    if mix.empty:
        ax.text(0.5, 0.5, "no routed rollouts", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.stackplot(
            mix.index.to_numpy(),
            *[mix[c].to_numpy() for c in mix.columns],
            labels=list(mix.columns),
            alpha=0.85,
        )
        ax.set_ylim(0, 1)
        ax.legend(loc="upper right", fontsize="small")
    ax.set(xlabel="step", ylabel="fraction of rollouts", title="Route mix over training")
    _integer_steps(ax)
    return fig


def plot_lambda_cost(scalars: pd.DataFrame, budget: float | None, rollouts: pd.DataFrame | None = None):
    """λ and the batch mean cost Ê[cost] per step against the budget B (twin y-axes)."""
    fig = _figure()
    ax = fig.add_subplot()
    cost = scalars["train/cost_mean"] if not scalars.empty and "train/cost_mean" in scalars.columns else None
    if cost is None and rollouts is not None and not rollouts.empty and "cost" in rollouts.columns:
        cost = rollouts.groupby("step")["cost"].mean()
    if cost is not None:
        cost = cost.dropna()
        ax.plot(cost.index.to_numpy(), cost.to_numpy(), marker="o", color="tab:blue", label="Ê[cost]")
    if budget is not None:
        ax.axhline(float(budget), color="tab:red", linestyle="--", label=f"budget B = {budget:g}")
    ax.set(xlabel="step", ylabel="mean tool cost", title="Tool cost against the budget, and λ")
    _integer_steps(ax)
    handles, labels = ax.get_legend_handles_labels()
    if not scalars.empty and "train/lambda" in scalars.columns:
        lam = scalars["train/lambda"].dropna()
        ax2 = ax.twinx()
        ax2.plot(lam.index.to_numpy(), lam.to_numpy(), marker="s", color="tab:green", label="λ")
        ax2.set_ylabel("λ")
        ax2.set_ylim(0, max(float(lam.max()) * 1.15, 0.1))  # λ >= 0; a flat 0 sits on the axis
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    if handles:
        ax.legend(handles, labels, loc="upper right", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no cost or λ logged", ha="center", va="center", transform=ax.transAxes)
    return fig


def plot_reward_by_route(table: pd.DataFrame):
    """Mean task and router reward per route, bars annotated with rollout counts."""
    fig = _figure()
    ax = fig.add_subplot()
    if table.empty:
        ax.text(0.5, 0.5, "no routed rollouts", ha="center", va="center", transform=ax.transAxes)
    else:
        cols = [c for c in ("reward_task", "reward_router") if c in table.columns]
        width = 0.8 / max(len(cols), 1)
        x = range(len(table))
        for k, col in enumerate(cols):
            ax.bar([i + k * width for i in x], table[col].to_numpy(), width=width, label=col)
        ax.set_xticks(
            [i + width * (len(cols) - 1) / 2 for i in x],
            [f"{r}\n(n={int(n)})" for r, n in zip(table.index, table["n"])],
        )
        ax.axhline(0, color="black", linewidth=0.5)
        ax.legend(fontsize="small")
    ax.set(ylabel="mean reward", title="Reward by route")
    return fig


def plot_confusion(confusion: pd.DataFrame):
    """Heatmap of route (columns) against weak label (rows), with counts in the cells."""
    fig = _figure(5.0, 4.0)
    ax = fig.add_subplot()
    values = confusion.to_numpy()
    image = ax.imshow(values, cmap="Blues")
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            ax.text(
                j,
                i,
                str(int(values[i, j])),
                ha="center",
                va="center",
                color="white" if values[i, j] > values.max() / 2 else "black",
            )
    ax.set_xticks(range(values.shape[1]), list(confusion.columns))
    ax.set_yticks(range(values.shape[0]), list(confusion.index))
    accuracy, n = route_accuracy(confusion)
    acc = "n/a" if accuracy is None else f"{accuracy:.2f}"
    ax.set(xlabel="route taken", ylabel="weak label", title=f"Route vs weak label (acc {acc}, n={n})")
    fig.colorbar(image, ax=ax, shrink=0.8)
    return fig


# ---------------------------------------------------------------------------- the main job's check
def route_accuracy_by_step(rollouts: pd.DataFrame) -> pd.DataFrame:
    """Per step: route_acc_answer, route_acc_family (``src.rollout.metrics.route_accuracy``), cost."""
    from src.rollout.metrics import route_accuracy as accuracy_pair

    if rollouts.empty or not {"route", "weak_label"} <= set(rollouts.columns):
        return pd.DataFrame(columns=["route_acc_answer", "route_acc_family", "cost"])
    rows = {}
    for step, part in rollouts.groupby("step"):
        acc_answer, acc_family = accuracy_pair(part["weak_label"].tolist(), part["route"].tolist())
        rows[step] = {  # a step with nothing to measure is a missing value (NaN) in the frame
            "route_acc_answer": math.nan if acc_answer is None else acc_answer,
            "route_acc_family": math.nan if acc_family is None else acc_family,
            "cost": part["cost"].mean(),
        }
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("step")


def first_last_means(rollouts: pd.DataFrame, column: str, n_steps: int) -> tuple[float, float, int]:
    """(mean of ``column`` over the first ``n_steps`` logged steps, over the last ``n_steps``, how many
    steps each covers)."""
    steps = sorted(rollouts["step"].unique())
    first, last = steps[:n_steps], steps[-n_steps:]
    means = [float(rollouts.loc[rollouts["step"].isin(part), column].mean()) for part in (first, last)]
    return means[0], means[1], len(last)


def last_steps_check(rollouts: pd.DataFrame, budget: float | None, n_steps: int = 50) -> dict[str, Any]:
    """The main job's figures over its last ``n_steps`` steps, recomputed from the rollout log:
    mean cost (and |cost − B|), route_acc_answer, route_acc_family (pooled over those rollouts),
    and the format reward of the first vs the last ``n_steps`` steps."""
    from src.rollout.metrics import route_accuracy as accuracy_pair

    if rollouts.empty:
        return {"n_steps": 0}
    steps = sorted(rollouts["step"].unique())
    last = rollouts[rollouts["step"].isin(steps[-n_steps:])]
    first = rollouts[rollouts["step"].isin(steps[:n_steps])]
    reward_first, reward_last, _ = first_last_means(rollouts, "reward_task", n_steps)
    acc_answer, acc_family = accuracy_pair(last["weak_label"].tolist(), last["route"].tolist())
    cost = float(last["cost"].mean())
    recall = {  # per label: share of its rollouts routed to its own route (family acc ignores answer-routed)
        f"recall_{label.lower()}": float((rows["route"] == label.lower()).mean())
        for label, rows in last.groupby("weak_label")
        if label in ("ANSWER", "SEARCH", "CALCULATE")
    }
    return {
        "n_steps": len(steps[-n_steps:]),
        "cost_mean": cost,
        "budget": budget,
        "cost_minus_budget": None if budget is None else cost - float(budget),
        "route_acc_answer": acc_answer,
        "route_acc_family": acc_family,
        **recall,
        "format_first": float(first["reward_format"].mean()),
        "format_last": float(last["reward_format"].mean()),
        "reward_task_first": reward_first,
        "reward_task_last": reward_last,
    }


def plot_route_accuracy(by_step: pd.DataFrame, window: int = 10):
    """route_acc_answer and route_acc_family per step (thin) and their rolling means (thick)."""
    fig = _figure()
    ax = fig.add_subplot()
    if by_step.empty:
        ax.text(
            0.5, 0.5, "no routed rollouts with weak labels", ha="center", va="center", transform=ax.transAxes
        )
    for col, color in (("route_acc_answer", "tab:blue"), ("route_acc_family", "tab:orange")):
        if col not in by_step.columns or by_step.empty:
            continue
        series = by_step[col].astype(float)
        ax.plot(series.index.to_numpy(), series.to_numpy(), color=color, alpha=0.3, linewidth=0.8)
        smooth = series.rolling(window, min_periods=1).mean()
        ax.plot(smooth.index.to_numpy(), smooth.to_numpy(), color=color, linewidth=2, label=col)
    ax.axhline(0.9, color="grey", linestyle=":", label="0.9")
    ax.set_ylim(0, 1.02)
    ax.set(xlabel="step", ylabel="share of rollouts", title="Does the route depend on the prompt?")
    ax.legend(loc="lower right", fontsize="small")
    _integer_steps(ax)
    return fig


def plot_confusion_grid(tables: Mapping[float, pd.DataFrame]):
    """One weak label × learned route heatmap per budget (route tables of a sweep)."""
    fig = _figure(3.0 * max(len(tables), 1), 3.2)
    for k, (budget, table) in enumerate(sorted(tables.items())):
        ax = fig.add_subplot(1, max(len(tables), 1), k + 1)
        confusion = confusion_table(table, route_col="learned_route")
        values = confusion.to_numpy()
        ax.imshow(values, cmap="Blues")
        for i in range(values.shape[0]):
            for j in range(values.shape[1]):
                ax.text(j, i, str(int(values[i, j])), ha="center", va="center", fontsize=8)
        ax.set_xticks(range(values.shape[1]), [r[:4] for r in confusion.columns], fontsize=7)
        ax.set_yticks(range(values.shape[0]), list(confusion.index) if k == 0 else [], fontsize=7)
        ax.set_title(f"B = {budget:g}", fontsize=9)
    return fig


def reward_by_request_class(rollouts: pd.DataFrame, parquet_files: list[str | Path]) -> pd.DataFrame:
    """Mean task reward, its count and tool-call rate per (request class, route) of a synthetic run.

    The class (``answer`` | ``exact`` | ``vague``, ``src.datamodules.synthetic_text.request_class``)
    is read from each uid's user turn in ``parquet_files`` (the run's train / val files): does a
    tool pay more on exact requests than on vague ones, in this run? A uid missing from the files
    is an error.
    """
    from src.datamodules.synthetic import ground_truth_family
    from src.datamodules.synthetic_text import request_class

    classes: dict[int, str] = {}
    for path in parquet_files:
        frame = pd.read_parquet(path)
        for extra, gt in zip(frame["extra_info"], frame["reward_model"]):
            tool = ground_truth_family(gt["ground_truth"]) != "answer"
            vague = tool and request_class(extra["input"]) == "vague"
            classes[int(extra["index"])] = ("vague" if vague else "exact") if tool else "answer"
    missing = sorted(set(rollouts["uid"].astype(int)) - set(classes))
    if missing:
        raise ValueError(
            f"uids {missing[:5]} (of {len(missing)}) are in none of {list(map(str, parquet_files))}"
        )
    frame = rollouts.assign(request_class=rollouts["uid"].astype(int).map(classes))
    return (
        frame.groupby(["request_class", "route"])
        .agg(
            reward_task=("reward_task", "mean"),
            n=("reward_task", "size"),
            tool_call_rate=("used_tool", "mean"),
        )
        .reset_index()
    )


# ---------------------------------------------------------------------------- end of a run
def _fmt(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def run_summary(
    run_dir: str | Path, budget: float | None, resume_command: str, n_steps: int = 50
) -> list[str]:
    """The few lines a run's log ends with: what it achieved and where its outputs are.

    From the run's own files: over the last ``n_steps`` steps of the rollout log Ê[cost] against
    ``budget`` (None: no router), the route accuracies and the task reward; the router alone on the
    held-out split at the last validation (``rollouts/val/routes_*``); the run dir and how to resume.
    """
    rollouts = load_rollouts(run_dir)
    lines = [f"run dir: {run_dir}"]
    reward = "reward_task" if "reward_task" in rollouts else "reward"
    if reward in rollouts:
        first, last_mean, n = first_last_means(rollouts, reward, n_steps)
        lines.append(f"last {n} steps: task reward {_fmt(last_mean)} (first {n}: {_fmt(first)})")
        if budget is not None and "weak_label" in rollouts:
            last = last_steps_check(rollouts, budget, n_steps)
            lines.append(
                f"last {last['n_steps']} steps: Ê[cost] {_fmt(last['cost_mean'])} vs B {budget:.3f}; "
                f"route accuracy answer {_fmt(last['route_acc_answer'])}, family {_fmt(last['route_acc_family'])}"
            )
    routing = held_out_routing(run_dir) if budget is not None else pd.DataFrame()
    if not routing.empty:
        step, row = routing.index[-1], routing.iloc[-1].to_dict()
        keys = ("route_acc_answer", "route_acc_family", "recall_search", "recall_calculate", "tool_rate")
        lines.append(
            f"held-out routing at step {step} (router alone, argmax): "
            + ", ".join(f"{k.replace('route_acc_', 'acc ')} {_fmt(row.get(k))}" for k in keys)
        )
        table = pd.read_parquet(Path(run_dir) / "rollouts" / "val" / f"routes_{step:08d}.parquet")
        if "route_budgeted" in table:
            rate = float((table.route_budgeted != "answer").mean())
            lines.append(
                f"held-out tool rate under B {budget:.3f}, threshold calibrated on the calibration "
                f"split: {_fmt(rate)} ({len(table)} prompts)"
            )
    lines.append(f"resume (after a stop, or with a larger trainer.max_steps): {resume_command}")
    return lines
