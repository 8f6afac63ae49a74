"""RLLADataModule: real ToolRL parquet as-is, schema errors, bad/over-long rows counted, list batches."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from src.datamodules.rlla_datamodule import LoaderSettings, RLLADataModule, prompt_token_ids
from src.datamodules.schema import SchemaError, read_rlla_parquet
from src.datamodules.synthetic import generate_rlla_rows, write_rlla_parquet, write_synthetic_rlla
from src.models.tiny import build_tiny_tokenizer

REAL_TEST = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "rlla_4k" / "test.parquet"
KEYS = {"uid", "data_source", "messages", "ground_truth", "prompt_ids", "extra_info"}


@pytest.fixture(scope="module")
def tokenizer():
    df = generate_rlla_rows(200, seed=0)
    corpus = [m["content"] for p in df["prompt"] for m in p] + [r["ground_truth"] for r in df["reward_model"]]
    return build_tiny_tokenizer(corpus, vocab_size=1000)


@pytest.fixture()
def synth(tmp_path):
    return write_synthetic_rlla(tmp_path / "synth", n_train=40, n_test=10, seed=0)


def _dm(tokenizer, train, val=(), **kw):
    args = dict(max_prompt_length=100_000, batch_size=8, seed=0)
    args.update(kw)
    dm = RLLADataModule([str(p) for p in train], [str(p) for p in val], tokenizer, LoaderSettings(**args))
    dm.setup("fit")
    return dm


def test_real_toolrl_test_parquet_loads_as_is(tokenizer):
    if not REAL_TEST.is_file():
        pytest.skip("real RLLA data not present")
    dm = _dm(tokenizer, [REAL_TEST], [REAL_TEST], batch_size=16)
    df = pd.read_parquet(REAL_TEST)
    assert len(dm.train_dataset) == 80
    assert dm.stats["train"] == {"files": 1, "read": 80, "kept": 80, "dropped": {}}
    batch = next(iter(dm.val_dataloader()))  # unshuffled: file order
    assert isinstance(batch, list) and len(batch) == 16
    for rec, (_, row) in zip(batch, df.iterrows()):
        assert set(rec) == KEYS
        assert rec["uid"] == row["extra_info"]["index"] and rec["data_source"] == "rlla"
        assert rec["messages"] == [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
        assert all(type(m) is dict for m in rec["messages"])
        assert rec["ground_truth"] == row["reward_model"]["ground_truth"]
        # the datamodule encodes the rendered templates in one call: transformers' own one-by-one ids
        want = tokenizer.apply_chat_template(
            rec["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert rec["prompt_ids"] == list(want) == prompt_token_ids(tokenizer, rec["messages"])
        assert rec["extra_info"]["split"] == "test" and isinstance(rec["extra_info"]["index"], int)
    uids = sorted(r["uid"] for b in dm.train_dataloader() for r in b)
    assert uids == sorted(e["index"] for e in df["extra_info"])


def test_prompt_ids_end_with_generation_prompt(tokenizer, synth):
    dm = _dm(tokenizer, [synth["train"]])
    rec = dm.train_dataset[0]
    text = tokenizer.decode(rec["prompt_ids"])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_missing_column_is_a_clear_error(tokenizer, tmp_path):
    df = generate_rlla_rows(5, seed=0).drop(columns=["reward_model"])
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp_path / "bad.parquet")
    with pytest.raises(SchemaError, match=r"bad\.parquet: missing column 'reward_model'"):
        _dm(tokenizer, [tmp_path / "bad.parquet"])


def test_struct_without_needed_field_is_a_clear_error(tmp_path):
    df = generate_rlla_rows(3, seed=0)
    df["reward_model"] = [{"style": "rule"}] * 3
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp_path / "nogt.parquet")
    message = r"nogt\.parquet: column 'reward_model' has no field 'ground_truth'"
    with pytest.raises(SchemaError, match=message):
        read_rlla_parquet(tmp_path / "nogt.parquet")


def test_missing_file_and_bad_args(tokenizer, tmp_path, synth):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        _dm(tokenizer, [tmp_path / "nope.parquet"])
    with pytest.raises(TypeError):
        RLLADataModule(str(synth["train"]), [], tokenizer, LoaderSettings(max_prompt_length=10, batch_size=2))
    with pytest.raises(ValueError, match="positive"):
        RLLADataModule([synth["train"]], [], tokenizer, LoaderSettings(max_prompt_length=0, batch_size=2))


def test_malformed_rows_skipped_and_counted(tokenizer, tmp_path, caplog):
    df = generate_rlla_rows(10, seed=1)
    df.at[2, "prompt"] = df.at[2, "prompt"][:1]  # only a system message
    df.at[3, "prompt"] = df.at[3, "prompt"][::-1]  # [user, system]
    df.at[5, "reward_model"] = {"ground_truth": "", "style": "rule"}
    df.at[7, "reward_model"] = {"ground_truth": None, "style": "rule"}
    df.at[8, "extra_info"] = {**df.at[8, "extra_info"], "index": None}
    path = write_rlla_parquet(df, tmp_path / "messy.parquet")
    with caplog.at_level(logging.WARNING):
        dm = _dm(tokenizer, [path])
    assert dm.stats["train"]["read"] == 10 and dm.stats["train"]["kept"] == 5
    expected = {"prompt_not_system_user": 2, "missing_ground_truth": 2, "missing_index": 1}
    assert dm.stats["train"]["dropped"] == expected
    assert sorted(r["uid"] for r in dm.train_dataset.records) == [0, 1, 4, 6, 9]
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "messy.parquet: skipped 5 of 10" in msg and "row 2: prompt must be [system, user] messages" in msg


def test_overlong_rows_dropped_and_counted(tokenizer, synth, caplog):
    lengths = sorted(
        len(prompt_token_ids(tokenizer, list(p))) for p in pd.read_parquet(synth["train"])["prompt"]
    )
    cut = lengths[len(lengths) // 2]
    n_long = sum(n > cut for n in lengths)
    assert 0 < n_long < len(lengths)
    with caplog.at_level(logging.WARNING):
        dm = _dm(tokenizer, [synth["train"]], [synth["test"]], max_prompt_length=cut)
    assert dm.stats["train"]["kept"] == 40 - n_long and dm.stats["train"]["dropped"] == {"overlong": n_long}
    assert all(len(r["prompt_ids"]) <= cut for r in dm.train_dataset.records)
    assert f"train.parquet: dropped {n_long} of 40 rows longer than {cut}" in caplog.text
    kept = _dm(tokenizer, [synth["train"]], max_prompt_length=cut, filter_overlong=False)
    assert kept.stats["train"]["kept"] == 40 and kept.stats["train"]["dropped"] == {}


def test_several_files_and_data_sources(tokenizer, tmp_path, synth):
    from src.datamodules.gpt_oss import convert_frame

    harmony, _ = convert_frame(generate_rlla_rows(6, seed=9, start_index=1000))
    gpt = write_rlla_parquet(harmony.reset_index(drop=True), tmp_path / "gpt.parquet")
    dm = _dm(tokenizer, [synth["train"], gpt], batch_size=64)
    (batch,) = list(dm.train_dataloader())
    assert len(batch) == 46
    assert {r["data_source"] for r in batch} == {"rlla", "rlla_gpt"}
    assert dm.stats["train"]["files"] == 2


def test_shuffle_seeded_per_epoch_and_state_roundtrip(tokenizer, synth):
    def order(dm):
        return [r["uid"] for b in dm.train_dataloader() for r in b]

    a, b = _dm(tokenizer, [synth["train"]]), _dm(tokenizer, [synth["train"]])
    assert order(a) == order(b) and sorted(order(a)) == list(range(40)) and order(a) != list(range(40))
    loader = a.train_dataloader()
    loader.sampler.set_epoch(1)  # what Lightning does before epoch 1
    epoch1 = [r["uid"] for bt in loader for r in bt]
    assert sorted(epoch1) == list(range(40)) and epoch1 != order(b)
    assert a.state_dict() == {"seed": 0, "epoch": 1, "position": 0}  # no trainer: nothing consumed
    c = _dm(tokenizer, [synth["train"]])
    c.load_state_dict(a.state_dict())
    assert order(c) == epoch1  # resuming replays epoch 1's permutation
    assert order(c) != order(b)
    unshuffled = _dm(tokenizer, [synth["train"]], shuffle=False)
    assert order(unshuffled) == list(range(40))


def test_records_are_copies(tokenizer, synth):
    dm = _dm(tokenizer, [synth["train"]])
    rec = dm.train_dataset[0]
    rec["messages"][0]["content"] = "rewritten"
    rec["prompt_ids"].append(-1)
    assert dm.train_dataset[0]["messages"][0]["content"] != "rewritten"
    assert dm.train_dataset[0]["prompt_ids"][-1] != -1


class _Recorder(L.LightningModule):
    """Consumes list batches; records uids per epoch."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        assert isinstance(batch, list) and set(batch[0]) == KEYS
        self.seen.setdefault(self.current_epoch, []).extend(r["uid"] for r in batch)
        return (self.w**2).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_uses_list_batches_and_reshuffles(tokenizer, synth):
    dm = RLLADataModule(
        [str(synth["train"])], [], tokenizer, LoaderSettings(max_prompt_length=100_000, batch_size=10)
    )
    model = _Recorder()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    assert sorted(model.seen[0]) == sorted(model.seen[1]) == list(range(40))
    assert model.seen[0] != model.seen[1]
    assert dm.state_dict() == {"seed": 0, "epoch": 1, "position": 40}  # the last epoch, all consumed


