"""Per-step metrics: the JSONL log reads back, and the summary takes steady-state medians."""

from __future__ import annotations

from hetpp.runtime.metrics import (
    MetricsLog,
    StepMetrics,
    load_metrics,
    pack_step,
    summarize,
    unpack_step,
)


def _step(step: int, step_s: float, loss: float) -> StepMetrics:
    return StepMetrics(
        step=step,
        loss=loss,
        step_s=step_s,
        samples_per_s=8 / step_s,
        tokens_per_s=128 / step_s,
        grad_norm=None,
        compute_s=(step_s, 0.5 * step_s),
        wait_s=(0.0, 0.4 * step_s),
        comm_s=(0.1, 0.1),
    )


def test_log_round_trip_and_summary(tmp_path):
    path = tmp_path / "m.jsonl"
    log = MetricsLog(path, append=False)
    for i, t in enumerate([5.0, 1.0, 2.0, 3.0]):
        log.add(_step(i + 1, t, loss=10 - i))
    log.close()
    records = load_metrics(path)
    assert records == log.records
    s = summarize(records)
    # The first step (one-off set-up) is left out: medians of 1, 2, 3.
    assert s["steps"] == 4 and s["final_loss"] == 7
    assert s["step_time_s"] == 2.0 and s["samples_per_s"] == 4.0 and s["tokens_per_s"] == 64.0
    assert s["compute_s"] == [2.0, 1.0] and s["comm_s"] == [0.1, 0.1]
    assert summarize(records[:1])["step_time_s"] == 5.0


def test_a_resumed_run_appends(tmp_path):
    path = tmp_path / "m.jsonl"
    for append, steps in ((False, [1, 2]), (True, [3])):
        log = MetricsLog(path, append=append)
        for s in steps:
            log.add(_step(s, 1.0, 1.0))
        log.close()
    assert [r.step for r in load_metrics(path)] == [1, 2, 3]


def test_packed_step_vectors_sum_to_the_step_metrics():
    # Two ranks each pack their loss share and (compute, wait, comm, total) seconds; the
    # all-reduce sums the vectors; unpack reads the step back.
    a = pack_step(1.5, [0.2, 0.1, 0.05, 0.4], rank=0, world=2)
    b = pack_step(0.5, [0.3, 0.0, 0.1, 0.5], rank=1, world=2)
    m = unpack_step(7, [x + y for x, y in zip(a, b)], global_batch=8, seq_len=16, grad_norm=None)
    assert (m.step, m.loss, m.step_s, m.samples_per_s, m.tokens_per_s) == (7, 2.0, 0.5, 16, 256)
    assert m.compute_s == (0.2, 0.3) and m.wait_s == (0.1, 0.0) and m.comm_s == (0.05, 0.1)
