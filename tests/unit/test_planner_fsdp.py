"""The FSDP family's search (`planner.fsdp`): shares by speed, memory caps, one count."""

import itertools
import random

from planner_cases import cluster, problem

from hetpp.cost.step import step_cost
from hetpp.planner import plan
from hetpp.planner.fsdp import _fill_by_device, _fill_by_type, _micro_batch_counts


def test_shares_go_by_speed_and_every_device_runs_the_same_micro_batch_count():
    p = problem(cluster(("A100-80GB", 2, 1), ("V100-32GB", 2, 1)), "gpt3-350m", 24, seq=1024)
    r = plan(p, "fsdp")
    assert r.feasible and r.plan.sharding == "full" and r.plan.strategy == "fsdp"
    final = r.final_plan().validate_plan()
    assert sum(x.batch for x in final.pipelines) == 24
    assert len({x.num_micro_batches for x in final.pipelines}) == 1
    size = {p.cluster.gpu(x.stages[0].device).name: x.micro_batch_size for x in final.pipelines}
    if len(size) == 2:  # both types used: the faster one takes more samples
        assert size["A100-80GB"] > size["V100-32GB"]
    step = step_cost(final, p.cost_model(final.train.recompute))
    assert step.fits and step.iteration_time_s == r.iteration_time_s


def test_sizes_stay_within_memory_and_the_problem_s_largest_micro_batch():
    p = problem(cluster(("RTX-4090", 4, 1)), "gpt3-1.3b", 64, seq=2048, micro_batch_sizes=(1, 2))
    r = plan(p, "fsdp")
    assert r.feasible
    assert max(x.micro_batch_size for x in r.plan.pipelines) <= 2
    assert all(s.fits for s in r.step.stages)


def test_micro_batch_counts_leave_each_device_a_sample():
    assert _micro_batch_counts(24, 4) == [1, 2, 3, 4, 6]  # B/m >= 4 devices
    assert _micro_batch_counts(4, 8) == []


def test_nothing_fits_says_so():
    p = problem(cluster(("T4", 1, 1)), "llama2-13b", 8, seq=2048)
    r = plan(p, "fsdp")
    assert not r.feasible and r.note == "no fully sharded plan fits"


def test_shares_a_run_at_a_time_are_the_shares_one_sample_at_a_time():
    """`_fill_by_type` (a run of one type's devices at a time) hands out what the one-sample
    heap does, on times strictly increasing in the size with ties across types."""
    rng = random.Random(0)
    for _ in range(500):
        types = [f"t{j}" for j in range(rng.randint(1, 4))]
        keys = [rng.choice(types) for _ in range(rng.randint(1, 40))]
        caps = {k: rng.randint(1, 6) for k in types}
        times = {
            k: [0.0, *itertools.accumulate(rng.choice((0.25, 0.5, 1.0)) for _ in range(caps[k]))]
            for k in types
        }
        left = rng.randint(0, sum(caps[k] - 1 for k in keys))
        assert _fill_by_type(keys, caps, times, left) == _fill_by_device(keys, caps, times, left)
