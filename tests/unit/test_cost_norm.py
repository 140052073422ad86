"""The gradient norm's all-reduce over every rank: no rank steps its optimizer before the last
rank's sync is done (the runtime measures the norm every step, `GradSync.clip`)."""

import pytest
import simcases

from hetpp.cost.comm import scalar_allreduce_time_s
from hetpp.cost.step import step_cost
from hetpp.cost.sync import finish_step
from hetpp.sim import plan_programs, simulate_plan
from hetpp.sim.trace import Kind
from hetpp.specs.cluster import Link

ALL, HALF, REST = (0, 6), (0, 3), (3, 6)


def test_scalar_allreduce_is_a_tree_of_latencies():
    link = Link(1e9, 10e-6)
    assert scalar_allreduce_time_s(1, link) == 0.0
    assert scalar_allreduce_time_s(2, link) == 2 * 10e-6
    assert scalar_allreduce_time_s(1024, link) == 20 * 10e-6
    assert scalar_allreduce_time_s(1025, link) == 22 * 10e-6


def test_every_rank_steps_after_the_last_ranks_sync_and_the_norm():
    # Rank "a" is free at 1.0, "b" at 3.0 (its pipeline ends at 2.0): both step from 3.0 plus
    # the norm, a's bucket shared with b all-gathers after both steps.
    free, ends = {"a": 1.0, "b": 3.0}, {"a": 0.5, "b": 2.0}
    opt = {"a": 0.25, "b": 0.5}
    gathered, done = finish_step(free, ends, opt, [(("a", "b"), 1.0)], norm_s=0.125)
    assert gathered == [(3.625, 3.625, 4.625)]
    assert done == {"a": 4.625, "b": 4.625}
    _, alone = finish_step(free, ends, opt, norm_s=0.125)
    assert alone == {"a": 3.375, "b": 3.625}


def test_simulator_and_closed_form_wait_for_the_norm():
    # Pipeline 0 (device 0) ends at 0.48 s, pipeline 1 (devices 2, 3) at 0.60 s; device 3's
    # bucket [3, 6) is done long before device 0's and 2's [0, 3): it still steps after that.
    plan = simcases.plan([([(0, ALL)], 4), ([(2, HALF), (3, REST)], 4)])
    cm = simcases.cost_model(plan)
    programs, collectives = plan_programs(plan, cm)
    assert [str(a) for a in programs[2].actions[-2:]] == ["1SYNC2", "1OPT"]
    assert collectives[-1].members == (0, 1, 2)
    tr = simulate_plan(plan, cm).trace
    norm = tr.kind == Kind.SYNC
    last = tr.end[norm & (tr.index < 2)].max()
    assert tr.start[tr.kind == Kind.OPT] == pytest.approx([last] * 3, rel=1e-12)
    closed = step_cost(plan, cm)
    assert closed.iteration_time_s == pytest.approx(tr.end.max(), rel=1e-8)
