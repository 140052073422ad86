"""The FSDP family: every device trains the whole model on its own batch share, with parameters,
gradients and optimizer state sharded over the devices used (`cost.fsdp`, `sharding: full`).

Search: which GPU types take part (every subset on clusters of few types, else the fastest k
types), recomputation, the micro-batch count m (a divisor of the global batch, one for every
device: each micro-batch gathers every unit on every rank) and each device's micro-batch size
(integers summing to B/m, at most the largest of the problem's micro-batch sizes and what the
device's memory holds). Sizes go by speed: one sample at a time to the device whose micro-batch
would end first with it (the min-max allocation for times monotone in the size). Every
candidate is ranked by the full step cost (`cost.step.step_cost`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import time
from collections.abc import Sequence

from hetpp.cost.compute import CostModel
from hetpp.cost.fsdp import fsdp_memory, fsdp_ranks_step
from hetpp.planner.assemble import PlanResult, evaluate
from hetpp.planner.problem import Problem, TypePool
from hetpp.specs.plan import PipelinePlan, Plan, StagePlan

ALL_SUBSETS = 4
"""Clusters of at most this many GPU types try every subset of them; larger ones the fastest k."""


def search_fsdp(problem: Problem) -> PlanResult:
    """The fastest fully sharded plan, or why there is none."""
    t0 = time.perf_counter()
    if problem.has_tp:  # the TP search's all-ones assignment plans FSDP (`planner.tp`)
        return PlanResult("fsdp", None, None, 0.0, "FSDP plans have no tensor-parallel stages")
    if problem.train.half_params:  # FSDP2 keeps fp32 sharded parameters as the masters
        return PlanResult("fsdp", None, None, 0.0, "FSDP plans keep fp32 parameters")
    # Every candidate's step time from its devices alone (`cost.fsdp.fsdp_ranks_step`, the
    # full cost's own number); plans, one pipeline per device, are built and fully costed in
    # order of that time only until one fits: the fastest that fits, the first of equals.
    found: list[tuple[float, int, bool, list[int], list[int], int]] = []
    for pools in _type_sets(problem):
        ids = sorted(d for pool in pools for node in pool.nodes for d in node)
        for rc in problem.recompute_options():
            cm = problem.cost_model(rc)
            caps = {p.key: _size_cap(problem, cm, p, len(ids)) for p in pools}
            for m in _micro_batch_counts(problem.global_batch, len(ids)):
                sizes = _shares(cm, problem, ids, problem.global_batch // m, caps)
                if sizes is None:
                    continue
                ranks = [(d, b, rc) for d, b in zip(ids, sizes)]
                cost = fsdp_ranks_step(ranks, m, problem.cost_model(rc, shards=1))
                found.append((cost.iteration_time_s, len(found), rc, ids, sizes, m))
    for _, _, rc, ids, sizes, m in sorted(found, key=lambda x: x[:2]):
        plan = _plan(problem, rc, ids, sizes, m)
        step = evaluate(problem, plan)
        if step.fits:
            return PlanResult("fsdp", plan, step, time.perf_counter() - t0)
    return PlanResult("fsdp", None, None, time.perf_counter() - t0, "no fully sharded plan fits")


def _type_sets(problem: Problem) -> list[list[TypePool]]:
    """GPU type subsets to try: all of them for few types, else the fastest 1..T types."""
    pools = list(problem.pools.values())
    if len(pools) <= ALL_SUBSETS:
        return [list(c) for k in range(1, len(pools) + 1) for c in itertools.combinations(pools, k)]
    cm = problem.cost_model(False)
    pools.sort(key=lambda p: _sample_s(cm, p, 1))
    return [pools[:k] for k in range(1, len(pools) + 1)]


def _sample_s(cm: CostModel, pool: TypePool, size: int) -> float:
    """One micro-batch of `size` samples through the whole model, forward and backward."""
    c = cm.layer_costs(pool.gpu, size)
    return float(c.fwd_cum[-1] + c.bwd_cum[-1])


def _size_cap(problem: Problem, cm: CostModel, pool: TypePool, num_ranks: int) -> int:
    """Largest micro-batch size a device of `pool` holds among N sharding ranks (0: none)."""
    cap = 0
    for size in range(1, max(problem.micro_batch_sizes) + 1):
        costs = cm.layer_costs(pool.gpu, size)
        if fsdp_memory(cm.model, cm.train, costs, num_ranks).total > pool.gpu.memory_bytes:
            break
        cap = size
    return cap


def _micro_batch_counts(global_batch: int, num_devices: int) -> list[int]:
    """Counts m dividing the batch that leave every device at least one sample per micro-batch."""
    return [m for m in range(1, global_batch // num_devices + 1) if global_batch % m == 0]


def _shares(
    cm: CostModel, problem: Problem, ids: Sequence[int], samples: int, caps: dict[str, int]
) -> list[int] | None:
    """Micro-batch size per device (summing to `samples`), greedy by the time each would take
    with one sample more; None if the devices cannot hold them."""
    keys = [problem.cluster.gpu(d).name.lower() for d in ids]
    if any(caps[k] == 0 for k in keys) or sum(caps[k] for k in keys) < samples:
        return None
    # a micro-batch's time per type and size (index 0 unused), up to the type's cap
    times = {
        k: [0.0, *(_sample_s(cm, problem.pools[k], b) for b in range(1, caps[k] + 1))]
        for k in set(keys)
    }
    strict = all(a < b for t in times.values() for a, b in itertools.pairwise(t[2:]))
    fill = _fill_by_type if strict else _fill_by_device
    return fill(keys, caps, times, samples - len(ids))


def _fill_by_device(
    keys: Sequence[str], caps: dict[str, int], times: dict[str, list[float]], left: int
) -> list[int]:
    """From one sample each, `left` more one at a time, each to the device whose micro-batch
    would end first with it (the lowest index on ties), within its type's cap."""
    sizes = [1] * len(keys)
    heap = [(times[k][2], i) for i, k in enumerate(keys) if caps[k] > 1]
    heapq.heapify(heap)
    for _ in range(left):
        _, i = heapq.heappop(heap)
        sizes[i] += 1
        if sizes[i] < caps[keys[i]]:
            heapq.heappush(heap, (times[keys[i]][sizes[i] + 1], i))
    return sizes


