"""Round trip: a Hugging Face folder -> `hetpp train --init-from` 10 steps on three pipelines of
different shapes -> `hetpp export` -> transformers loads it, and its loss on a fixed batch (the
held-out samples) equals hetpp's final validation loss on that batch (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch
from disthelpers import cluster, pipeline, train
from hfmodels import make_hf_model, transformers

from hetpp.cli.main import main
from hetpp.runtime import checkpoint
from hetpp.runtime.data import SyntheticTokens, batch, validation_batch
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.specs import Plan
from hetpp.specs.presets import load_model_config

pytestmark = pytest.mark.dist
SEQ = 12


def _hf_loss(model, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    with torch.no_grad():
        logits = model(inputs).logits
    return (token_loss_sum(logits, targets) / targets.numel()).item()


def test_hf_folder_trains_exports_and_loads_back(tmp_path):
    src = tmp_path / "hf-in"
    original = make_hf_model("llama", src).eval()
    c = load_model_config(src)  # 3 blocks: layers 0..4
    pipes = [
        pipeline([0, 1, 2], [0, 2, 4, 5], 1, 3),
        pipeline([3, 4], [0, 3, 5], 2, 2),
        pipeline([5], [0, 5], 1, 2),
    ]
    plan = Plan(global_batch=9, seq_len=SEQ, precision="fp32", pipelines=tuple(pipes), model=c,
                cluster=cluster())  # fmt: skip
    ckpt = tmp_path / "ckpt"
    kw = dict(steps=10, init_from=str(src), checkpoint_dir=str(ckpt), eval_every=10)
    results = train(plan.validate_plan(), tmp_path, **kw)
    records = results[0].records
    # Step 1 started from the folder's weights: its loss is transformers' on the same batch.
    source = SyntheticTokens(c.vocab_size, SEQ, seed=0)
    inputs, targets = batch(source, 0, 9)
    assert abs(records[0].loss - _hf_loss(original, inputs, targets)) <= 1e-5
    assert records[-1].loss < records[0].loss

    out = tmp_path / "hf-out"
    (src / "tokenizer.json").write_text("{}")  # stands for the folder's tokenizer
    argv = ["export", "--checkpoint-dir", str(ckpt), "--hf", str(out), "--tokenizer-from", str(src)]
    assert main(argv) == 0
    assert (out / "tokenizer.json").read_text() == "{}"
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hetpp = StageModule(c, 0, c.num_layers + 2, seed=1, dtype=torch.float32)
    checkpoint.load(checkpoint.latest(ckpt), hetpp, torch.optim.SGD(hetpp.parameters(), lr=0.0))
    # The fixed batch: the held-out samples the run's final validation evaluated, pipelined.
    rows = validation_batch(None, plan, seed=0, count=plan.global_batch)
    fixed_in, fixed_tgt = rows[:, :-1], rows[:, 1:]
    theirs = _hf_loss(exported, fixed_in, fixed_tgt)
    assert abs(records[-1].val_loss - theirs) <= 1e-5
    with torch.no_grad():  # and hetpp's layers on the final checkpoint, in one process
        ours = (token_loss_sum(hetpp(fixed_in), fixed_tgt) / fixed_tgt.numel()).item()
    assert abs(ours - theirs) <= 1e-5
    assert abs(theirs - _hf_loss(original, fixed_in, fixed_tgt)) > 1e-3  # the weights did train
