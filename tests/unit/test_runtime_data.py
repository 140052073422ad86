"""Deterministic data: sample g is fixed whatever the plan; each step uses each sample once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetpp.runtime.data import SyntheticTokens, batch, file_tokens, pipeline_slices
from hetpp.specs import PRESETS, PipelinePlan, Plan, SpecError, StagePlan


def _plan(shares: list[tuple[int, int]]) -> Plan:
    """One single-stage pipeline per (micro_batch_size, num_micro_batches)."""
    pipes = tuple(
        PipelinePlan(
            stages=(StagePlan(devices=(i,), layers=(0, 6)),),
            micro_batch_size=mbs,
            num_micro_batches=m,
        )
        for i, (mbs, m) in enumerate(shares)
    )
    return Plan(
        global_batch=sum(a * b for a, b in shares),
        seq_len=8,
        pipelines=pipes,
        model=PRESETS["tiny-gpt"],
    ).validate_plan()


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=5),
    st.integers(0, 5),
)
def test_every_sample_is_used_exactly_once_per_step(shares, step):
    plan = _plan(shares)
    source = SyntheticTokens(256, plan.seq_len, seed=1)
    first = step * plan.global_batch
    used = []
    for p, (a, b) in enumerate(pipeline_slices(plan)):
        assert b - a == plan.pipelines[p].batch
        inputs, targets = batch(source, first + a, b - a)  # what pipeline p's stages load
        used += [first + a + i for i in range(b - a)]
        whole_in, whole_tg = batch(source, first, plan.global_batch)
        assert torch.equal(inputs, whole_in[a:b]) and torch.equal(targets, whole_tg[a:b])
    assert sorted(used) == list(range(first, first + plan.global_batch))  # once each, none missing


def test_synthetic_samples_are_fixed_and_distinct():
    a, b = SyntheticTokens(256, 16, seed=0), SyntheticTokens(256, 16, seed=0)
    assert torch.equal(a.sample(7), b.sample(7))
    assert not torch.equal(a.sample(7), a.sample(8))
    assert not torch.equal(a.sample(7), SyntheticTokens(256, 16, seed=1).sample(7))
    s = a.sample(3)
    assert s.shape == (17,) and s.dtype == torch.int64 and int(s.min()) >= 0 and int(s.max()) < 256
    inputs, targets = batch(a, 0, 2)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the inputs shifted by one


def test_text_files_are_bytes_and_bin_files_uint16(tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(40)))
    src = file_tokens(text, seq_len=8, vocab_size=256)
    assert src.sample(0).tolist() == list(range(9))
    assert src.sample(1).tolist() == list(range(8, 17))
    assert src.sample(4).tolist() == list(range(0, 9))  # wraps around: 4 * 8 mod (40 - 8) = 0
    binary = tmp_path / "t.bin"
    np.arange(100, 120, dtype=np.uint16).tofile(binary)
    assert file_tokens(binary, seq_len=4, vocab_size=200).sample(1).tolist() == [
        104,
        105,
        106,
        107,
        108,
    ]
    with pytest.raises(SpecError, match="outside the model's vocabulary"):
        file_tokens(binary, seq_len=4, vocab_size=110)
    with pytest.raises(SpecError, match="need at least"):
        file_tokens(binary, seq_len=40, vocab_size=200)
    with pytest.raises(SpecError, match="file not found"):
        file_tokens(tmp_path / "nope.txt", seq_len=4, vocab_size=256)