def _fill_by_type(
    keys: Sequence[str], caps: dict[str, int], times: dict[str, list[float]], left: int
) -> list[int]:
    """`_fill_by_device`'s sizes, a run of devices at a time, for times strictly increasing in
    the size: then the devices of one type take samples in turn, in index order (the next
    one, at the lowest size, always has the least time of its type), so a type's devices take
    one each for as long as they come before every other type's next one. A large cluster
    hands out tens of thousands of samples over a few types."""
    sizes = [1] * len(keys)
    members: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    at = {k: (1, 0) for k in members}  # (size of the type's lowest devices, how many are past it)
    heap = [(times[k][2], m[0], k) for k, m in members.items() if caps[k] > 1]
    heapq.heapify(heap)
    while left:
        t, _, k = heapq.heappop(heap)
        m, (size, done) = members[k], at[k]
        n = len(m) - done
        if heap and heap[0][0] == t:  # equal times: the lower index first
            n = bisect.bisect_left(m, heap[0][1], lo=done) - done
        n = min(n, left)
        for i in m[done : done + n]:
            sizes[i] = size + 1
        left, done = left - n, done + n
        if done == len(m):
            size, done = size + 1, 0
        at[k] = (size, done)
        if size < caps[k]:
            heapq.heappush(heap, (times[k][size + 1], m[done], k))
    return sizes


def _plan(problem: Problem, rc: bool, ids: Sequence[int], sizes: Sequence[int], m: int) -> Plan:
    whole = (0, problem.layer_list_len)
    # Unvalidated: every field is valid by construction (a device id, the whole layer list, a
    # size and a count of at least 1), and validating one pipeline per device, thousands per
    # candidate on a large cluster, was most of this family's search (the Plan is validated).
    pipelines = tuple(
        PipelinePlan.model_construct(
            stages=(StagePlan.model_construct(devices=(d,), layers=whole),),
            micro_batch_size=b,
            num_micro_batches=m,
        )
        for d, b in zip(ids, sizes)
    )
    fields = {**problem.plan_fields(rc), "sharding": "full"}
    return Plan(pipelines=pipelines, strategy="fsdp", **fields)
