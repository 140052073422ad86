"""Closed-form pipeline time for one step of a pipeline with heterogeneous stages."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from hetpp.cost.action_graph import path_ends_s
from hetpp.cost.comm import p2p_time_s
from hetpp.cost.compute import LayerCosts
from hetpp.specs.cluster import Link
from hetpp.specs.schedule import SCHEDULES

Times = Sequence[float]


def _traversal_fill(fwd_s: Times, bwd_s: Times, comm_s: Times, *_) -> float:
    """One micro-batch through every stage and link, forward and back."""
    return sum(fwd_s) + sum(bwd_s) + 2 * sum(comm_s)


def _lockstep_beat(fwd_s: Times, bwd_s: Times, comm_s: Times, *_) -> float:
    """1F1B runs stages in lock-step: in steady state stage s alternates F(r + S-s-1) and B(r),
    so stages s..t form a cycle (F travels s -> t, B comes back, then s may start its next
    forward) that holds t-s+1 micro-batches. Each such window of consecutive stages bounds the
    beat by its mean, `(sum of f+b over the window + 2 x the transfers inside it) / (t - s + 1)`;
    the beat is the largest mean (the max cycle mean of the schedule's event graph). Without
    transfers that is the slowest stage's f+b; a slow link between stages adds about its
    transfer time per micro-batch, which the event simulator shows and the slowest stage alone
    misses."""
    c = list(comm_s)
    work = [f + b for f, b in zip(fwd_s, bwd_s)]
    if not any(c):  # a window's mean never exceeds its slowest stage
        return float(max(work))
    return _window_beat(work, c)


def _window_beat(work: Times, comm: Times, gap: int = 1, left: Times | None = None) -> float:
    """The largest window mean of a lock-step pipeline: over consecutive stages (or devices)
    s..t, `(work[s] + sum over u in s+1..t of (work[u] - left[u] + 2 comm[u-1])) /
    (gap (t - s) + 1)`, where a window's cycle takes `gap` steps per member past the first and
    `left[u]` is work of u that is off the cycle (default none)."""
    n = len(work)
    left = left if left is not None else [0.0] * n
    if n >= NUMPY_WINDOWS:
        return _window_beat_numpy(np.array(work), np.array(comm), gap, np.array(left))
    # O(S^2) over windows; plain Python beats numpy's call overhead at small depths. What each
    # stage past a window's first adds is the same in every window: computed once, as floats
    step = [float(work[t] - left[t] + 2 * comm[t - 1]) for t in range(1, n)]
    best = max(work)
    for s in range(n - 1):
        total = float(work[s])
        for k, add in enumerate(step[s:], start=1):  # the window s .. s + k
            total += add
            mean = total / (gap * k + 1)
            if mean > best:  # `max(best, mean)`, without the call
                best = mean
    return float(best)


NUMPY_WINDOWS = 20
"""Pipeline depth from which `_window_beat` runs its windows as one numpy cumulative sum."""


def _window_beat_numpy(work: np.ndarray, comm: np.ndarray, gap: int, left: np.ndarray) -> float:
    """`_window_beat`'s windows as an S x S array: row s holds stage s's work, then each later
    stage's work plus its two transfers, summed left to right (`cumsum` accumulates in order,
    so every window total rounds as the loop's does)."""
    n = len(work)
    step = np.concatenate([[0.0], work[1:] - left[1:] + 2 * comm])
    totals = np.cumsum(np.triu(np.broadcast_to(step, (n, n)), 1) + np.diag(work), axis=1)
    span = np.arange(n)[None, :] - np.arange(n)[:, None]
    return float(np.where(span >= 0, totals / (gap * np.maximum(span, 0) + 1), -np.inf).max())


def _flow_lines_beat(fwd_s: Times, bwd_s: Times, comm_s: Times, *_) -> float:
    """GPipe's two phases are flow lines in which each link is a stage of its own: forward
    paced by max(f, c), backward by max(b, c)."""
    c = list(comm_s)
    return float(max([*fwd_s, *c]) + max([*bwd_s, *c]))


def _device_work(fwd_s: Times, bwd_s: Times, placement: str, num_devices: int) -> np.ndarray:
    """Per device: forward + backward seconds of all its stages for one micro-batch."""
    spec = next(s for s in SCHEDULES.values() if s.placement == placement)
    work = np.zeros(num_devices)
    for s, (f, b) in enumerate(zip(fwd_s, bwd_s)):
        work[spec.device_index(s, num_devices)] += f + b
    return work


def _busiest_s(fwd_s: Times, bwd_s: Times, placement: str, num_devices: int) -> float:
    """Multi-chunk schedules keep every device busy in steady state: each micro-batch adds at
    least the busiest device's work over all its chunks (sends overlap compute)."""
    return float(_device_work(fwd_s, bwd_s, placement, num_devices).max())


def _chunked_beat(placement: str, split_backward: bool = False, turns: tuple | None = None):
    def beat(fwd_s: Times, bwd_s: Times, comm_s: Times, num_devices: int, weight_s: Times) -> float:
        """The busiest device's work over all its chunks, or, on a loop, a lock-step window
        of devices with the transfers inside it where that is longer. In a loop's steady state
        device d runs one forward and one backward per step, and its backwards trail device
        d+1's by `g` steps (the warm-ups differ by 2 per device, split backwards by 1), so
        devices s..t form 1F1B's cycle over `g (t - s) + 1` steps: a forward travels s -> t, the
        backward comes back, then s runs its next forward. A step is a device's mean over its
        chunks; a split backward's input-grad travels and its W stays behind, so only the top
        device's W is on the cycle. Without transfers the windows never beat the busiest
        device; a slow hop adds itself to every micro-batch (on the 10 Gb/s cluster 27%)."""
        busiest = _busiest_s(fwd_s, bwd_s, placement, num_devices)
        if turns and num_devices > 1 and any(comm_s):  # a V: its hops' ping-pong
            return max(busiest, _v_hop_cycle(fwd_s, bwd_s, comm_s, num_devices, weight_s, turns))
        d = num_devices
        if placement != "loop" or d < 2 or not any(comm_s):
            return busiest
        v = len(fwd_s) // d
        per = [range(k, len(fwd_s), d) for k in range(d)]  # a device's stages
        step = [sum(fwd_s[s] + bwd_s[s] for s in p) / v for p in per]
        left = [sum(weight_s[s] for s in p) / v for p in per] if split_backward else None
        hop = [sum(comm_s[s] for s in p) / v for p in per[:-1]]  # a chunk's own hops
        return v * _window_beat(step, hop, 1 if split_backward else 2, left)

    return beat


V_TURNS = {
    "zbv": ("F", "I", 0, "F", "I", 1),
    "dualpipev": ("B", "F", 1, "B", "F", 0),
}
"""Per V schedule, the two steps a device runs in its steady state between the pair of
messages it waits for from a neighbour and the pair it sends back (`_v_hop_cycle`): the
deeper device's (kinds, chunk), then the shallower one's; read off the replay's timelines
(ZB-V: chunk 0's F then I on the deeper device, chunk 1's on the shallower; DualPipeV: chunk
1's B then F on the deeper, chunk 0's on the shallower)."""


def _v_hop_cycle(
    fwd_s: Times, bwd_s: Times, comm_s: Times, num_devices: int, weight_s: Times, turns: tuple
) -> float:
    """A V crosses each hop four times per micro-batch, chunk 0's activation and chunk 1's
    gradient one way, the other two back, and in steady state a device issues the two messages
    of a direction back to back: the second waits for the first on the link, and the device on
    the other side, which needs it, then runs two steps (`V_TURNS`) before it sends its own
    pair back. So each pair of neighbours plays ping-pong over their hop, a cycle of two
    micro-batches holding 4 transfers and the two steps on each side; per micro-batch the
    largest `(4 c + the four steps) / 2`. It hides behind the busiest device's work unless the
    hop is slow (gpt3-1.3b on 8 A100s over 10 Gb/s, one 26.9 ms hop: the replay's beat is this
    cycle, ZB-V 11% and DualPipeV 25% over the busiest device's)."""
    d, last = num_devices, 2 * num_devices - 1
    i = [b - w for b, w in zip(bwd_s, weight_s)]
    took = {"F": fwd_s, "B": bwd_s, "I": i}
    deep_a, deep_b, deep_chunk, low_a, low_b, low_chunk = turns
    best = 0.0
    for k in range(d - 1):  # the hop between devices k and k + 1
        deep = k + 1 if deep_chunk == 0 else last - (k + 1)
        low = k if low_chunk == 0 else last - k
        steps = took[deep_a][deep] + took[deep_b][deep] + took[low_a][low] + took[low_b][low]
        best = max(best, (4 * comm_s[k] + steps) / 2)
    return float(best)


def _chunked_fill(placement: str, split_backward: bool):
    def fill(fwd_s: Times, bwd_s: Times, comm_s: Times, num_devices: int, weight_s: Times) -> float:
        """Interleaving with v chunks cuts 1F1B's compute fill and drain by v: the bubble is
        the traversal's compute less one beat, over v (uniform stages give Megatron's
        `(D - 1) (f + b) / v`), plus every hop of the first micro-batch there and back (each
        chunk boundary is a hop, the wraps from the last device to the first included; hops
        do not shrink with v). Split backwards fill that compute bubble with deferred
        weight-grads: what is left is the critical path's share of the work,
        `(F + I - W) / (F + B)` summed over the stages (the zero-bubble papers'
        `(D - 1)(f + i - w)`): a third when I ~ W ~ f."""
        v = len(fwd_s) / num_devices
        beat = _busiest_s(fwd_s, bwd_s, placement, num_devices)
        f, b = sum(fwd_s), sum(bwd_s)
        bubble = (f + b - beat) / v
        if split_backward and f + b > 0:
            w = sum(weight_s)
            bubble *= (f + (b - w) - w) / (f + b)
        return float(beat + bubble + 2 * sum(comm_s))

    return fill


class TimingRule(NamedTuple):
    """How a schedule's pipeline time is made. `fill` and `beat` take
    `(fwd_s, bwd_s, comm_s, num_devices, weight_s)` (per stage; `weight_s` is the W part of each
    backward, read by the split-backward rules)."""

    fill: Callable[..., float]
    """Seconds of the first micro-batch through all stages and back (fill and drain)."""
    beat: Callable[..., float]
    """Steady-state seconds each further micro-batch adds."""
    exact: bool = False
    """The time is the longest path through the schedule's action graph
    (`hetpp.cost.action_graph`), the simulator's time; `fill + (m - 1) * beat` then stays the
    planner's data-balance line only (`fill_and_beat`). Otherwise the time is that line."""
    graph_past: float | None = None
    """Where the line is more than this share above the busy-stage lower bound
    (`busy_stage_bound_s`), the time is the action graph's (the simulator's) instead. The line
    is above the replay on nearly every pipeline (the lowest seen: 1.3% below, on random
    ones), so the time stays within about this share of the simulator's while the graph
    (several times the line's cost per call) is walked only where the line may be off. None:
    the line always."""


LINE_WITHIN = 0.02
"""1F1B's lock-step line is used where it is within 2% of the busy-stage lower bound. Its fill
charges the whole round trip where a window in the middle paces the beat, up to +8.3% on the
planner benchmark's 1F1B pipelines at m <= 3D; 40% of them are within 2% of the bound
(docs/benchmarks-sim.md), so the graph is walked for the rest only."""


TIMING_RULES: dict[str, TimingRule] = {
    "lockstep": TimingRule(_traversal_fill, _lockstep_beat, graph_past=LINE_WITHIN),
    "flow-lines": TimingRule(_traversal_fill, _flow_lines_beat),
    "interleaved": TimingRule(_chunked_fill("loop", False), _chunked_beat("loop"), exact=True),
    "zero-bubble": TimingRule(_chunked_fill("loop", True), _chunked_beat("loop", True), exact=True),
    "zero-bubble-v": TimingRule(
        _chunked_fill("v", True), _chunked_beat("v", turns=V_TURNS["zbv"]), exact=True
    ),
    "dualpipe-v": TimingRule(
        _chunked_fill("v", True), _chunked_beat("v", turns=V_TURNS["dualpipev"]), exact=True
    ),
}
"""Timing rules by the name a `hetpp.specs.schedule.ScheduleSpec` gives."""


def timing_rule(schedule: str) -> TimingRule:
    """The timing rule of a schedule in the registry."""
    return TIMING_RULES[SCHEDULES[schedule].timing_rule]


def beat_s(
    fwd_s: Times,
    bwd_s: Times,
    comm_s: Times,
    schedule: str = "1f1b",
    num_devices: int | None = None,
    weight_s: Times | None = None,
) -> float:
    """Steady-state seconds per micro-batch: what each micro-batch beyond the first adds."""
    return fill_and_beat(fwd_s, bwd_s, comm_s, schedule, num_devices, weight_s)[1]


def pipeline_time_s(
    fwd_s: Sequence[float],
    bwd_s: Sequence[float],
    comm_s: Sequence[float],
    num_micro_batches: int,
    schedule: str = "1f1b",
    num_devices: int | None = None,
    weight_s: Times | None = None,
) -> float:
    """Time from the first forward to the last backward of one step.

    `comm_s[s]` is the one-way activation (and gradient) transfer time between stage s and s+1
    (length S-1). GPipe: `fill + (m - 1) * beat` (exact: its phases are flow lines). The other
    schedules (`TimingRule.exact`): the longest path through the schedule's action graph on
    `num_devices` devices, which is the event simulator's time for the pipeline."""
    return pipeline_done_s(
        fwd_s, bwd_s, comm_s, num_micro_batches, schedule, num_devices, weight_s
    )[0]


def pipeline_done_s(
    fwd_s: Times,
    bwd_s: Times,
    comm_s: Times,
    num_micro_batches: int,
    schedule: str = "1f1b",
    num_devices: int | None = None,
    weight_s: Times | None = None,
) -> tuple[float, list[float]]:
    """`pipeline_time_s` and when each stage's parameter gradients are final (its gradient
    bucket's sync may start then, as the simulator starts it). With the action graph that is
    the end of the stage's last whole backward or weight-grad step, read off the graph (a
    device running several chunks finishes its later chunks first, so their buckets start
    before the device is done); GPipe's and 1F1B's stage s ends its backwards
    `backward_done_s` before the end."""
    args = _rule_args(fwd_s, bwd_s, comm_s, num_devices, weight_s)
    rule = timing_rule(schedule)
    fwd, bwd, comm, d_count, weight = args
    if not rule.exact:
        total = steady_time_s(rule.fill(*args), rule.beat(*args), num_micro_batches)
        if rule.graph_past is None or total <= (1 + rule.graph_past) * busy_stage_bound_s(
            fwd, bwd, comm, num_micro_batches
        ):
            return float(total), backward_done_s(bwd_s, comm_s, total)
    key = (tuple(fwd), tuple(bwd), tuple(comm), num_micro_batches, schedule, d_count)
    total, done = _graph_ends(*key, tuple(weight))
    return total, list(done)


@functools.lru_cache(maxsize=4096)
def _graph_ends(
    fwd_s: tuple,
    bwd_s: tuple,
    comm_s: tuple,
    m: int,
    schedule: str,
    num_devices: int,
    weight_s: tuple,
) -> tuple[float, tuple[float, ...]]:
    """`pipeline_done_s` by the action graph, memoized by its inputs: the sharded schedule pass
    (`planner.sharding`) and the search's settings time the same pipelines under cost models
    of their own, whose memos do not meet."""
    ends = path_ends_s(fwd_s, bwd_s, comm_s, m, schedule, num_devices, weight_s)
    return float(ends.devices_s.max()), tuple(ends.grads_final_s.tolist())


def busy_stage_bound_s(fwd_s: Times, bwd_s: Times, comm_s: Times, num_micro_batches: int) -> float:
    """A lower bound on a one-chunk pipeline's time: for the busiest stage counted with its
    ways, the first micro-batch's forward way to stage s, its m forwards and backwards one at a
    time, and the last backward's way back to stage 0."""
    way = 0.0
    best = 0.0
    for f, b, c in zip(fwd_s, bwd_s, [*comm_s, 0.0]):
        best = max(best, way + num_micro_batches * (f + b))
        way += f + b + 2 * c
    return best


def steady_time_s(fill_s, beat_s, num_micro_batches):
    """`fill + (m - 1) * beat`, elementwise over numpy arrays (the planner's data balance)."""
    return fill_s + (num_micro_batches - 1) * beat_s


def micro_batches_within(time_s, fill_s, beat_s):
    """Most micro-batches m with `steady_time_s(fill, beat, m) <= time_s` (elementwise), with a
    hair of slack so that a time computed as `fill + (m - 1) * beat` counts as reaching m."""
    return np.floor((time_s - fill_s) / beat_s + 1e-9) + 1


def fill_and_beat(
    fwd_s: Times,
    bwd_s: Times,
    comm_s: Times,
    schedule: str = "1f1b",
    num_devices: int | None = None,
    weight_s: Times | None = None,
) -> tuple[float, float]:
    """(fill, beat) of `pipeline_time_s = fill + (m - 1) * beat` (the planner costs a pipeline
    shape once with these and any m afterwards). The S stages run on `num_devices` devices
    (default S: one stage each); `weight_s` defaults to `weight_grad_s` of each backward."""
    rule = timing_rule(schedule)
    args = _rule_args(fwd_s, bwd_s, comm_s, num_devices, weight_s)
    return rule.fill(*args), rule.beat(*args)


def _rule_args(fwd_s, bwd_s, comm_s, num_devices, weight_s) -> tuple:
    """A timing rule's arguments with the defaults filled in."""
    weight = weight_s if weight_s is not None else [weight_grad_s(b) for b in bwd_s]
    return fwd_s, bwd_s, comm_s, num_devices or len(fwd_s), weight


WEIGHT_GRAD_SHARE = 0.5
"""Share of a (not recomputing) backward that the weight-grad part W takes under a split-backward
schedule. A transformer block's backward is GEMMs (attention's score products aside): for each
forward GEMM `Y = X A` one for the input gradient (`dX = dY A^T`) and one for the weight gradient
(`dA = X^T dY`), equal FLOPs, so I ~ W ~ b / 2; the profile times backwards whole, so this split
is an estimate, not a measurement."""


def weight_grad_s(bwd_s: float, recompute_fwd_s: float = 0.0) -> float:
    """Seconds of the W part of a backward of `bwd_s` seconds, which includes `recompute_fwd_s`
    of recomputed forward when recomputing (that part belongs to I, which runs first)."""
    return WEIGHT_GRAD_SHARE * (bwd_s - recompute_fwd_s)


RECOMPUTES_IN_WEIGHT_GRAD = 1
"""Forwards a recomputed block runs again in a split backward's W, besides the one in its I:
torch's `stage_backward_weight` is one `autograd.grad` per parameter group, and non-reentrant
checkpointing recomputes per call; the runtime runs each W in one `GraphExecGroup`
(`runtime.stage.TimedStage`), which makes it one per W (counted in
tests/unit/test_recompute_split_backward.py). Not on a pipeline's first stage: torch skips its
I there, and its W is one whole backward, recomputing once."""


def backward_parts_s(
    bwd_s: float, recompute_fwd_s: float, splits_backward: bool, first_stage: bool
) -> tuple[float, float]:
    """(backward, its W part) seconds per micro-batch of a stage whose whole backward takes
    `bwd_s` (`LayerCosts.bwd`), `recompute_fwd_s` of it a recomputed forward
    (`LayerCosts.recomputed_fwd`). Under a split backward (`ScheduleSpec.splits_backward`) the
    I recomputes first, and on every stage but a pipeline's first the W recomputes again
    (`RECOMPUTES_IN_WEIGHT_GRAD`), so the backward (I + W) is longer by that much; the I is
    the rest (`backward - W`). Every consumer (closed form, action graph, simulator) reads
    these two."""
    weight = weight_grad_s(bwd_s, recompute_fwd_s)
    if not splits_backward or first_stage:
        return bwd_s, weight
    again = RECOMPUTES_IN_WEIGHT_GRAD * recompute_fwd_s
    return bwd_s + again, weight + again


def stage_times(
    costs: Sequence[LayerCosts], bounds: Sequence[int], links: Sequence[Link]
) -> tuple[list[float], list[float], list[float]]:
    """Per-micro-batch (forward, backward, one-way transfer to the next stage) of a pipeline
    whose stage s holds layers `[bounds[s], bounds[s+1])` with layer costs `costs[s]`, its
    transfers crossing `links` (length S-1)."""
    spans = list(itertools.pairwise(bounds))
    fwd = [c.fwd(a, b) for c, (a, b) in zip(costs, spans)]
    bwd = [c.bwd(a, b) for c, (a, b) in zip(costs, spans)]
    comm = [p2p_time_s(c.send_bytes[b - 1], link) for c, (_, b), link in zip(costs, spans, links)]
    return fwd, bwd, comm


def placed_stage_times(
    costs: Sequence[LayerCosts],
    bounds: Sequence[int],
    links: Sequence[Link],
    devices: Sequence[int],
    splits_backward: bool,
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(forward, backward, one-way transfer, W part) per micro-batch of the stages `stage_times`
    takes, stage s on `devices[s]`: two consecutive stages on one device (a V's turn) hand over
    in memory, and each backward splits as `backward_parts_s` says."""
    fwd, whole, comm = stage_times(costs, bounds, links)
    comm = [0.0 if a == b else c for a, b, c in zip(devices, devices[1:], comm)]
    parts = [
        backward_parts_s(b, c.recomputed_fwd(x, y), splits_backward, s == 0)
        for s, (b, c, (x, y)) in enumerate(zip(whole, costs, itertools.pairwise(bounds)))
    ]
    return fwd, [b for b, _ in parts], comm, [w for _, w in parts]


def backward_done_s(bwd_s: Sequence[float], comm_s: Sequence[float], total_s: float) -> list[float]:
    """When each stage finishes its last backward: stage 0 at the end, stage s earlier by the
    backward and transfer times of the stages in front of it."""
    done, t = [], total_s
    for s in range(len(bwd_s)):
        done.append(t)
        if s < len(comm_s):
            t -= bwd_s[s] + comm_s[s]
    return done
