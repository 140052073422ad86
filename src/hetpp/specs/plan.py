"""The Plan: the contract between planner, simulator and runtime (JSON, versioned)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from hetpp.specs.cluster import Cluster
from hetpp.specs.errors import SpecError
from hetpp.specs.io import load_model_file, write_atomic
from hetpp.specs.limits import MAX_DEVICES, MAX_TP_DEGREE, check_size
from hetpp.specs.model import ModelConfig
from hetpp.specs.schedule import SCHEDULES, Schedule, ScheduleSpec
from hetpp.specs.trainspec import TrainSpec

PLAN_VERSION = 2
"""2: the TrainSpec is embedded under `train`. Version 1 files (its fields at the top level) are
upgraded on read by `Plan._upgrade_v1`."""
V1_TRAIN_FIELDS = (
    "global_batch",
    "seq_len",
    "schedule",
    "precision",
    "recompute",
    "optimizer_bytes_per_param",
    "grad_bytes_per_param",
    "reserve_gb",
)
"""The TrainSpec fields a version 1 plan kept at its top level."""
Sharding = Literal["none", "optimizer", "full"]


class StagePlan(BaseModel):
    """One pipeline stage: the devices that run it and the layers it owns."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    devices: tuple[NonNegativeInt, ...] = Field(min_length=1, max_length=MAX_TP_DEGREE)
    """Device ids: one, or a tensor-parallel group of k (same node, same GPU type; k divides
    the model's attention heads, KV heads and MLP width) whose ranks hold column/row shards of
    the stage's blocks (FlashFlex's format: a stage with k devices is a TP group)."""
    layers: tuple[NonNegativeInt, NonNegativeInt]
    """Layer range [start, end) over the model's layer list."""
    recompute: bool | None = None
    """Recompute this stage's blocks in backward; None: the plan's `train.recompute`."""

    def recomputes(self, train: TrainSpec) -> bool:
        """Whether this stage recomputes, its own flag or the plan's default."""
        return train.recompute if self.recompute is None else self.recompute

    @property
    def device(self) -> int:
        """The stage's lead device: the group's first. The cost model, the simulator and the
        gradient blocks name a stage by it (one stage, one timeline, one owner per pipeline)."""
        return self.devices[0]

    @property
    def tp(self) -> int:
        """Tensor-parallel degree (1: no TP)."""
        return len(self.devices)

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


class PipelinePlan(BaseModel):
    """One data-parallel pipeline with its own shape, schedule and batch share."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    stages: tuple[StagePlan, ...] = Field(min_length=1)
    """Stages in pipeline order, each a contiguous layer range. Under a multi-chunk schedule
    (interleaved, V-shaped) a device runs several stages, placed as the schedule's `placement`
    says; `devices` lists each device once."""
    schedule: Schedule | None = None
    """This pipeline's schedule, a name in `hetpp.specs.schedule.SCHEDULES`; None: the plan's
    `train.schedule`. Pipelines of one plan may use different schedules."""
    micro_batch_size: PositiveInt
    """Samples per micro-batch."""
    num_micro_batches: PositiveInt
    """Micro-batches per step; the pipeline's share is their product."""

    @property
    def batch(self) -> int:
        return self.micro_batch_size * self.num_micro_batches

    @property
    def devices(self) -> list[int]:
        """The pipeline's devices in the order of their first stage (each once); a TP stage is
        named by its lead device (`StagePlan.device`)."""
        # `StagePlan.device` inlined, here and in `has_tp`: the search asks every pipeline of
        # every plan it costs (a million property calls at 1024 GPUs)
        return list(dict.fromkeys(s.devices[0] for s in self.stages))

    @property
    def chunks(self) -> int:
        """Stages per device (model chunks; 1 unless the schedule interleaves)."""
        return len(self.stages) // len(self.devices)

    def schedule_in(self, train: TrainSpec) -> ScheduleSpec:
        """This pipeline's schedule entry: its own, else the plan's default."""
        return SCHEDULES[self.schedule or train.schedule]

    @property
    def has_tp(self) -> bool:
        """Whether any stage is a tensor-parallel group."""
        return any(len(s.devices) > 1 for s in self.stages)

    def stage_of_layer(self, layer: int) -> int:
        return next(i for i, s in enumerate(self.stages) if s.layers[0] <= layer < s.layers[1])


