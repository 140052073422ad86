"""What a planner strategy is asked: model, cluster, batch, and the knobs it may choose."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Literal

from hetpp.cost.compute import CostModel
from hetpp.profile.table import ProfileTable
from hetpp.specs.catalog import GpuType
from hetpp.specs.cluster import Cluster
from hetpp.specs.errors import SpecError
from hetpp.specs.model import ModelSpec
from hetpp.specs.schedule import SCHEDULES, ScheduleSpec
from hetpp.specs.trainspec import TrainSpec

RecomputeMode = Literal["auto", "on", "off"]
ShardingMode = Literal["auto", "none", "optimizer", "targeted"]
DEFAULT_MICRO_BATCH_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class TypePool:
    """All devices of one GPU type, grouped by node (devices of one node are interchangeable)."""

    key: str
    """Lower-case type name, the key every planner table uses."""
    gpu: GpuType
    nodes: tuple[tuple[int, ...], ...]
    """Device ids per node, nodes in cluster order."""
    gpus_per_node: int
    """Largest node of this type (the best case for keeping a pipeline inside one node)."""
    intra_bw_bytes_per_s: float
    """Fastest intra-node link among this type's nodes."""
    tp: int = 1
    """Tensor-parallel degree: the planner's unit of this type is a group of `tp` devices of
    one node, named by its lead device (`nodes` and `gpus_per_node` count groups)."""

    @property
    def count(self) -> int:
        return sum(len(n) for n in self.nodes)


