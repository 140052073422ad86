"""Per-step metrics: the JSONL log reads back, and the summary takes steady-state medians."""

from __future__ import annotations

from hetpp.runtime.metrics import MetricsLog, StepMetrics, load_metrics, summarize


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
