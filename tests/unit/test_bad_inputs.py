"""Every malformed or inconsistent input file ends in one clear message and exit code 2.

Each case is a file, the command that reads it, and the words the message must contain (the
field and what was expected). The file's path must appear too, and no traceback.
"""

from __future__ import annotations

import json

import pytest

from hetpp.cli.main import main
from hetpp.specs import PRESETS, Cluster, Plan
from hetpp.specs.plan import V1_TRAIN_FIELDS

GOOD_NODES = "nodes:\n  - {gpu: A100-80GB, gpus_per_node: 2, intra_node_GBps: 300}\n"
CLUSTER_CASES = {
    "unknown-gpu": ("nodes:\n  - {gpu: B300, gpus_per_node: 2, intra_node_GBps: 300}\n"
                    "inter_node_GBps: 10\n", "unknown GPU type 'B300'"),
    "negative-count": ("nodes:\n  - {gpu: T4, gpus_per_node: 2, count: -1, intra_node_GBps: 16}\n"
                       "inter_node_GBps: 10\n", "nodes[0].count"),
    "zero-gpus": ("nodes:\n  - {gpu: T4, gpus_per_node: 0, intra_node_GBps: 16}\n"
                  "inter_node_GBps: 10\n", "nodes[0].gpus_per_node"),
    "missing-nodes": ("inter_node_GBps: 10\n", "nodes: required field is missing"),
    "missing-inter": (GOOD_NODES, "inter_node_GBps: required field is missing"),
    "empty-nodes": ("nodes: []\ninter_node_GBps: 10\n", "nodes"),
    "misspelled": ("nodes:\n  - {gpu: T4, gpus_per_nod: 2, intra_node_GBps: 16}\n"
                   "inter_node_GBps: 10\n", "nodes[0].gpus_per_nod: unknown field"),
    "memory-in-bytes": ("gpu_types:\n  - {name: X, bf16_tflops: 100, memory_gb: 80000000000, "
                        "mem_bw_GBps: 900}\n" + GOOD_NODES + "inter_node_GBps: 10\n",
                        "gpu_types[0].memory_gb"),
    "flops-not-tflops": ("gpu_types:\n  - {name: X, bf16_tflops: 3.12e14, memory_gb: 80, "
                         "mem_bw_GBps: 900}\n" + GOOD_NODES + "inter_node_GBps: 10\n",
                         "gpu_types[0].bf16_tflops"),
    "bandwidth-string": (GOOD_NODES + "inter_node_GBps: 100Gbps\n", "inter_node_GBps"),
    "not-a-mapping": ("- a\n- b\n", "expected a mapping"),
    "yaml-syntax": ("nodes: [\n", "cannot parse"),
    "type-missing-field": ("gpu_types:\n  - {name: X, memory_gb: 80, mem_bw_GBps: 900}\n"
                           + GOOD_NODES + "inter_node_GBps: 10\n", "gpu_types[0].bf16_tflops"),
    "negative-latency": (GOOD_NODES + "inter_node_GBps: 10\ninter_node_latency_us: -3\n",
                         "inter_node_latency_us"),
    "fractional-count": ("nodes:\n  - {gpu: T4, gpus_per_node: 2, count: 1.5, "
                         "intra_node_GBps: 16}\ninter_node_GBps: 10\n", "nodes[0].count"),
    "zero-intra": ("nodes:\n  - {gpu: T4, gpus_per_node: 2, intra_node_GBps: 0}\n"
                   "inter_node_GBps: 10\n", "nodes[0].intra_node_GBps"),
}  # fmt: skip

