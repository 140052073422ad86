"""Issue 12, done-when 1: hetpp's predictions beside published throughput (`bench/published.py`)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
import published


@pytest.fixture(scope="module")
def errors() -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for run in published.RUNS:
        pred = published.predicted_tokens_per_s_per_gpu(run)
        out.setdefault(run.gpu, []).append(pred / run.tokens_per_s_per_gpu - 1)
    return out


def test_a100_within_10_percent_of_at_least_four_published_runs(errors):
    assert sum(abs(e) <= 0.10 for e in errors["A100-80GB"]) >= 4


def test_h100_within_15_percent_of_most_published_runs(errors):
    h100 = errors["H100-80GB"]
    assert len(h100) >= 4 and sum(abs(e) <= 0.15 for e in h100) >= 3


def test_mpt_parameter_counts_match_the_published_tables():
    """The MPT configs reproduce the tables' NumParams (seq 2048) within 0.1%."""
    from hetpp.specs import ModelSpec

    published_params = {"mpt-1b": 1315950592, "mpt-3b": 2651837440, "mpt-7b": 6658859008}
    for run in published.RUNS:
        if run.model.name in published_params:
            n = ModelSpec(config=run.model, seq_len=2048).total_params
            assert n == pytest.approx(published_params[run.model.name], rel=1e-3)