class GradBlock(BaseModel):
    """Layers [start, end) owned by exactly one device per pipeline; all-reduced over the owners."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    layers: tuple[NonNegativeInt, NonNegativeInt]
    owners: tuple[NonNegativeInt, ...]
    """Owning device per pipeline, in pipeline order."""


class Estimate(BaseModel):
    """The cost model's prediction for a plan (derived; loaders may ignore it)."""

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)

    iteration_time_s: float
    throughput_samples_per_s: float
    pipeline_time_s: tuple[float, ...]
    search_time_s: float = 0.0


class Plan(BaseModel):
    """What to run where: pipelines, their stages and batch shares, and the gradient blocks."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    version: int = PLAN_VERSION
    """Plan format version (`PLAN_VERSION`; version 1 files are upgraded on read)."""
    train: TrainSpec
    """The training settings the plan was made for: batch, sequence length, precision, state
    bytes, recomputation, schedule, reserve. One source for planner, cost model and runtime."""
    pipelines: tuple[PipelinePlan, ...] = Field(min_length=1)
    grad_blocks: tuple[GradBlock, ...] | None = None
    """Derived from the stages; recomputed when missing."""
    estimate: Estimate | None = None
    model: ModelConfig
    """The model the plan is for (the runtime builds it from this)."""
    cluster: Cluster | None = None
    """The cluster the plan was made for; needed for estimates and simulation."""
    strategy: str = "manual"
    """Which planner strategy produced this plan."""
    sharding: Sharding = "none"
    """How model state is shared out. "none": every pipeline keeps a full replica and each
    gradient bucket (`grad_buckets`, one owner per pipeline) is all-reduced over its owners.
    "optimizer" (ZeRO-1 over block owners): each bucket is reduce-scattered over its P owners,
    each owner steps the optimizer on its 1/P shard (fp32 master weights and Adam state only for
    that shard: `optimizer_bytes_per_param` drops from 12 to 12/P per parameter) and the owners
    all-gather the updated parameters; buckets with one owner are unchanged and the tied
    embedding/head weight stays replicated (its own all-reduce). "full": heterogeneous FSDP
    (FSDP2 `fully_shard`) over all the plan's devices: every pipeline is one device holding the
    whole layer list and training on its own batch share (its own micro-batch size; one
    micro-batch count for all, since every micro-batch gathers each unit on every rank), with
    parameters, gradients and optimizer state sharded 1/N over the N devices."""

    @model_validator(mode="before")
    @classmethod
    def _upgrade_v1(cls, data: Any) -> Any:
        """Version 1 kept the TrainSpec's fields at the top level (with defaults of its own that
        bypassed TrainSpec's, so an fp32 v1 plan was costed with bf16 state bytes): move them
        under `train`, where TrainSpec's own defaults and validators apply."""
        if not isinstance(data, dict) or data.get("version", 1) != 1 or "train" in data:
            return data
        data = dict(data)
        train = {k: data.pop(k) for k in V1_TRAIN_FIELDS if k in data}
        return {**data, "version": PLAN_VERSION, "train": train}

    @property
    def global_batch(self) -> int:
        return self.train.global_batch

    @property
    def seq_len(self) -> int:
        return self.train.seq_len

    @property
    def schedule(self) -> Schedule:
        """The plan's default schedule (a pipeline may name its own: `PipelinePlan.schedule`)."""
        return self.train.schedule

    @property
    def layer_list_len(self) -> int:
        """Length of the model's layer list: embedding, blocks (or their halves), head."""
        return self.model.layer_list_len

    @property
    def num_devices(self) -> int:
        """Every device of every pipeline, each once (a TP stage counts its k devices)."""
        return sum(len({d for s in p.stages for d in s.devices}) for p in self.pipelines)

    @property
    def optimizer_shards(self) -> int:
        """Owners sharing each bucket's optimizer state: one per pipeline with sharding, else 1
        (every block has one owner per pipeline)."""
        return len(self.pipelines) if self.sharding == "optimizer" else 1

    def validate_plan(self, cluster: Cluster | None = None) -> Plan:
        """Check the plan's structure (raises SpecError naming the field); returns self."""
        if cluster is not None and self.cluster is not None and cluster != self.cluster:
            raise SpecError(
                f"the plan was made for cluster {self.cluster.name!r} "
                f"({self.cluster.num_devices} GPUs), not {cluster.name!r} ({cluster.num_devices} "
                "GPUs); re-plan for this cluster",
                field="cluster",
            )
        cluster = cluster or self.cluster
        check_size("number of devices", self.num_devices, MAX_DEVICES, field="pipelines")
        if self.version != PLAN_VERSION:
            raise SpecError(
                f"plan format version {self.version}; this hetpp reads {PLAN_VERSION}",
                field="version",
            )
        if self.seq_len > self.model.max_seq_len:
            raise SpecError(
                f"{self.seq_len} exceeds the model's max_seq_len {self.model.max_seq_len}",
                field="train.seq_len",
            )
        seen: dict[int, str] = {}
        for p, pipe in enumerate(self.pipelines):
            _check_pipeline(self, p, pipe, cluster, seen)
        if self.sharding == "full":
            _check_fully_sharded(self)
        total = sum(p.batch for p in self.pipelines)
        if total != self.global_batch:
            raise SpecError(
                f"sum of micro_batch_size * num_micro_batches over pipelines is {total}, "
                f"expected global_batch = {self.global_batch}",
                field="pipelines",
            )
        if self.grad_blocks is not None and tuple(self.grad_blocks) != derive_grad_blocks(self):
            raise SpecError(
                "does not match the stages; delete it to recompute", field="grad_blocks"
            )
        return self

    def blocks(self) -> tuple[GradBlock, ...]:
        """The gradient blocks (given or derived)."""
        return self.grad_blocks if self.grad_blocks is not None else derive_grad_blocks(self)

    def with_derived(self, **updates: Any) -> Plan:
        """A copy with `grad_blocks` filled in (and any other field updates)."""
        return self.model_copy(update={"grad_blocks": derive_grad_blocks(self), **updates})

    def with_pipelines(self, pipelines: Sequence[PipelinePlan], **updates: Any) -> Plan:
        """A copy with other pipelines (and any other field updates), its gradient blocks left
        to be derived again from them (`blocks`)."""
        update = {"pipelines": tuple(pipelines), "grad_blocks": None, **updates}
        return self.model_copy(update=update)

    def to_json(self) -> str:
        return self.model_dump_json(indent=1, exclude_none=True)

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_json() + "\n")