class _StopAt(L.Callback):
    """After ``n`` batches: checkpoint to ``path`` (as the run's checkpoints are, at batch end), stop."""

    def __init__(self, n: int, path):
        self.n, self.path, self.state = n, path, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.n:
            self.state = trainer.datamodule.state_dict()
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def _fit(dm, max_steps: int, callbacks=(), ckpt_path=None):
    model = _Recorder()
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return model, trainer


def test_checkpoint_mid_epoch_resumes_the_permutation_where_it_stopped(tokenizer, synth, tmp_path):
    """40 rows in batches of 10: stop after 6 batches (epoch 1, 2 batches in), resume to 8."""
    files = [str(synth["train"])]
    straight, _ = _fit(
        RLLADataModule(files, [], tokenizer, LoaderSettings(max_prompt_length=100_000, batch_size=10)), 8
    )
    stop = _StopAt(6, tmp_path / "mid.ckpt")
    first, _ = _fit(
        RLLADataModule(files, [], tokenizer, LoaderSettings(max_prompt_length=100_000, batch_size=10)),
        8,
        [stop],
    )
    assert stop.state == {"seed": 0, "epoch": 1, "position": 20}
    resumed, _ = _fit(
        RLLADataModule(files, [], tokenizer, LoaderSettings(max_prompt_length=100_000, batch_size=10)),
        8,
        ckpt_path=tmp_path / "mid.ckpt",
    )
    assert first.seen[1] + resumed.seen[1] == straight.seen[1]
    assert len(resumed.seen[1]) == 20 and 0 not in resumed.seen  # no prompt seen twice


