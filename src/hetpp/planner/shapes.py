"""Pipeline shapes: templates (an ordered list of GPU types), their split and closed-form cost.

A template is evaluated once per (GPU types in stage order, micro-batch size, recomputation):
identical pipelines anywhere in the cluster share it. Links are those of the best placement
(a run of one type packed into as few nodes as possible; a change of type is a change of
node), which makes every template cost a lower bound on any placed copy of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import numpy as np

from hetpp.cost.comm import allreduce_time_s, hop_link, ring_link
from hetpp.cost.params import ParamSums
from hetpp.cost.pipeline import backward_done_s, fill_and_beat, stage_times, steady_time_s
from hetpp.cost.sync import optimizer_step_s, state_bytes
from hetpp.planner.partition import (
    StageTables,
    balance_stages,
    bounds_fit,
    in_flight_per_stage,
    max_micro_batches,
    stage_tables,
)
from hetpp.planner.problem import Problem
from hetpp.specs.cluster import Link

Runs = tuple[tuple[str, int], ...]
"""GPU type keys with device counts, in stage order: (("a100-80gb", 2), ("rtx-4090", 3))."""


@dataclass(frozen=True)
class TemplateCost:
    """One pipeline shape with its layer split and per-micro-batch costs at the best links."""

    runs: Runs
    bounds: tuple[int, ...]
    """Cut points of the layer list, length S+1."""
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    comm_s: tuple[float, ...]
    """One-way transfer between consecutive stages (length S-1), best-case links."""
    fill_s: float
    """Time of the first micro-batch through all stages and back (fill and drain)."""
    beat_s: float
    """Time each further micro-batch adds (the slowest stage, or a run of stages with slow
    links between them: `hetpp.cost.pipeline.beat_s`)."""
    lo: int
    """Fewest micro-batches the schedule allows (1F1B: S)."""
    hi: int
    """Most micro-batches memory allows (unbounded where in-flight micro-batches are, as in
    1F1B; GPipe keeps all in flight)."""
    tail_s: float
    """Estimated gradient sync that sticks out past the pipeline, plus the optimizer step."""
    opt_s: tuple[float, ...]
    """Optimizer step of each stage (`hetpp.cost.sync.optimizer_step_s`)."""
    chunk_bounds: tuple[int, ...] = ()
    """Priced under a multi-chunk schedule (`variants.best_variant`): cut points of its
    chunks x S stages; empty when the template runs one chunk (its `bounds`)."""
    chunk_devices: tuple[int, ...] = ()
    """With `chunk_bounds`: the device (one-chunk stage index) running each chunked stage."""
    chunk_final_s: tuple[float, ...] = ()
    """With `chunk_bounds`: when each chunked stage's gradients are final, relative to the
    pipeline's end (`hetpp.cost.pipeline.pipeline_done_s`, as the full cost reads them)."""

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1

    @cached_property
    def done_s(self) -> tuple[float, ...]:
        """When each stage finishes its last backward, relative to the pipeline's end (0)."""
        return tuple(backward_done_s(self.bwd_s, self.comm_s, 0.0))

    @property
    def sync_stages(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
        """What the gradient sync sees (`planner.tail`): the cut points of the stages that own
        gradient buckets, each one's device, and when its gradients are final (one chunk: the
        template's stages, each on its own device, done as `done_s`)."""
        if self.chunk_bounds:
            return self.chunk_bounds, self.chunk_devices, self.chunk_final_s
        return self.bounds, tuple(range(self.num_stages)), self.done_s

    @cached_property
    def stage_keys(self) -> tuple[str, ...]:
        return tuple(k for k, n in self.runs for _ in range(n))

    def time(self, m: int) -> float:
        """Closed-form pipeline time for m micro-batches (best links, no sync)."""
        return steady_time_s(self.fill_s, self.beat_s, m)


UNBOUNDED = 1 << 40

T = TypeVar("T")


def run_lengths(items: Iterable[T]) -> tuple[tuple[T, int], ...]:
    """Consecutive equal items as (item, how many): GPU types in stage order become `Runs`."""
    return tuple((k, len(list(g))) for k, g in itertools.groupby(items))


class ShapeContext:
    """Templates for one (problem, recomputation, micro-batch size), built on demand, cached."""

    def __init__(self, problem: Problem, recompute: bool, mbs: int):
        self.problem = problem
        self.recompute = recompute
        self.mbs = mbs
        self.cm = problem.cost_model(recompute)
        self.keys = problem.type_keys
        self.counts = tuple(problem.pools[k].count for k in self.keys)
        self.params = ParamSums(self.cm.model)
        self._tables: dict[str, StageTables] = {}
        self._templates: dict[tuple[Runs, tuple[int, ...]], TemplateCost | None] = {}
        self._orders: dict[tuple[tuple[int, ...], bool], list[TemplateCost]] = {}
        self._links: dict[Runs, tuple[Link, ...]] = {}

    @property
    def layer_list_len(self) -> int:
        return self.problem.layer_list_len

    def tables(self, key: str) -> StageTables:
        """Range tables of one GPU type at this micro-batch size."""
        if key not in self._tables:
            pool = self.problem.pools[key]
            costs = self.cm.layer_costs(pool.gpu, self.mbs, tp=pool.tp)
            self._tables[key] = stage_tables(self.cm, costs)
        return self._tables[key]

    def template(self, runs: Runs, forced: tuple[int, ...] = ()) -> TemplateCost | None:
        """Split and cost of one ordered shape (cutting at least at `forced`); None if no split
        fits memory."""
        key = (runs, forced)
        if key not in self._templates:
            self._templates[key] = self._evaluate(runs, forced)
        return self._templates[key]

    def homogeneous(self, key: str, depth: int) -> TemplateCost | None:
        """`depth` devices of one type."""
        return self.template(((key, depth),))

    def orders(self, comp: tuple[int, ...], exhaustive: bool = False) -> list[TemplateCost]:
        """Feasible stage orders of a composition (device count per type, aligned with
        `self.keys`), each type one contiguous run; orders no better than another in bottleneck,
        fill, memory cap and tail are dropped; best (bottleneck, fill) first. Up to three types
        every order is tried; beyond, unless `exhaustive`, the few that matter: by memory per
        device (rich first: stage 0 holds the most micro-batches in flight; or last) and by
        speed (fast first or last). `exhaustive`: every order, none dropped."""
        key = (comp, exhaustive)
        if key not in self._orders:
            runs = [(k, n) for k, n in zip(self.keys, comp) if n]
            if exhaustive or len(runs) <= 3:
                perms = list(itertools.permutations(runs))
            else:
                pools = self.problem.pools
                perms = []
                for attr in ("memory_bytes", "peak_flops_per_s"):
                    ranked = sorted(runs, key=lambda r: getattr(pools[r[0]].gpu, attr))
                    perms += [tuple(ranked[::-1]), tuple(ranked)]
                perms = list(dict.fromkeys(perms))
            found = [t for t in (self.template(tuple(p)) for p in perms) if t is not None]
            self._orders[key] = _pareto(found, keep_all=exhaustive)
        return self._orders[key]

    def best(self, comp: tuple[int, ...]) -> TemplateCost | None:
        """The order with the least bottleneck (then fill) among those whose memory takes the
        whole batch's micro-batches, if any (one capped at a few, its receive buffers filling a
        small device, is a poor stand-in for the composition); None if none fits."""
        found = self.orders(comp)
        free = [t for t in found if t.hi == UNBOUNDED]
        return (free or found)[0] if found else None

    def with_bounds(self, runs: Runs, bounds: tuple[int, ...]) -> TemplateCost | None:
        """Cost of a shape with a given split (baselines); None if it does not fit memory."""
        keys = [k for k, n in runs for _ in range(n)]
        if len(keys) > self.layer_list_len:
            return None
        tables = [self.tables(k) for k in keys]
        flight = in_flight_per_stage(self.problem.schedule_spec, len(keys))
        if not bounds_fit(tables, flight, bounds):
            return None
        return self._cost(runs, keys, tables, bounds)

    def _evaluate(self, runs: Runs, forced: tuple[int, ...]) -> TemplateCost | None:
        keys = [k for k, n in runs for _ in range(n)]
        if len(keys) > self.layer_list_len or len(forced) >= len(keys):
            return None
        tables = [self.tables(k) for k in keys]
        flight = in_flight_per_stage(self.problem.schedule_spec, len(keys))
        bounds = balance_stages(tables, flight, forced)
        if bounds is None:
            return None
        return self._cost(runs, keys, tables, bounds)

    def _cost(self, runs: Runs, keys, tables, bounds) -> TemplateCost:
        times = stage_times([t.costs for t in tables], bounds, self.best_links(runs))
        fwd, bwd, comm = (tuple(x) for x in times)
        fill, beat = fill_and_beat(fwd, bwd, comm, self.problem.schedule)
        spec = self.problem.schedule_spec
        lo = spec.min_micro_batches(len(keys))
        # Receive buffers (every schedule) and GPipe's in-flight activations grow with m.
        hi = self.micro_batch_cap(tables, bounds)
        tail, opt = self._tail(keys, bounds, bwd, comm)
        return TemplateCost(runs, tuple(bounds), fwd, bwd, comm, fill, beat, lo, hi, tail, opt)

    def micro_batch_cap(self, tables: Sequence[StageTables], bounds: Sequence[int]) -> int:
        """Most micro-batches per step with which every stage fits (`UNBOUNDED` if the whole
        global batch does)."""
        limit = self.problem.micro_batches(self.mbs)
        cap = max_micro_batches(tables, bounds, self.problem.schedule_spec, limit)
        return UNBOUNDED if cap >= limit else cap

    def best_links(self, runs: Runs) -> list[Link]:
        """Links between consecutive stages when each run is packed into whole nodes (cached
        by the runs: every split of a shape crosses the same links)."""
        if runs not in self._links:
            self._links[runs] = tuple(self._best_links(runs))
        return list(self._links[runs])

    def _best_links(self, runs: Runs) -> list[Link]:
        cl = self.problem.cluster
        out = []
        for r, (key, n) in enumerate(runs):
            pool = self.problem.pools[key]
            out += [
                hop_link(cl, (j + 1) % pool.gpus_per_node != 0, pool.intra_bw_bytes_per_s)
                for j in range(n - 1)
            ]
            if r < len(runs) - 1:
                out.append(hop_link(cl, False, pool.intra_bw_bytes_per_s))
        return out

    def _tail(self, keys, bounds, bwd, comm) -> tuple[float, tuple[float, ...]]:
        """Exposed sync + optimizer estimate, and each stage's optimizer step: each stage
        all-reduces its gradients with its peers in the other pipelines once it is done; stage
        s is done earlier than the pipeline end by the backward and transfer times of the
        stages before it. Elementwise over the stages (numpy)."""
        train, pools = self.cm.train, self.problem.pools
        replicas = self.problem.cluster.num_devices // len(keys)
        link = ring_link(
            self.problem.cluster,
            (pools[k].intra_bw_bytes_per_s for k in keys),
            self.problem.num_nodes > 1,
        )
        spans = list(itertools.pairwise(bounds))
        tps = [pools[k].tp for k in keys]  # each TP rank syncs and steps its shard
        grads = np.array([self.params.synced(a, b, t) for (a, b), t in zip(spans, tps)])
        stored = np.array([self.params.stored(a, b, t) for (a, b), t in zip(spans, tps)])
        sync = allreduce_time_s(grads * train.grad_bytes_per_param, replicas, link)
        bw = np.array([pools[k].gpu.mem_bw_bytes_per_s for k in keys])
        opt = optimizer_step_s(state_bytes(stored, train), bw)
        done = np.array(backward_done_s(bwd, comm, 0.0))  # before the pipeline's end (0)
        return float((sync + done).max() + opt.max()), tuple(opt.tolist())


def _pareto(found: list[TemplateCost], keep_all: bool = False) -> list[TemplateCost]:
    """Drop shapes another one beats or ties on every count; sort by (bottleneck, fill)."""
    found = sorted(found, key=lambda t: (t.beat_s, t.fill_s, -t.hi, t.tail_s))
    if keep_all:
        return found
    keep: list[TemplateCost] = []
    for t in found:
        if not any(
            k.beat_s <= t.beat_s and k.fill_s <= t.fill_s and k.hi >= t.hi and k.tail_s <= t.tail_s
            for k in keep
        ):
            keep.append(t)
    return keep


def template_arrays(templates: list[TemplateCost]) -> dict[str, np.ndarray]:
    """Column arrays (fill, beat, lo, hi, tail) of a list of templates, for vectorized balance."""
    return {
        "fill": np.array([t.fill_s for t in templates]),
        "beat": np.array([t.beat_s for t in templates]),
        "lo": np.array([t.lo for t in templates], dtype=float),
        "hi": np.array([t.hi for t in templates], dtype=float),
        "tail": np.array([t.tail_s for t in templates]),
    }


class Workspace:
    """Shape contexts of one problem, shared by the strategies of one search."""

    def __init__(self, problem: Problem, schedule_pass: bool = True):
        self.problem = problem
        self.schedule_pass = schedule_pass
        """Whether a baseline runs the schedule pass on its result (`hetpp.planner.schedules`);
        hpp runs its baselines without, and the pass once on its best plans."""
        self._contexts: dict[tuple[bool, int], ShapeContext] = {}

    def context(self, recompute: bool, mbs: int) -> ShapeContext:
        """The (cached) context of one setting."""
        key = (recompute, mbs)
        if key not in self._contexts:
            self._contexts[key] = ShapeContext(self.problem, recompute, mbs)
        return self._contexts[key]

    def settings(self) -> list[tuple[bool, int]]:
        """Every (recomputation, micro-batch size) pair the problem allows."""
        return [
            (r, b) for r in self.problem.recompute_options() for b in self.problem.batch_sizes()
        ]