def _check_pipeline(
    plan: Plan, p: int, pipe: PipelinePlan, cluster: Cluster | None, seen: dict[int, str]
) -> None:
    where = f"pipelines[{p}]"
    expect = 0
    for s, st in enumerate(pipe.stages):
        start, end = st.layers
        if start != expect or end <= start:
            raise SpecError(
                f"layers [{start}, {end}): expected a non-empty range starting at {expect} "
                "(stages must cover the layers contiguously)",
                field=f"{where}.stages[{s}].layers",
            )
        expect = end
    if expect != plan.layer_list_len:
        raise SpecError(
            f"stages end at layer {expect}, expected {plan.layer_list_len} "
            f"(embedding, the model's {plan.model.num_layers} blocks"
            f"{' in halves' if plan.model.layer_unit == 'half' else ''}, head)",
            field=f"{where}.stages",
        )
    spec = pipe.schedule_in(plan.train)
    if pipe.has_tp and len(pipe.stages) != len(pipe.devices):
        raise SpecError(
            f"{len(pipe.stages)} stages on {len(pipe.devices)} devices: tensor-parallel stages "
            "run one stage per device (multi-chunk schedules with TP are not supported)",
            field=f"{where}.stages",
        )
    _check_placement(pipe, spec, where)
    for s, st in enumerate(pipe.stages):
        for i, d in enumerate(st.devices):
            if cluster is not None and d >= cluster.num_devices:
                raise SpecError(
                    f"device {d} does not exist; the cluster {cluster.name!r} has devices "
                    f"0..{cluster.num_devices - 1}",
                    field=f"{where}.stages[{s}].devices",
                )
            # a plain device may run several stages of its pipeline (multi-chunk schedules); a
            # TP group's devices belong to that one stage
            owner = where if st.tp == 1 else f"{where}.stages[{s}]"
            if d in st.devices[:i] or seen.setdefault(d, owner) != owner:
                raise SpecError(
                    f"device {d} is already used by {seen[d]}", field=f"{where}.stages[{s}].devices"
                )
        if st.tp > 1:
            _check_tp_group(plan, st, cluster, f"{where}.stages[{s}].devices")
    problem = spec.micro_batch_problem(len(pipe.stages), len(pipe.devices), pipe.num_micro_batches)
    if problem is not None:
        raise SpecError(problem, field=f"{where}.num_micro_batches")


