"""Hostile inputs for every file format and command (imported by test_hostile_*.py).

A case is a name, the files it writes (name -> bytes or text), the command line ({name} is
replaced by that file's path), and the words the one-line error must contain. Every file named
on the command line must appear in the message too.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from hetpp.specs import PRESETS, Cluster, Plan


class Case(NamedTuple):
    files: dict[str, str | bytes]
    argv: list[str]
    words: tuple[str, ...]


GOOD_CLUSTER = (
    "name: two\n"
    "nodes:\n"
    "  - {gpu: A100-80GB, gpus_per_node: 2, intra_node_GBps: 300}\n"
    "  - {gpu: T4, gpus_per_node: 2, intra_node_GBps: 16}\n"
    "inter_node_GBps: 10\n"
)
GOOD_MODEL = (
    "family: gpt\nvocab_size: 256\nhidden_size: 64\nnum_layers: 4\nnum_heads: 4\n"
    "ffn_hidden_size: 256\nmax_seq_len: 128\n"
)
PROFILE_HEADER = "gpu,model,seq_len,layer,mbs,fwd_s,bwd_s,act_bytes\n"


def good_plan() -> dict:
    cluster = Cluster.model_validate(
        {
            "name": "two",
            "nodes": [
                {"gpu": "A100-80GB", "gpus_per_node": 2, "intra_node_GBps": 300},
                {"gpu": "T4", "gpus_per_node": 2, "intra_node_GBps": 16},
            ],
            "inter_node_GBps": 10,
        }
    )
    plan = Plan(
        global_batch=4,
        seq_len=32,
        model=PRESETS["tiny-gpt"],
        cluster=cluster,
        pipelines=[
            {
                "stages": [{"devices": [0], "layers": [0, 3]}, {"devices": [1], "layers": [3, 6]}],
                "micro_batch_size": 1,
                "num_micro_batches": 4,
            }
        ],
    )
    return json.loads(plan.to_json())


def _plan_with(**over) -> str:
    d = good_plan()
    for path, value in over.items():
        *keys, last = path.split("__")
        node = d
        for k in keys:
            node = node[int(k)] if k.isdigit() else node[k]
        node[last] = value
    return json.dumps(d)


def _nested(depth: int, json_text: bool) -> str:
    return ("[" * depth + "]" * depth) if json_text else "a: " + "[" * depth + "]" * depth


BOMB = "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" if p else f"{c}: &{c} [x, x, x, x, x, x, x, x, x]\n"
    for p, c in zip([None, *"abcdefg"], "abcdefgh")
)

# --- structure and encoding, for every reader (cluster YAML, model YAML, HF JSON, plan JSON) ---
STRUCTURE = {
    "empty": ("", "expected a mapping"),
    "scalar": ("42\n", "expected a mapping"),
    "list": ("- a\n- b\n", "expected a mapping"),
    "nul-bytes": (b"nodes: []\x00\x00", "NUL bytes"),
    "utf16": ("nodes: []\n".encode("utf-16"), "NUL bytes"),
    "latin1": ("name: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    "random-binary": (bytes(range(128, 256)) * 4, "not UTF-8"),
    "deep-nesting": (_nested(5000, False), "nested deeper than 64"),
    "nesting-65": (_nested(65, False), "nested deeper than 64"),
    "alias-bomb": (BOMB, "above the limit of 1,000,000"),
    "recursive-alias": ("a: &a [*a]\n", "an alias refers to itself"),
    "duplicate-top-key": (GOOD_CLUSTER + "inter_node_GBps: 20\n", "inter_node_GBps: duplicate key"),
    "unclosed-bracket": ("nodes: [\n", "cannot parse"),
    "tab-indent": ("nodes:\n\t- a\n", "cannot parse"),
    "python-tag": ("a: !!python/object:os.system [ls]\n", "cannot parse"),
}
JSON_STRUCTURE = {
    "json-empty": ("", "cannot parse"),
    "json-scalar": ("42", "expected a mapping"),
    "json-list": ("[1, 2]", "expected a mapping"),
    "json-truncated": ('{"version": 2, "train": {', "cannot parse"),
    "json-nan": ('{"version": NaN}', "NaN is not a number JSON allows"),
    "json-infinity": ('{"version": -Infinity}', "-Infinity is not a number JSON allows"),
    "json-duplicate": ('{"version": 2, "version": 1}', "version: duplicate key"),
    "json-deep": (_nested(100_000, True), "nested deeper than 64"),
    "json-nesting-65": ('{"a": ' + _nested(64, True) + "}", "nested deeper than 64"),
    "json-utf16": ('{"version": 2}'.encode("utf-16"), "NUL bytes"),
    "json-binary": (b"\xff\xfe\xfd" * 50, "not UTF-8"),
    "json-trailing-comma": ('{"version": 2,}', "cannot parse"),
}


def _node(**over) -> str:
    fields = {"gpu": "T4", "gpus_per_node": 2, "intra_node_GBps": 16, **over}
    inner = ", ".join(f"{k}: {v}" for k, v in fields.items())
    return f"nodes:\n  - {{{inner}}}\ninter_node_GBps: 10\n"


CLUSTER_VALUES = {
    "gpus-1e9": (_node(gpus_per_node=1_000_000_000), "number of GPUs is 1,000,000,000"),
    "count-1e9": (_node(count=1_000_000_000), "above the limit of 16,384"),
    "both-large": (_node(gpus_per_node=200, count=200), "number of GPUs is 40,000"),
    "gpus-float-1e9": (_node(gpus_per_node="1e9"), "nodes[0].gpus_per_node"),
    "count-nan": (_node(count=".nan"), "nodes[0].count"),
    "intra-nan": (_node(intra_node_GBps=".nan"), "nodes[0].intra_node_GBps"),
    "intra-inf": (_node(intra_node_GBps=".inf"), "nodes[0].intra_node_GBps"),
    "intra-negative": (_node(intra_node_GBps=-1), "nodes[0].intra_node_GBps"),
    "gpu-number": (_node(gpu=123), "nodes[0].gpu"),
    "gpu-null": (_node(gpu="null"), "nodes[0].gpu"),
    "gpu-list": (_node(gpu="[T4]"), "nodes[0].gpu"),
    "count-string": (_node(count="two"), "nodes[0].count"),
    "count-bool": (_node(count="true"), "nodes[0].count"),
    "duplicate-node-key": (_node(gpu="T4, gpu: A100-80GB"), "nodes[0].gpu: duplicate key"),
    "inter-nan": (GOOD_CLUSTER.replace("inter_node_GBps: 10", "inter_node_GBps: .nan"),
                  "inter_node_GBps"),
    "latency-inf": (GOOD_CLUSTER + "inter_node_latency_us: .inf\n", "inter_node_latency_us"),
    "latency-nan": (GOOD_CLUSTER + "intra_node_latency_us: .nan\n", "intra_node_latency_us"),
    "nodes-mapping": ("nodes: {gpu: T4}\ninter_node_GBps: 10\n", "nodes"),
    "nodes-string": ("nodes: T4\ninter_node_GBps: 10\n", "nodes"),
    "type-tflops-nan": ("gpu_types:\n  - {name: X, bf16_tflops: .nan, memory_gb: 8, "
                        "mem_bw_GBps: 100}\n" + _node(gpu="X"), "gpu_types[0].bf16_tflops"),
    "type-memory-inf": ("gpu_types:\n  - {name: X, bf16_tflops: 10, memory_gb: .inf, "
                        "mem_bw_GBps: 100}\n" + _node(gpu="X"), "gpu_types[0].memory_gb"),
    "type-slowdown-nan": ("gpu_types:\n  - {name: X, bf16_tflops: 10, memory_gb: 8, "
                          "mem_bw_GBps: 100, emulate_slowdown: .nan}\n" + _node(gpu="X"),
                          "gpu_types[0].emulate_slowdown"),
    "type-slowdown-zero": ("gpu_types:\n  - {name: X, bf16_tflops: 10, memory_gb: 8, "
                           "mem_bw_GBps: 100, emulate_slowdown: 0}\n" + _node(gpu="X"),
                           "gpu_types[0].emulate_slowdown"),
    "name-list": ("name: [a, b]\n" + _node(), "name"),
}  # fmt: skip


def _model(**over) -> str:
    return GOOD_MODEL + "".join(f"{k}: {v}\n" for k, v in over.items())


MODEL_VALUES = {
    "layers-1e6": (GOOD_MODEL.replace("num_layers: 4", "num_layers: 1000000"), "num_layers"),
    "layers-zero": (GOOD_MODEL.replace("num_layers: 4", "num_layers: 0"), "num_layers"),
    "hidden-string": (GOOD_MODEL.replace("hidden_size: 64", "hidden_size: big"), "hidden_size"),
    "rope-nan": (_model(rope_theta=".nan"), "rope_theta"),
    "eps-inf": (_model(norm_eps=".inf"), "norm_eps"),
    "kv-not-dividing": (_model(num_kv_heads=3), "num_heads must be a multiple of num_kv_heads"),
    "duplicate-field": (_model(vocab_size=512), "vocab_size: duplicate key"),
    "unknown-field": (_model(num_expert=8), "num_expert: unknown field"),
    "family-number": (GOOD_MODEL.replace("family: gpt", "family: 7"), "family"),
    "max-seq-negative": (GOOD_MODEL.replace("max_seq_len: 128", "max_seq_len: -1"), "max_seq_len"),
}

HF_FILES = {
    "hf-duplicate.json": ('{"model_type": "llama", "model_type": "gpt2"}', "duplicate key"),
    "hf-nan.json": ('{"model_type": "llama", "rope_theta": NaN}', "NaN is not a number"),
    "hf-utf16.json": ('{"model_type": "llama"}'.encode("utf-16"), "NUL bytes"),
    "hf-layers-1e6.json": (json.dumps({"model_type": "llama", "vocab_size": 100,
                           "hidden_size": 16, "num_hidden_layers": 1_000_000,
                           "num_attention_heads": 2, "intermediate_size": 32}), "num_layers"),
}  # fmt: skip

PLAN_VALUES = {
    "batch-1e17": (_plan_with(train__global_batch=10**17), "train.global_batch"),
    "mbs-nan-json": (_plan_with().replace('"micro_batch_size": 1', '"micro_batch_size": NaN'),
                     "NaN is not a number"),
    "m-string": (_plan_with(pipelines__0__num_micro_batches="four"),
                 "pipelines[0].num_micro_batches"),
    "reserve-negative": (_plan_with(train__reserve_gb=-1), "train.reserve_gb"),
    "optimizer-bytes-negative": (_plan_with(train__optimizer_bytes_per_param=-1),
                                 "train.optimizer_bytes_per_param"),
    "seq-zero": (_plan_with(train__seq_len=0), "train.seq_len"),
    "layers-reversed": (_plan_with(pipelines__0__stages__1__layers=[6, 3]),
                        "pipelines[0].stages[1].layers"),
    "layers-negative": (_plan_with(pipelines__0__stages__0__layers=[-1, 3]),
                        "pipelines[0].stages[0].layers"),
    "two-devices-stage": (_plan_with(pipelines__0__stages__0__devices=[0, 2]),
                          "pipelines[0].stages[0].devices"),
    "device-string": (_plan_with(pipelines__0__stages__0__devices=["zero"]),
                      "pipelines[0].stages[0].devices"),
    "model-layers-1e6": (_plan_with(model__num_layers=1_000_000), "model.num_layers"),
    "cluster-count-1e9": (_plan_with(cluster__nodes__0__count=1_000_000_000),
                          "number of GPUs is 2,000,000,002"),
    "pipelines-empty": (_plan_with(pipelines=[]), "pipelines"),
    "pipelines-mapping": (_plan_with(pipelines={"a": 1}), "pipelines"),
    "train-missing": (json.dumps({k: v for k, v in good_plan().items() if k != "train"}),
                      "train: required field is missing"),
    "version-string": (_plan_with(version="two"), "version"),
    "estimate-nan": (_plan_with(estimate={"iteration_time_s": "nan", "throughput_samples_per_s": 1,
                                          "pipeline_time_s": [1]}), "estimate.iteration_time_s"),
}  # fmt: skip


def many_devices_plan(devices: int) -> str:
    d = good_plan()
    d["cluster"]["nodes"] = [
        {"gpu": "T4", "gpus_per_node": 8, "count": 2000, "intra_node_GBps": 16}
    ]
    d["train"]["global_batch"] = devices
    d["pipelines"] = [
        {"stages": [{"devices": [i], "layers": [0, 6]}], "micro_batch_size": 1,
         "num_micro_batches": 1}
        for i in range(devices)
    ]  # fmt: skip
    return json.dumps(d)


def _long_pipeline_plan(m: int) -> str:
    d = good_plan()
    d["train"]["global_batch"] = m
    d["pipelines"][0]["num_micro_batches"] = m
    return json.dumps(d)


PLAN_SIZES = {
    "plan-16385-devices": (many_devices_plan(16_385), "number of devices is 16,385"),
    "sim-10m-micro-batches": (_long_pipeline_plan(10_000_000), "forward and backward actions"),
}


def _profile(row: str) -> str:
    return PROFILE_HEADER + row + "\n"


PROFILE_VALUES = {
    "fwd-nan": (_profile("T4,m,64,block,1,nan,2,3"), "line 2"),
    "bwd-inf": (_profile("T4,m,64,block,1,1,inf,3"), "line 2"),
    "fwd-negative-inf": (_profile("T4,m,64,block,1,-inf,2,3"), "line 2"),
    "act-inf": (_profile("T4,m,64,block,1,1,2,inf"), "line 2: bad value"),
    "act-nan": (_profile("T4,m,64,block,1,1,2,nan"), "line 2: bad value"),
    "mbs-zero": (_profile("T4,m,64,block,0,1,2,3"), "line 2"),
    "mbs-float": (_profile("T4,m,64,block,1.5,1,2,3"), "line 2: bad value"),
    "seq-zero": (_profile("T4,m,0,block,1,1,2,3"), "line 2"),
    "short-row": (_profile("T4,m,64,block"), "line 2: bad value"),
    "third-row-bad": (PROFILE_HEADER + "T4,m,64,block,1,1,2,3\nT4,m,64,head,1,1,2,3\n"
                      "T4,m,64,block,2,x,2,3\n", "line 4: bad value"),
    "header-only-wrong": ("a,b,c\n", "missing columns"),
    "empty": ("", "missing columns"),
    "utf16": (_profile("T4,m,64,block,1,1,2,3").encode("utf-16"), "NUL bytes"),
    "binary": (bytes(range(128, 256)), "not UTF-8"),
    "quote-unclosed": (_profile('"T4,m,64,block,1,1,2,3'), "line"),
}  # fmt: skip