MODEL_CASES = {
    "hf-unsupported.json": ('{"model_type": "t5"}', "unsupported model_type 't5'"),
    "hf-missing-hidden.json": (json.dumps({"model_type": "llama", "vocab_size": 32000,
                               "num_hidden_layers": 2, "num_attention_heads": 4,
                               "intermediate_size": 64}), "hidden_size"),
    "hf-syntax.json": ('{"model_type": "llama",', "cannot parse"),
    "heads-not-dividing.yaml": ("family: gpt\nvocab_size: 100\nhidden_size: 10\nnum_layers: 2\n"
                                "num_heads: 3\nffn_hidden_size: 40\n",
                                "hidden_size must be a multiple of num_heads"),
    "negative-layers.yaml": ("family: llama\nvocab_size: 100\nhidden_size: 16\nnum_layers: -2\n"
                             "num_heads: 2\nffn_hidden_size: 40\n", "num_layers"),
    "unknown-family.yaml": ("family: rwkv\nvocab_size: 100\nhidden_size: 16\nnum_layers: 2\n"
                            "num_heads: 2\nffn_hidden_size: 40\n", "family"),
}  # fmt: skip

PROFILE_CASES = {
    "missing-column.csv": ("gpu,model,seq_len,layer,mbs,fwd_s,bwd_s\nT4,m,64,block,1,1,2\n",
                           "missing columns ['act_bytes']"),
    "bad-layer.csv": ("gpu,model,seq_len,layer,mbs,fwd_s,bwd_s,act_bytes\nT4,m,64,mlp,1,1,2,3\n",
                      "line 2: layer 'mlp'"),
    "not-a-number.csv": ("gpu,model,seq_len,layer,mbs,fwd_s,bwd_s,act_bytes\n"
                         "T4,m,64,block,1,fast,2,3\n", "line 2: bad value"),
    "negative-time.csv": ("gpu,model,seq_len,layer,mbs,fwd_s,bwd_s,act_bytes\n"
                          "T4,m,64,block,1,-1,2,3\n", "line 2"),
}  # fmt: skip


def _cluster() -> Cluster:
    nodes = [{"gpu": "A100-80GB", "gpus_per_node": 2, "intra_node_GBps": 300},
             {"gpu": "T4", "gpus_per_node": 2, "intra_node_GBps": 16}]  # fmt: skip
    return Cluster.model_validate({"name": "two", "nodes": nodes, "inter_node_GBps": 10})


def _plan_dict(**over) -> dict:
    plan = Plan(global_batch=4, seq_len=32, model=PRESETS["tiny-gpt"], cluster=_cluster(),
                pipelines=[{"stages": [{"devices": [0], "layers": [0, 3]},
                                       {"devices": [1], "layers": [3, 6]}],
                            "micro_batch_size": 1, "num_micro_batches": 4}])  # fmt: skip
    d = json.loads(plan.to_json())
    for key, value in over.items():
        (d["train"] if key in V1_TRAIN_FIELDS else d)[key] = value
    return d


def _pipe(stages, mbs=1, m=4):
    return {"stages": [{"devices": [d], "layers": r} for d, r in stages],
            "micro_batch_size": mbs, "num_micro_batches": m}  # fmt: skip