def _check_placement(pipe: PipelinePlan, spec: ScheduleSpec, where: str) -> None:
    """Every stage on the device the schedule's placement gives it (a device runs several stages
    only under a multi-chunk schedule, and then at fixed positions)."""
    devices, stages = pipe.devices, pipe.stages
    chunks = len(stages) // len(devices)
    if chunks * len(devices) != len(stages) or not spec.allows_chunks(chunks):
        raise SpecError(
            f"{len(stages)} stages on {len(devices)} devices; schedule {spec.name!r} runs "
            + {
                "one": "one stage per device",
                "loop": "the same number of stages on every device",
                "v": "exactly two stages per device",
            }[spec.placement],
            field=f"{where}.stages",
        )
    for s, st in enumerate(stages):
        want = devices[spec.device_index(s, len(devices))]
        if st.device != want:
            raise SpecError(
                f"device {st.device}: schedule {spec.name!r} places stage {s} of this pipeline "
                f"on device {want} ({spec.placement!r} placement)",
                field=f"{where}.stages[{s}].devices",
            )


def _check_fully_sharded(plan: Plan) -> None:
    """FSDP: each device runs the whole model, every rank the same number of micro-batches (each
    micro-batch's forward and backward gather every unit on every rank)."""
    for p, pipe in enumerate(plan.pipelines):
        if len(pipe.stages) != 1:
            raise SpecError(
                f"sharding 'full' needs every pipeline to be one stage holding the whole layer "
                f"list; pipelines[{p}] has {len(pipe.stages)} stages",
                field="sharding",
            )
    counts = sorted({pipe.num_micro_batches for pipe in plan.pipelines})
    if len(counts) > 1:
        raise SpecError(
            f"sharding 'full' needs one num_micro_batches for every pipeline (found {counts}); "
            "share the batch out by micro_batch_size",
            field="pipelines",
        )


def tp_divisibility_error(model: ModelConfig, degree: int) -> str | None:
    """Why `model`'s blocks cannot be split over `degree` tensor-parallel ranks, or None.

    Column/row parallel attention and MLP give each rank whole heads and an equal slice of the
    MLP width, so the degree must divide the attention heads, the KV heads (KV heads are not
    replicated: a degree above `num_kv_heads` is refused) and `ffn_hidden_size`."""
    for name, value in (
        ("num_heads", model.num_heads),
        ("num_kv_heads", model.kv_heads),
        ("ffn_hidden_size", model.ffn_hidden_size),
    ):
        if value % degree:
            return f"the model's {name} ({value}) is not a multiple of {degree}"
    return None


def _check_tp_group(plan: Plan, st: StagePlan, cluster: Cluster | None, field: str) -> None:
    why = tp_divisibility_error(plan.model, st.tp)
    if plan.model.layer_unit == "half":
        why = "the model's layer_unit is half; tensor-parallel stages run whole blocks"
    if why:
        raise SpecError(f"a tensor-parallel group of {st.tp} devices: {why}", field=field)
    if cluster is None:
        return
    devs = [cluster.devices[d] for d in st.devices]
    if len({d.node for d in devs}) > 1 or len({d.gpu.name.lower() for d in devs}) > 1:
        found = ", ".join(f"{d.id} ({d.gpu.name}, node {d.node})" for d in devs)
        raise SpecError(
            f"a tensor-parallel group must be on one node with one GPU type; got {found}",
            field=field,
        )


