"""Simulation results: the step's times, per-device utilisation and memory, as plain data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hetpp.sim.trace import BACKWARD, COMPUTE, Kind, Trace


@dataclass(frozen=True)
class DeviceStats:
    """One rank (device) over one simulated step."""

    device: int
    gpu: str
    """GPU type name."""
    pipeline: int
    stage: int
    layers: tuple[int, int]
    compute_s: float
    """Seconds in forward, backward and optimizer."""
    sync_s: float
    """Seconds inside gradient all-reduces, on the rank's communication stream (waiting for the
    other owners is idle time). A bucket's all-reduce may overlap the rank's compute (a chunk
    finished before the device's others), so busy, sync and idle shares can overlap too."""
    iteration_s: float
    """The step's length, the denominator of the fractions."""
    max_in_flight: int
    """Most micro-batches whose activations the device held at once."""
    peak_memory_bytes: float
    """Model states + reserve + buffers + the peak of activations actually held in the replay."""
    memory_capacity_bytes: float

    @property
    def busy_fraction(self) -> float:
        return self.compute_s / self.iteration_s

    @property
    def sync_fraction(self) -> float:
        return self.sync_s / self.iteration_s

    @property
    def idle_fraction(self) -> float:
        return max(0.0, 1.0 - self.busy_fraction - self.sync_fraction)

    @property
    def fits(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "gpu": self.gpu,
            "pipeline": self.pipeline,
            "stage": self.stage,
            "layers": list(self.layers),
            "busy_fraction": self.busy_fraction,
            "sync_fraction": self.sync_fraction,
            "idle_fraction": self.idle_fraction,
            "max_in_flight": self.max_in_flight,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits_memory": self.fits,
        }


@dataclass(frozen=True)
class SimResult:
    """One simulated training step of a plan."""

    schedule: str
    global_batch: int
    iteration_time_s: float
    """First forward to the last optimizer step."""
    pipeline_time_s: tuple[float, ...]
    """Per pipeline: first forward to its last backward."""
    exposed_sync_s: float
    """How far gradient all-reduces run past the slowest pipeline's last backward."""
    bubble_fraction: float
    """Share of device time, up to the slowest pipeline's last backward, not spent in forward or
    backward: pipeline fill/drain, waits for transfers, and data imbalance between pipelines."""
    devices: tuple[DeviceStats, ...]
    """In program order: pipeline by pipeline, stage by stage."""
    trace: Trace

    @property
    def throughput_samples_per_s(self) -> float:
        return self.global_batch / self.iteration_time_s

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (without the trace)."""
        return {
            "schedule": self.schedule,
            "iteration_time_s": self.iteration_time_s,
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "pipeline_time_s": list(self.pipeline_time_s),
            "bubble_fraction": self.bubble_fraction,
            "exposed_sync_s": self.exposed_sync_s,
            "fits_memory": self.fits,
            "devices": [d.to_dict() for d in self.devices],
        }


def step_times(
    trace: Trace, pipeline_of_rank: list[int], num_pipelines: int
) -> tuple[float, tuple[float, ...], float, float]:
    """(iteration, per-pipeline time, exposed sync, bubble fraction) of a trace."""
    last_b = trace.last_end_per_rank(BACKWARD)
    # a pipeline's time runs from its first forward (after the barrier's optimizer step and
    # all-gathers where a sharded program starts with them) to its last backward
    first_f = trace.first_start_per_rank((Kind.F,))
    ends, starts = [0.0] * num_pipelines, [np.inf] * num_pipelines
    for r, p in enumerate(pipeline_of_rank):
        ends[p] = max(ends[p], float(last_b[r]))
        starts[p] = min(starts[p], float(first_f[r]))
    pipes = [e - s for s, e in zip(starts, ends)]
    compute_end = max(ends)
    sync_end = float(trace.last_end_per_rank((Kind.SYNC,)).max(initial=0.0))
    fb = float(trace.time_per_rank(COMPUTE).sum())
    bubble = 1.0 - fb / (trace.num_ranks * compute_end) if compute_end > 0 else 0.0
    iteration = float(
        trace.last_end_per_rank((*COMPUTE, Kind.SYNC, Kind.OPT, Kind.GATHER)).max(initial=0.0)
    )
    return iteration, tuple(pipes), max(0.0, sync_end - compute_end), bubble