def test_unscorable_rows_counted_per_reason_and_skipped(tokenizer, tmp_path, caplog):
    """Rows no reward can score (unknown data_source, ground truth whose tool calls do not parse) are
    skipped at load and counted per reason, not left to fail or score 0 in the middle of a run."""
    df = generate_rlla_rows(8, seed=2, p_search=1.0, p_calculate=0.0, p_answer=0.0)
    df.at[1, "data_source"] = "toolbench"
    df.at[4, "data_source"] = "nope"
    df.at[6, "reward_model"] = {
        "ground_truth": "<think>x</think>\n<tool_call>\n{oops\n</tool_call>",
        "style": "rule",
    }
    path = write_rlla_parquet(df, tmp_path / "mixed.parquet")
    with caplog.at_level(logging.WARNING):
        dm = _dm(tokenizer, [path])
    assert dm.stats["train"]["dropped"] == {"unknown_data_source": 2, "unparseable_ground_truth": 1}
    assert sorted(r["uid"] for r in dm.train_dataset.records) == [0, 2, 3, 5, 7]
    assert "mixed.parquet row 1" in caplog.text


@pytest.mark.parametrize("column, value", [("data_source", "toolbench"), ("reward_model", "bad_gt")])
def test_file_with_no_usable_row_is_named(tokenizer, tmp_path, column, value):
    df = generate_rlla_rows(5, seed=3, p_search=1.0, p_calculate=0.0, p_answer=0.0)
    if value == "bad_gt":
        value = [{"ground_truth": "<tool_call>\n[[[\n</tool_call>", "style": "rule"}] * len(df)
        df[column] = value
    else:
        df[column] = value
    path = write_rlla_parquet(df, tmp_path / "allbad.parquet")
    with pytest.raises(ValueError, match="allbad.parquet: none of its 5 rows is usable"):
        _dm(tokenizer, [path])
