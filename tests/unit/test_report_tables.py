"""The estimate summary names the devices that overfill, stage by stage or summed."""

from __future__ import annotations

from types import SimpleNamespace

from hetpp.cost.memory import StageMemory
from hetpp.report.tables import summary_lines


def _stage(device: int, gb: float, capacity_gb: float = 10.0) -> SimpleNamespace:
    memory = StageMemory(gb * 1e9, 0, 0, 0, 0, 0, 0)
    return SimpleNamespace(device=device, memory=memory, capacity_bytes=capacity_gb * 1e9)


def test_a_device_overfilled_by_two_stages_that_fit_alone_is_named():
    # device 3 runs both chunks of a V (6 + 6 GB of 10), device 1 one stage that fits
    stages = [_stage(3, 6.0), _stage(1, 4.0), _stage(3, 6.0)]
    step = SimpleNamespace(
        stages=stages, pipeline_time_s=(1.0,), iteration_time_s=1.0, exposed_sync_s=0.0,
        optimizer_s=0.0, throughput_samples_per_s=1.0, fits=False,
    )  # fmt: skip
    assert summary_lines(step, [(1, 1)])[-1] == "[red]memory exceeded on device(s) [3][/red]"
