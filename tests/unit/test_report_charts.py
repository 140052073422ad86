"""PNG charts render (and stay out of the import path of everything else)."""

import subprocess
import sys

import simcases

from hetpp.report.charts import comparison_chart, gantt_chart, predicted_vs_measured_chart
from hetpp.sim import simulate_plan

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path, min_bytes=10_000):
    data = path.read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > min_bytes


def test_gantt_of_two_pipelines(tmp_path):
    plan = simcases.plan([([(0, (0, 6))], 4), ([(2, (0, 3)), (3, (3, 6))], 4)])
    res = simulate_plan(plan, simcases.cost_model(plan))
    out = gantt_chart(res, tmp_path / "sub" / "gantt.png", title="two pipelines")
    assert _is_png(out)


def test_gantt_beyond_64_devices_is_summarised_per_gpu_type(tmp_path):
    # 40 Fast + 40 Slow one-stage pipelines: 80 devices, one panel per GPU type.
    cluster = simcases.cluster(gpus_per_node=8, nodes=5)
    plan = simcases.plan([([(d, (0, 6))], 2) for d in range(80)], on=cluster)
    res = simulate_plan(plan, simcases.cost_model(plan))
    assert len(res.devices) == 80
    assert _is_png(gantt_chart(res, tmp_path / "big.png"))


def test_comparison_and_prediction_charts(tmp_path):
    entries = [
        {"strategy": "uniform", "feasible": True, "throughput_samples_per_s": 10.0,
         "iteration_time_s": 6.4},
        {"strategy": "layer-balanced", "feasible": False, "throughput_samples_per_s": None,
         "iteration_time_s": None},
        {"strategy": "hpp", "feasible": True, "throughput_samples_per_s": 17.5,
         "iteration_time_s": 3.66},
    ]  # fmt: skip
    assert _is_png(comparison_chart(entries, tmp_path / "cmp.png"))
    rows = [
        {"strategy": "uniform", "predicted_step_s": 1.2, "measured_step_s": 1.3},
        {"strategy": "hpp", "predicted_step_s": 0.8, "measured_step_s": 0.82},
    ]
    assert _is_png(predicted_vs_measured_chart(rows, tmp_path / "pvm.png"))


def test_reports_import_neither_torch_nor_matplotlib_up_front():
    code = (
        "import sys, hetpp.report.charts, hetpp.report.sim_tables, hetpp.cli.simulate\n"
        "print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