@dataclass
class Problem:
    """One planning request. Strategies read it; nothing in it changes during a search."""

    model: ModelSpec
    cluster: Cluster
    train: TrainSpec
    """Batch, sequence length, precision, schedule and memory settings (`recompute` ignored:
    the planner decides it from `recompute_mode`)."""
    micro_batch_sizes: tuple[int, ...] = DEFAULT_MICRO_BATCH_SIZES
    """Candidate micro-batch sizes; the search chooses one per plan, then hpp's last pass
    (`planner.mixed_mbs`) may give each pipeline shape its own."""
    recompute_mode: RecomputeMode = "auto"
    """`auto` plans without recomputation and, where memory is short, with it, and keeps the
    faster; `on`/`off` force it."""
    profiles: ProfileTable | None = None
    """Measured rows that replace the estimate for their GPU types."""
    sharding_mode: ShardingMode = "none"
    """Optimizer sharding over block owners (`Plan.sharding`): `none`; `optimizer` for every
    plan; `auto` also tries it where memory or time says so and keeps the faster
    (`planner.sharding`)."""
    optimizer_shards: int = 1
    """Owners the search assumes share each bucket's optimizer state: 1 plans unsharded; k > 1
    sizes stages and optimizer steps as if every bucket had k owners (`cost_model`) and marks
    the plans `sharding="optimizer"`; each plan is then costed with its own pipeline count, so a
    plan of fewer than k pipelines that does not fit is dropped there."""
    schedules: tuple[str, ...] | None = None
    """Schedules (interleaved, V, zbh1: `ScheduleSpec.multi_stage`) the planner may give
    a pipeline in place of the
    plan's (`hetpp.planner.schedules`); None: those the runtime executes
    (`ScheduleSpec.executable`)."""
    tp_degrees: Mapping[str, int] = field(default_factory=dict)
    """Tensor-parallel degree per GPU type key (missing: 1). Every stage of that type is a TP
    group of that many devices of one node (`planner.tp` searches these)."""
    tp_search: bool = False
    """Search a TP degree per GPU type (`planner.tp`); False: plan with `tp_degrees` as given."""
    half_blocks: bool = True
    """hpp may end stages between a block's attention and MLP halves where that is faster
    (`planner.halves`: the plan's model then has `layer_unit` "half"); False: whole blocks."""
    _cms: dict[tuple[bool, int], CostModel] = field(default_factory=dict, init=False, repr=False)
    pipe_groups: dict[tuple, object] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """`assemble.pipe_group`'s memo (closed-form line of each concrete pipeline kind)."""
    derived: dict[str, Problem] = field(default_factory=dict, init=False, repr=False, compare=False)
    """Problems made from this one, built once so that every pass shares their cost models'
    memos (`planner.sharding.sharded_problem`: each sharded pass of a search costed every
    pipeline again on a fresh copy)."""

    def __post_init__(self) -> None:
        if not self.micro_batch_sizes or min(self.micro_batch_sizes) < 1:
            raise SpecError("expected positive integers", field="micro_batch_sizes")
        self.micro_batch_sizes = tuple(sorted(set(self.micro_batch_sizes)))
        if self.schedule_spec.multi_stage:
            raise SpecError(
                f"the planner shapes pipelines under a one-chunk schedule (1f1b, gpipe), not "
                f"{self.schedule!r}; it tries the others per pipeline itself "
                "(--try-schedules)",
                field="schedule",
            )
        if self.sharding_mode != "none" and (self.tp_search or self.has_tp):
            raise SpecError(
                "tensor parallelism is not combined with optimizer sharding (the runtime shards "
                "no DTensor); plan with --sharding none or --tp off",
                field="sharding",
            )
        for name in self.schedules or ():
            if name not in SCHEDULES or not SCHEDULES[name].multi_stage:
                raise SpecError(
                    f"{name!r} is not a per-pipeline schedule; expected some of "
                    f"{', '.join(n for n, s in SCHEDULES.items() if s.multi_stage)}",
                    field="schedules",
                )

    @property
    def has_tp(self) -> bool:
        """Whether some GPU type's stages are TP groups (`tp_degrees`)."""
        return any(k > 1 for k in self.tp_degrees.values())

    @property
    def global_batch(self) -> int:
        return self.train.global_batch

    @property
    def layer_list_len(self) -> int:
        return self.model.layer_list_len

    @property
    def schedule(self) -> str:
        return self.train.schedule

    @property
    def schedule_spec(self) -> ScheduleSpec:
        """The schedule's registry entry."""
        return SCHEDULES[self.train.schedule]

    @property
    def chunked_schedules(self) -> tuple[str, ...]:
        """The schedules the pass may give this problem's pipelines (`multi_stage`:
        multi-chunk, or one chunk with a split backward; none with TP stages: a TP group runs
        one stage of a single-stage schedule, `specs.plan`)."""
        if self.has_tp:
            return ()
        if self.schedules is not None:
            return self.schedules
        return tuple(n for n, s in SCHEDULES.items() if s.multi_stage and s.executable)

    def schedules_to_try(self, recompute: bool) -> tuple[str, ...]:
        """`chunked_schedules` a plan with this recomputation setting may run: with
        recomputation, none that splits backward. Under a split backward torch's W re-runs each
        checkpointed block's forward once per parameter group (6-7 per block) and keeps the
        recomputed tensors until the W ends, more than the stage holds without recomputation
        (`tests/unit/test_recompute_split_backward.py`): a bad deal the cost model does not
        charge."""
        if not recompute:
            return self.chunked_schedules
        return tuple(n for n in self.chunked_schedules if not SCHEDULES[n].splits_backward)

    def on_unit(self, unit: str) -> Problem:
        """This problem with its model's layer list at `unit` (`ModelConfig.layer_unit`): a
        half-unit plan (`planner.halves`) is costed on the half-unit list. Built once per
        problem (`derived`), so every pass shares its cost models' memos."""
        if unit == self.model.config.layer_unit:
            return self
        key = f"unit {unit}"
        if key not in self.derived:
            self.derived[key] = replace(self, model=self.model.with_unit(unit))
        return self.derived[key]

    def cost_model(self, recompute: bool, shards: int | None = None) -> CostModel:
        """The cost model for one recomputation setting (built once). The search's (`shards`
        None: `optimizer_shards`) charges 1/shards of the optimizer state per parameter; with
        `shards=1` it is the plans' own, which `assemble.evaluate` costs them with."""
        shards = self.optimizer_shards if shards is None else shards
        key = (recompute, shards)
        if key not in self._cms:
            opt = self.train.optimizer_bytes_per_param / shards
            train = self.train.model_copy(
                update={"recompute": recompute, "optimizer_bytes_per_param": opt}
            )
            self._cms[key] = CostModel(self.model, train, self.cluster, self.profiles)
        return self._cms[key]

    def recompute_options(self) -> list[bool]:
        return {"off": [False], "on": [True], "auto": [False, True]}[self.recompute_mode]

    def micro_batches(self, mbs: int) -> int:
        """Micro-batches of size `mbs` in the global batch (what data balance shares out)."""
        return self.global_batch // mbs

    def batch_sizes(self) -> list[int]:
        """Micro-batch sizes that divide the global batch (every pipeline's share is a multiple)."""
        return [b for b in self.micro_batch_sizes if self.global_batch % b == 0]

    @cached_property
    def pools(self) -> dict[str, TypePool]:
        """Devices by GPU type, in order of first appearance in the cluster file."""
        nodes: dict[str, dict[int, list[int]]] = {}
        size: dict[str, int] = {}
        bw: dict[str, float] = {}
        for d in self.cluster.devices:
            key = d.gpu.name.lower()
            nodes.setdefault(key, {}).setdefault(d.node, []).append(d.id)
            group = self.cluster.nodes[d.group]
            size[key] = max(size.get(key, 0), group.gpus_per_node)
            bw[key] = max(bw.get(key, 0.0), group.intra_node_GBps * 1e9)
        unknown = sorted(set(self.tp_degrees) - set(nodes))
        if unknown:
            raise SpecError(f"GPU types {unknown} are not in the cluster", field="tp_degrees")
        pools = {}
        for k, by_node in nodes.items():
            tp = self.tp_degrees.get(k, 1)
            if tp < 1 or tp > size[k]:
                raise SpecError(
                    f"{k}: tensor-parallel degree {tp}; expected 1..{size[k]} (one node)",
                    field="tp_degrees",
                )
            pools[k] = TypePool(
                key=k,
                gpu=self.cluster.type_table[k],
                # leads of whole groups of `tp` (ids are consecutive inside a node)
                nodes=tuple(tuple(v[: len(v) - len(v) % tp : tp]) for v in by_node.values()),
                gpus_per_node=size[k] // tp,
                intra_bw_bytes_per_s=bw[k],
                tp=tp,
            )
        return pools

    def tp_of(self, device: int) -> int:
        """The TP degree of the planner's unit led by `device`."""
        return self.pools[self.cluster.gpu(device).name.lower()].tp

    def group_of(self, device: int) -> tuple[int, ...]:
        """The devices of the unit led by `device` (itself without TP)."""
        return tuple(range(device, device + self.tp_of(device)))

    @property
    def units(self) -> list[int]:
        """Lead device of every unit, in device order (every device without TP)."""
        return sorted(d for pool in self.pools.values() for n in pool.nodes for d in n)

    @property
    def type_keys(self) -> list[str]:
        return list(self.pools)

    @cached_property
    def num_nodes(self) -> int:
        return len({d.node for d in self.cluster.devices})

    def plan_fields(self, recompute: bool) -> dict:
        """Plan fields that record what the plan was made for, so other tools can use it alone."""
        return dict(
            train=self.train.model_copy(update={"recompute": recompute}),
            model=self.model.config,
            cluster=self.cluster,
            sharding="optimizer" if self.optimizer_shards > 1 else "none",
        )


def physical_limit_samples_per_s(problem: Problem, units: Collection[int] | None = None) -> float:
    """Every device training the whole model alone at its own speed: no bubbles, no
    communication, memory ignored. Per device, the best micro-batch size's per-sample
    forward+backward time of all layers (same layer costs as the planner, no recomputation).
    `units` (lead devices): the limit of those alone (say, the ones a plan uses)."""
    cm = problem.cost_model(False)
    rate = 0.0
    for pool in problem.pools.values():
        count = pool.count
        if units is not None:
            count = sum(d in units for node in pool.nodes for d in node)
        if not count:
            continue
        costs = [(b, cm.layer_costs(pool.gpu, b, tp=pool.tp)) for b in problem.micro_batch_sizes]
        per_sample = min((c.fwd_cum[-1] + c.bwd_cum[-1]) / b for b, c in costs)
        rate += count / per_sample
    return rate
