"""`hetpp data prepare`: a BPE trained here (offline) tokenizes text, JSONL and parquet into shards
with a header and an index; training reads them memory-mapped with a held-out validation split;
a file of another format given as --data exits 2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetpp.cli.main import main
from hetpp.dataset.shards import HEADER, open_dataset, open_shard, token_dtype, write_shard
from hetpp.runtime.data import TokenWindows, make_source, validation_batch
from hetpp.specs import PRESETS, PipelinePlan, Plan, SpecError, StagePlan

tokenizers = pytest.importorskip("tokenizers")
DOCS = [f"document {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(30)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"])
    tok.train_from_iterator(DOCS, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _inputs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = []
    for i, doc in enumerate(DOCS[:10]):
        text.append(tmp_path / f"doc{i}.txt")
        text[-1].write_text(doc)
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"body": d, "id": 1}) + "\n" for d in DOCS[10:20]))
    parquet = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": DOCS[20:]}), parquet)
    return [*text, jsonl, parquet]


def test_prepare_writes_eos_terminated_documents_and_a_validation_split(tmp_path, tokenizer):
    from tokenizers import Tokenizer

    out = tmp_path / "data"
    argv = ["data", "prepare", "--tokenizer", str(tokenizer), "--out", str(out)]
    files = [str(p) for p in _inputs(tmp_path)]
    assert main([*argv, "--input", *files, "--field", "body", "--val-every", "5"]) == 0
    ds = open_dataset(out)
    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    assert ds.index["eos_id"] == eos and ds.index["dtype"] == "uint16"
    want = {"train": [], "val": []}
    for i, doc in enumerate(DOCS):
        want["val" if i % 5 == 4 else "train"] += [*tok.encode(doc).ids, eos]
    assert np.concatenate(ds.train).tolist() == want["train"]
    assert np.concatenate(ds.val).tolist() == want["val"]
    assert ds.index["documents"] == 30 and ds.index["val"][0]["documents"] == 6


def test_shard_header_and_uint32_for_large_vocabularies(tmp_path):
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    ids = np.array([0, 70000, 123456], dtype=np.uint32)
    write_shard(tmp_path / "s.bin", ids)
    raw = (tmp_path / "s.bin").read_bytes()
    assert raw[:8] == b"HETPPTOK" and len(raw) == HEADER + 12
    assert open_shard(tmp_path / "s.bin").tolist() == ids.tolist()
    (tmp_path / "s.bin").write_bytes(raw[:-4])
    with pytest.raises(SpecError, match="truncated"):
        open_shard(tmp_path / "s.bin")


def _plan(seq_len: int = 8) -> Plan:
    pipe = PipelinePlan(
        stages=(StagePlan(devices=(0,), layers=(0, 6)),), micro_batch_size=2, num_micro_batches=1
    )
    return Plan(global_batch=2, seq_len=seq_len, pipelines=(pipe,), model=PRESETS["tiny-llama"])


def test_training_reads_windows_across_shards_and_the_held_out_split(tmp_path, tokenizer):
    out = tmp_path / "data"
    files = [str(p) for p in _inputs(tmp_path)]
    argv = ["data", "prepare", "--tokenizer", str(tokenizer), "--out", str(out), "--input"]
    assert main([*argv, *files, "--field", "body"]) == 0
    plan = _plan()
    src = make_source(str(out), plan, seed=0)
    stream = np.concatenate(open_dataset(out).train)
    assert src.shuffle_seed == 0 and make_source(str(out), plan, seed=0).sample(5).tolist() == (
        src.sample(5).tolist()
    )
    ids = TokenWindows([np.arange(100)], 8, "x", shuffle_seed=3)  # token = its position
    firsts = [int(ids.sample(g)[0]) for g in range(ids.windows)]
    assert sorted(firsts) == [8 * k for k in range(12)] and firsts != sorted(firsts)
    assert [int(ids.sample(12 + g)[0]) for g in range(12)] != firsts  # a new order per epoch
    assert ids.sample(4).tolist() == list(range(firsts[4], firsts[4] + 9))
    split = TokenWindows([stream[:5], stream[5:7], stream[7:]], 8, "x")  # straddles two shards
    assert split.sample(0).tolist() == stream[:9].tolist()
    val = validation_batch(str(out), plan, seed=0, count=4)
    held_out = np.concatenate(open_dataset(out).val)
    assert val[0].tolist() == held_out[:9].tolist()


@pytest.mark.parametrize("name", ["corpus.jsonl", "tokens.npy", "data.parquet", "megatron.bin"])
def test_another_format_as_data_exits_2(tmp_path, capsys, name):
    bad = tmp_path / name
    bad.write_text("{}")
    (tmp_path / "megatron.idx").write_bytes(b"MMIDIDX\x00\x00")
    plan = tmp_path / "plan.json"
    _plan().validate_plan().save(plan)
    assert main(["train", "--plan", str(plan), "--data", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert ("unsupported data format" in err or "Megatron" in err) and str(bad) in err
    assert "\n" not in err


def test_unknown_input_format_is_refused_before_any_work(tmp_path, tokenizer):
    (tmp_path / "a.csv").write_text("x")
    from hetpp.dataset.prepare import PrepareOptions, prepare

    with pytest.raises(SpecError, match=r"unsupported input format '\.csv'"):
        prepare(
            PrepareOptions(
                tokenizer=str(tokenizer), inputs=(str(tmp_path / "a.csv"),), out=str(tmp_path / "o")
            )
        )


def test_the_demo_corpus_is_built_offline_from_the_standard_library(tmp_path):
    from hetpp.demo.corpus import build_corpus

    ds = open_dataset(build_corpus(tmp_path, limit_bytes=40_000, vocab_size=256))
    assert ds.vocab_size <= 256 and ds.index["documents"] >= 2
    assert sum(len(t) for t in ds.train) > 1000 and ds.index["eos_id"] == 1
