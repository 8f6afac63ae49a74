"""Through the real entry point: a bad config exits 2 at start-up, naming the key, and writes no
checkpoint, TensorBoard event or rollout (validation runs before anything is built). One case per
way a config can be wrong (unknown key or wrong type when Hydra composes it, a value or a
combination ``validate()`` refuses); every other bad key is checked in-process by
``tests/unit/config/test_bad_keys_named.py``, through the same ``compose_job`` + ``validate_job``."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from jobhelpers import CACHE, REPO, TRAIN_ENV, run_command, run_train, train_cmd

CASES = [
    ("router_grpo", "router.budgett=0.2", "router.budgett"),  # unknown key
    ("router_grpo", "router.budget=abc", "router.budget"),  # wrong type
    ("router_grpo", "router.budget=-1", "router.budget"),  # out of range
    ("router_grpo", "trainer.max_steps=0", "trainer.max_steps"),  # a run that would do nothing
    ("mlgym_grpo", "env.memory_mb=0", "env.memory_mb"),  # the episode environment's limits
    (
        "grpo",
        "data.synthetic.p_search=0 data.synthetic.p_calculate=0 data.synthetic.p_answer=0",
        "all zero",
    ),
]


def test_bad_config_exits_2_naming_the_key_before_writing(tmp_path):
    """Through a real ``scripts/train.py``: the composition error, one line, exit 2, no run dir."""
    run_dir = tmp_path / "run"
    cmd = train_cmd("experiment=router_grpo", f"run_dir={run_dir}", "router.budgett=0.2")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "router.budgett" in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not run_dir.exists()


@pytest.mark.parametrize("experiment, override, key", CASES[1:], ids=[c[1] for c in CASES[1:]])
def test_each_kind_of_bad_config_is_one_line_naming_the_key(
    entry, capsys, tmp_path, experiment, override, key
):
    """The other kinds, through the same ``preflight`` in-process (the subprocess start-up is most of
    a subprocess case's time)."""
    run_dir = tmp_path / "run"
    overrides = [f"experiment={experiment}", f"run_dir={run_dir}", "trainer.max_steps=1", *override.split()]
    if override.startswith("trainer.max_steps"):
        overrides.remove("trainer.max_steps=1")
    line = preflight_error(entry, capsys, *overrides)
    assert key in line, line
    assert not run_dir.exists()


# ---------------------------------------------------------------------------- data, paths, runs
# Each user error of a command is one line on stderr naming the key / file / row, exit 2, no
# traceback. Those the entry point finds before Hydra runs (``preflight``: paths, the data files'
# parquet footers, the run directory against ``resume``) are checked in-process; those only the job
# finds (malformed rows, prompts all too long, a model that does not fit its checkpoint) through a
# real subprocess. A command refused on an existing run leaves every file of it as it was (Hydra's
# record ``.hydra/*`` included: the job writes it once its fit started); a refusal the job makes
# may append to ``train.log``.
RUN = [  # the shared existing run: 2 steps, a checkpoint each (tiny SFT warm start, as the session's)
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
    "trainer.save_freq=1",
    "trainer.val_check_interval=null",
]
DATA = ["experiment=grpo", "data=rlla", "trainer.max_steps=1", "sampling.n_prompts=2"]
GOOD_TRUTH = "<think>t</think>\n<response>ok</response>"
BAD_TRUTH = "<think>t</think>\n<tool_call>\n{not json\n</tool_call>"


def rlla_table(n_rows: int, ground_truth: str = GOOD_TRUTH):
    import pyarrow as pa

    from src.datamodules.schema import RLLA_ARROW_SCHEMA

    row = {
        "data_source": "rlla",
        "prompt": [
            {"content": "You may call tools.", "role": "system"},
            {"content": "Say ok.", "role": "user"},
        ],
        "ability": "math",
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {"index": 0, "input": "", "instruction": "", "output": "", "split": "train"},
    }
    rows = [{**row, "extra_info": {**row["extra_info"], "index": i}} for i in range(n_rows)]
    return pa.Table.from_pylist(rows, schema=RLLA_ARROW_SCHEMA)


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> dict[str, Path]:
    """One RLLA-schema parquet per way a data file can be wrong (and a good one)."""
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("data")
    files = {name: root / f"{name}.parquet" for name in ("good", "no_column", "bad_truths", "empty")}
    pq.write_table(rlla_table(4), files["good"])
    pq.write_table(rlla_table(4).drop(["reward_model"]), files["no_column"])
    pq.write_table(rlla_table(4, BAD_TRUTH), files["bad_truths"])
    pq.write_table(rlla_table(0), files["empty"])
    files["not_parquet"] = root / "not_parquet.parquet"
    files["not_parquet"].write_text("data_source,prompt\nrlla,hello\n")
    files["truncated"] = root / "truncated.parquet"
    good = files["good"].read_bytes()
    files["truncated"].write_bytes(good[: len(good) // 2])
    return files


@pytest.fixture(scope="module")
def entry():
    """``scripts/train.py`` as a module, for its ``preflight`` in-process."""
    spec = importlib.util.spec_from_file_location("train_entry", REPO / "scripts" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory) -> Path:
    """A finished 2-step run, trained once for the cases on an existing run (each works on a copy)."""
    run_dir = tmp_path_factory.mktemp("existing") / "run"
    run_train(*RUN, "trainer.max_steps=2", f"run_dir={run_dir}")
    return run_dir


@pytest.fixture
def run_copy(existing_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(existing_run, copy)
    return copy


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def preflight_error(entry, capsys, *overrides: str) -> str:
    """The one stderr line ``preflight`` exits 2 with."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        entry.preflight([f"cache_dir={CACHE}", *overrides])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert len(err.splitlines()) == 1, err
    return err.strip()


def job_error(*overrides: str, wrap: list[str] | None = None) -> str:
    """The one stderr line a real ``scripts/train.py`` exits 2 with (``wrap``: a shell command to
    run it in, its last argument the command line)."""
    cmd = train_cmd(*overrides)
    if wrap:
        cmd = [*wrap[:-1], f"{wrap[-1]} exec {shlex.join(cmd)}"]
        proc = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=TRAIN_ENV, check=False
        )
    else:  # the script as __main__ in this process (jobhelpers.run_command): its exit code and stderr
        proc = run_command(cmd)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # a library's progress bar (loading the model's weights, a real model's minutes) is no error line
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "%|" not in line]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_fresh_run_records_its_launch(existing_run):
    """Hydra's record of a launch, written by the job once its fit started (not by Hydra before)."""
    record = existing_run / ".hydra"
    assert sorted(p.name for p in record.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert "trainer.max_steps=2" in (record / "overrides.yaml").read_text()


@pytest.mark.parametrize(
    "name, says",
    [
        ("no_column", "missing column(s) ['reward_model']"),
        ("empty", "holds no rows"),
        ("not_parquet", "not a readable parquet file"),
        ("truncated", "not a readable parquet file"),
    ],
)
def test_bad_data_file_exits_2_before_hydra(entry, capsys, tmp_path, data_files, name, says):
    path = data_files[name]
    run_dir = tmp_path / "run"
    line = preflight_error(entry, capsys, *DATA, f"data.train_files=[{path}]", f"run_dir={run_dir}")
    assert line.startswith(f"config error: data.train_files[0]: {path}: ") and says in line, line
    assert not run_dir.exists()


def test_every_ground_truth_malformed_exits_2_naming_the_row(tmp_path, data_files):
    path = data_files["bad_truths"]
    line = job_error(*DATA, f"data.train_files=[{path}]", f"run_dir={tmp_path / 'run'}")
    assert line.startswith(f"error: {path}: none of its 4 rows is usable"), line
    assert "bad_truths.parquet row 0" in line and "unparseable ground truth" in line, line


def test_every_prompt_too_long_exits_2_naming_the_key(tmp_path, data_files):
    line = job_error(
        *DATA,
        f"data.train_files=[{data_files['good']}]",
        "data.max_prompt_length=8",
        f"run_dir={tmp_path / 'run'}",
    )
    assert line.startswith("error: data.max_prompt_length=8: every one of the 4 train prompts"), line
    assert "raise data.max_prompt_length" in line, line


@pytest.mark.parametrize("key", ["run_dir", "cache_dir"])
def test_directory_that_is_a_file_exits_2(entry, capsys, tmp_path, key):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory\n")
    paths = {"run_dir": tmp_path / "run", "cache_dir": CACHE, key: a_file}
    line = preflight_error(entry, capsys, *RUN, *(f"{k}={v}" for k, v in paths.items()))
    assert (
        line
        == f"config error: {key}={a_file}: is a file, not a directory; choose a directory path (it is created)"
    )
    assert a_file.read_text() == "not a directory\n"


def test_fresh_run_into_an_existing_run_exits_2_touching_nothing(entry, capsys, run_copy):
    before = tree_hashes(run_copy)
    line = preflight_error(entry, capsys, *RUN, "trainer.max_steps=4", f"run_dir={run_copy}")
    assert line.startswith(f"config error: run_dir={run_copy}: already holds a run") and "resume=true" in line
    assert tree_hashes(run_copy) == before


def test_resume_with_every_checkpoint_corrupt_exits_2_touching_nothing(entry, capsys, run_copy):
    for ckpt in (run_copy / "checkpoints").glob("*.ckpt"):
        ckpt.write_bytes(b"not a checkpoint")
    before = tree_hashes(run_copy)
    line = preflight_error(entry, capsys, *RUN, "trainer.max_steps=4", f"run_dir={run_copy}", "resume=true")
    assert f"no intact checkpoint in {run_copy / 'checkpoints'}" in line and "last.ckpt" in line, line
    assert tree_hashes(run_copy) == before


def test_resume_with_a_changed_model_exits_2_touching_nothing(run_copy):
    """Found by the job (it builds the model): the run's files are as they were, train.log aside
    (appended to)."""
    before, log_before = tree_hashes(run_copy), (run_copy / "train.log").read_text()
    line = job_error(
        *RUN, "trainer.max_steps=4", "router.mlp_hidden=64", f"run_dir={run_copy}", "resume=true"
    )
    assert line.startswith("error: resume=true: ") and "does not fit this run's model" in line, line
    assert "router.mlp_hidden: 128 -> 64" in line, line
    after = tree_hashes(run_copy)
    assert (run_copy / "train.log").read_text().startswith(log_before)
    assert {k: v for k, v in after.items() if k != "train.log"} == {
        k: v for k, v in before.items() if k != "train.log"
    }


def read_only_mount(folder: Path) -> list[str]:
    """A shell (in a private mount namespace) where ``folder`` is a read-only bind of itself; skips
    where this process may not mount (root ignores permission bits, so a read-only mount it is)."""
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder}"],
        check=False,
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"no read-only bind mount here: {probe.stderr.strip()[:200]}")
    return [
        "unshare",
        "-m",
        "sh",
        "-c",
        f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} &&",
    ]


def test_read_only_run_dir_exits_2(entry, capsys, tmp_path):
    folder = tmp_path / "read_only"
    folder.mkdir()
    run_dir = folder / "run"
    if os.geteuid() != 0:  # permission bits stop others than root, in-process
        folder.chmod(0o555)
        line = preflight_error(entry, capsys, *RUN, "trainer.max_steps=2", f"run_dir={run_dir}")
        folder.chmod(0o755)
        assert line.endswith(f"{folder} is not writable (permission denied); choose a writable run_dir"), line
        return
    line = job_error(*RUN, "trainer.max_steps=2", f"run_dir={run_dir}", wrap=read_only_mount(folder))
    assert (
        line
        == f"config error: run_dir={run_dir}: {folder} is on a read-only file system; choose a writable run_dir"
    )


def test_resume_on_a_read_only_mount_exits_2(run_copy):
    before = tree_hashes(run_copy)
    line = job_error(
        *RUN, "trainer.max_steps=4", f"run_dir={run_copy}", "resume=true", wrap=read_only_mount(run_copy)
    )
    assert (
        line
        == f"config error: run_dir={run_copy}: {run_copy} is on a read-only file system; choose a writable run_dir"
    )
    assert tree_hashes(run_copy) == before
