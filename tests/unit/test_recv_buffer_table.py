"""The receive-buffer counts the cost model charges under the multi-stage schedules
(`hetpp/data/recv_buffers.json`, read by `cost.memory.recv_buffer_counts`) are torch's: the table
rebuilt from torch's lowered IR (`bench/recv_multi.py`) equals the shipped one for pipelines of up
to 4 devices, and on 8 devices at m past the table's last row torch counts as that row. (That
the runtime's live buffers peak at those counts: tests/dist/test_dist_recv_buffers.py.)"""

from __future__ import annotations

import json

import pytest
from bench_modules import load_bench

from hetpp.cost.memory import TABLE_CHUNKS, _lowered_counts, recv_buffer_counts
from hetpp.specs.schedule import SCHEDULES

pytest.importorskip("torch.distributed.pipelining")
MULTI = [name for name, spec in SCHEDULES.items() if spec.multi_stage]


def _bench():
    return load_bench("recv_multi")


@pytest.mark.parametrize("name", MULTI)
def test_table_is_torchs_lowered_ir(name):
    bench = _bench()
    shipped = json.loads(bench.TABLE.read_text())[name]
    assert sorted(map(int, shipped)) == list(range(1, bench.TABLE_MAX_DEVICES + 1))
    for d in range(1, 5):
        assert bench.table_entry(name, d) == shipped[str(d)], (name, d)
    chunks = TABLE_CHUNKS[SCHEDULES[name].placement]
    last, rows = _lowered_counts(name, 8, chunks)
    for m in (last + 8, last + 16):
        if SCHEDULES[name].micro_batch_problem(8 * chunks, 8, m) is None:
            assert bench.live_counts(name, 8, chunks, m) == rows[last], (name, m)


def test_counts_fall_back_to_the_bound_off_the_table():
    spec = SCHEDULES["interleaved-1f1b"]
    assert recv_buffer_counts(spec, 3, 12, 1, 18, 9) == (12, 12)  # 9 devices
    assert recv_buffer_counts(spec, 3, 12, 1, 12, 4) == (12, 12)  # 3 chunks
    assert recv_buffer_counts(spec, 3, 12) == (12, 12)  # no stage
    assert recv_buffer_counts(spec, 3, 9, 1, 8, 4) == (9, 9)  # torch refuses m = 9 on 4
    assert recv_buffer_counts(spec, 3, 12, 1, 8, 4) == _lowered_counts(spec.name, 4, 2)[1][12][1]