PLAN_CASES = {
    "layer-gap": (_plan_dict(pipelines=[_pipe([(0, [0, 3]), (1, [4, 6])])]),
                  "pipelines[0].stages[1].layers"),
    "overlapping-devices": (_plan_dict(global_batch=8, pipelines=[_pipe([(0, [0, 6])]),
                                                                  _pipe([(0, [0, 6])])]),
                            "device 0 is already used"),
    "device-out-of-range": (_plan_dict(pipelines=[_pipe([(7, [0, 6])])]),
                            "device 7 does not exist"),
    "batch-mismatch": (_plan_dict(global_batch=5), "expected global_batch = 5"),
    "missing-pipelines": ({k: v for k, v in _plan_dict().items() if k != "pipelines"},
                          "pipelines: required field is missing"),
    "too-few-micro-batches": (_plan_dict(global_batch=1, pipelines=[
        _pipe([(0, [0, 3]), (1, [3, 6])], m=1)]), "1F1B needs num_micro_batches >= stages"),
    "wrong-version": (_plan_dict(version=7), "version"),
    "fp32-negative-optimizer-bytes": (_plan_dict(precision="fp32", optimizer_bytes_per_param=-1),
                                      "train.optimizer_bytes_per_param"),
    "negative-mbs": (_plan_dict(pipelines=[_pipe([(0, [0, 6])], mbs=-1)]),
                     "pipelines[0].micro_batch_size"),
    "bad-grad-blocks": (_plan_dict(grad_blocks=[{"layers": [0, 6], "owners": [0]}]),
                        "grad_blocks: does not match"),
    "unknown-schedule": (_plan_dict(schedule="zb-v"), "schedule"),
    "unknown-field": (_plan_dict(stragety="hpp"), "stragety: unknown field"),
    "empty-stage-devices": (_plan_dict(pipelines=[{"stages": [{"devices": [], "layers": [0, 6]}],
                                                   "micro_batch_size": 1, "num_micro_batches": 4}]),
                            "pipelines[0].stages[0].devices"),
    "seq-beyond-model": (_plan_dict(seq_len=4096), "seq_len: 4096 exceeds"),
}  # fmt: skip


def _run(argv, capsys) -> tuple[int, str]:
    rc = main(argv)
    err = capsys.readouterr().err
    return rc, err


def _assert_clear(rc: int, err: str, path: str, words: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    assert path in err and words in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", CLUSTER_CASES)
def test_bad_cluster_file(name, tmp_path, capsys):
    text, words = CLUSTER_CASES[name]
    f = tmp_path / f"{name}.yaml"
    f.write_text(text)
    _assert_clear(*_run(["check", "--cluster", str(f)], capsys), str(f), words)


@pytest.mark.parametrize("name", MODEL_CASES)
def test_bad_model_file(name, tmp_path, capsys):
    text, words = MODEL_CASES[name]
    f = tmp_path / name
    f.write_text(text)
    _assert_clear(*_run(["check", "--model", str(f)], capsys), str(f), words)


def test_unknown_preset_lists_presets(capsys):
    rc, err = _run(["check", "--model", "gpt5-1t"], capsys)
    _assert_clear(rc, err, "gpt5-1t", "presets: gpt3-350m")


def test_seq_len_beyond_preset(capsys):
    rc, err = _run(["check", "--model", "gpt3-1.3b", "--seq-len", "8192"], capsys)
    assert rc == 2 and "seq_len: seq_len 8192 exceeds the model's max_seq_len 2048" in err


@pytest.mark.parametrize("name", PROFILE_CASES)
def test_bad_profile_file(name, tmp_path, capsys):
    text, words = PROFILE_CASES[name]
    f = tmp_path / name
    f.write_text(text)
    _assert_clear(*_run(["check", "--profile", str(f)], capsys), str(f), words)


@pytest.mark.parametrize("name", PLAN_CASES)
def test_bad_plan_file(name, tmp_path, capsys):
    data, words = PLAN_CASES[name]
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(data))
    _assert_clear(*_run(["estimate", str(f)], capsys), str(f), words)


def test_plan_for_another_cluster(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(_plan_dict()))
    other = tmp_path / "other.yaml"
    other.write_text("name: other\n" + GOOD_NODES + "inter_node_GBps: 10\n")
    rc, err = _run(["check", "--plan", str(plan), "--cluster", str(other)], capsys)
    _assert_clear(rc, err, str(plan), "cluster: the plan was made for cluster 'two'")


def test_missing_file(tmp_path, capsys):
    f = tmp_path / "nope.yaml"
    _assert_clear(*_run(["check", "--cluster", str(f)], capsys), str(f), "file not found")


def test_case_count():
    n = len(CLUSTER_CASES) + len(MODEL_CASES) + len(PROFILE_CASES) + len(PLAN_CASES) + 4
    assert n >= 30
