"""`bench/schedule_trials.py`: the replay of the schedule pass on a benchmark row's plan."""

from __future__ import annotations

import re

import pytest
from bench_modules import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("schedule_trials")


def test_a_half_block_plan_is_replayed_with_each_overfilled_trials_memory(bench, capsys):
    # mixed-8 gpt3-13b: hpp's plan is 1F1B cut at half blocks (82 layers); replayed on the
    # block-unit problem its cuts ran past the layer list. Every trial there overfills the
    # RTX 4090s; each says by how much, what it would take, and what its pipeline needs.
    (row,) = [s for s in bench.scenarios(False) if (s[0].stem, s[1]) == ("mixed-8", "gpt3-13b")]
    bench.report(*row)
    out = capsys.readouterr().out
    step_s = float(re.search(r"recompute False: ([0-9.]+) s, fits True", out).group(1))
    assert "(57, 63)" in out.split("layers ")[1]  # a half-unit cut: the plan as it was costed
    trials = re.findall(r"^    (\S+): (.*)$", out, re.M)
    assert {name for name, _ in trials} >= {"zbh1/1", "zbv/2", "dualpipev/2"}
    assert "refused" not in out
    for name, verdict in trials:
        got = re.search(r"RTX-4090\) ([0-9.]+)x .* ([0-9.]+) s if it fitted; its pipelines "
                        r"need ([0-9]+) of ([0-9]+) GB", verdict)  # fmt: skip
        assert got, (name, verdict)
        assert float(got.group(1)) > 1.0
        assert int(got.group(4)) == 4 * 80 + 4 * 24  # the pipeline's eight devices
    zbh1 = dict(trials)["zbh1/1"]
    assert float(re.search(r"([0-9.]+) s if it fitted", zbh1).group(1)) < 0.97 * step_s