def derive_grad_blocks(plan: Plan) -> tuple[GradBlock, ...]:
    """Cut the layer list at the union of all stage boundaries; one owner per pipeline."""
    cuts = sorted(
        {0, plan.layer_list_len} | {s.layers[0] for p in plan.pipelines for s in p.stages}
    )
    # Each pipeline's owner of every block, its stage found by bisection on the stage ends (a
    # scan per block and pipeline is quadratic in the stages of a large plan).
    owners = zip(
        *([p.stages[s].devices[0] for s in _stages_at(p, cuts[:-1])] for p in plan.pipelines)
    )
    return tuple(
        GradBlock(layers=(a, b), owners=o) for (a, b), o in zip(itertools.pairwise(cuts), owners)
    )


def _stages_at(pipe: PipelinePlan, layers: list[int]) -> list[int]:
    """The index of `pipe`'s stage holding each of `layers` (`stage_of_layer`)."""
    ends = [st.layers[1] for st in pipe.stages]  # contiguous: the first stage ending past it
    return [bisect.bisect_right(ends, a) for a in layers]


class GradBucket(NamedTuple):
    """Gradient blocks with one owning stage per pipeline, all-reduced as one flat buffer."""

    owners: tuple[int, ...]
    """Owning device per pipeline."""
    blocks: tuple[tuple[int, int], ...]
    """Layer ranges of the merged blocks, in layer order."""
    stages: tuple[int, ...]
    """Owning stage per pipeline (its index in the pipeline): the bucket's gradients are final
    once each of these stages has run its last backward (or weight-grad action)."""


def grad_buckets(plan: Plan) -> tuple[GradBucket, ...]:
    """Blocks merged by owning stages, in the order every rank issues their all-reduces.

    One bucket per set of owning stages, not per set of owning devices: a device running several
    model chunks (interleaved and V schedules) has a bucket per chunk, so a chunk's all-reduce
    can start at that chunk's last backward while the device still runs its other chunks.
    Without chunks a pipeline's stages and devices correspond one to one: the same buckets.
    Buckets go latest layers first: backward ends with the first layers (under every schedule a
    device finishes its later chunks first), so the buckets of the last layers are ready first
    and their all-reduce overlaps the rest of the backward. One global order keeps the
    collectives deadlock-free."""
    blocks = plan.blocks()
    starts = [blk.layers[0] for blk in blocks]
    stages = zip(*(_stages_at(p, starts) for p in plan.pipelines))
    grouped: dict[tuple[int, ...], tuple[tuple[int, ...], list[tuple[int, int]]]] = {}
    for blk, own in zip(blocks, stages):
        grouped.setdefault(own, (blk.owners, []))[1].append(blk.layers)
    buckets = [GradBucket(o, tuple(b), st) for st, (o, b) in grouped.items()]
    return tuple(sorted(buckets, key=lambda b: -b.blocks[-1][0]))


T = TypeVar("T")


def gather_order(buckets: Sequence[T], layers: Callable[[T], Sequence[tuple[int, int]]]) -> list[T]:
    """Buckets (`layers(bucket)`: their layer ranges) in the order a sharded plan all-gathers
    them after the optimizer step: first layers first, as the next step's forward needs them
    (the reverse of `grad_buckets`; a bucket's blocks are one stage's per pipeline, so buckets
    never interleave). The cost model, the simulator and the runtime issue them in this one
    order on every rank: no deadlock."""
    return sorted(buckets, key=lambda b: layers(b)[0][0])


def load_plan(path: str | Path, cluster: Cluster | None = None) -> Plan:
    """Read and validate a plan file (against `cluster` when given)."""
    plan = load_model_file(Plan, path)
    try:
        return plan.validate_plan(cluster)
    except SpecError as e:
        raise e.in_file(str(path)) from None
