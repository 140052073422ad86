"""Closed-form pipeline time for one step of a pipeline with heterogeneous stages."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from hetpp.cost.comm import p2p_time_s
from hetpp.cost.compute import LayerCosts
from hetpp.specs.cluster import Link
from hetpp.specs.schedule import SCHEDULES, _rounds

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
    # O(S^2) over windows; plain Python beats numpy's call overhead at small depths
    best = max(work)
    for s in range(n - 1):
        total = work[s]
        for t in range(s + 1, n):
            total += work[t] - left[t] + 2 * comm[t - 1]
            best = max(best, total / (gap * (t - s) + 1))
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


def _chunked_few(placement: str, split_backward: bool, turn_weight: bool = False):
    def few(
        fwd_s: Times, bwd_s: Times, comm_s: Times, num_devices: int, weight_s: Times
    ) -> tuple[float, float]:
        """With fewer micro-batches than it takes to fill the loop (interleaved: m < D; ZB-V:
        m < 2D - 1) the schedules cannot reach their steady state: the first micro-batch's
        whole path (its weight-grads, when split, left to the end but the first stage's, and,
        `turn_weight`, the V turn's: ZB-V's order runs stage D's W before stage D-1's
        input-grad on the turning device), then each further one a chunk's share of the beat
        (a split backward's share: the beat less the busiest device's weight-grads, which wait
        for the drain)."""
        v = len(fwd_s) / num_devices
        beat = _busiest_s(fwd_s, bwd_s, placement, num_devices)
        path = sum(fwd_s) + sum(bwd_s) + 2 * sum(comm_s)
        if not split_backward:
            return float(path), float(beat / v)
        weights = np.zeros(num_devices)
        spec = next(s for s in SCHEDULES.values() if s.placement == placement)
        for s, w in enumerate(weight_s):
            weights[spec.device_index(s, num_devices)] += w
        kept = weight_s[0] + (weight_s[num_devices] if turn_weight else 0.0)
        return float(path - sum(weight_s) + kept), float(beat - weights.max())

    return few


def _one_round(split_backward: bool):
    def lines(
        fwd_s: Times, bwd_s: Times, comm_s: Times, num_devices: int, weight_s: Times
    ) -> list[tuple[float, float]]:
        """An interleaved schedule whose micro-batches make one round (torch's flex rule:
        `m < 2D`) never reaches the lock-step the steady line assumes: each device runs all
        its chunk-0 forwards, then the later chunks', the last device turns chunk v-1 round one
        micro-batch after another, then every device runs its chunk-0 backwards. So the chunks
        run as flow lines one after another, and a device holding a heavy chunk (the
        embedding's, the head's) paces its chunk's flow alone: their paces add where the
        busiest device's total work does not say so. The line is one path through the replay
        (a lower bound on it): chunk 0's forward flow (paced by its slowest forward), the last
        device's middle chunks and its turn (split: its first D - 1 turns leave their W for
        later), chunk 0's backward flow (split: the input-grads travel, each device's W's
        follow its own). It stands in for the steady line; `_busy_devices` still holds."""
        d = num_devices
        f = np.reshape(fwd_s, (-1, d))  # [chunk, device]
        b = np.reshape(bwd_s, (-1, d))
        w = np.reshape(weight_s, (-1, d))
        hop = np.asarray(comm_s[: d - 1], dtype=float)  # chunk 0's own hops
        middle = float(f[1:-1, -1].sum() + b[1:-1, -1].sum())
        turn = f[-1, -1] + b[-1, -1]
        first = f[0].sum() + 2 * hop.sum() + middle + turn + b[0].sum()
        if split_backward:
            first += -(d - 1) * w[-1, -1] - w[0, 1:].sum()
        return [(float(first), float(f[0].max() + middle + turn + b[0].max()))]

    return lines


def _busy_devices(placement: str, split_backward: bool):
    def lines(
        fwd_s: Times, bwd_s: Times, comm_s: Times, num_devices: int, weight_s: Times
    ) -> list[tuple[float, float]]:
        """Per device one path through the replay, at any m: the first micro-batch reaching it
        (chunk 0 runs down the devices in both placements), all its work, then (unsplit) its
        last backward's way back to the first device (a split one ends on its own W's)."""
        d = num_devices
        hop = np.asarray(comm_s[: d - 1], dtype=float)
        reach = np.concatenate([[0.0], np.cumsum(np.asarray(fwd_s[: d - 1]) + hop)])
        back = np.concatenate([[0.0], np.cumsum(np.asarray(bwd_s[: d - 1]) + hop)])
        work = _device_work(fwd_s, bwd_s, placement, d)
        ends = reach + (0.0 if split_backward else back)
        return [(float(e + x), float(x)) for e, x in zip(ends, work)]

    return lines


PARTS = {"F": 0, "B": 1, "I": 1, "W": 2}
"""Index of a compute step's part in `_device_steps` (a whole backward B counts as its
input-grad part I, its W part then taking 0 s)."""


@functools.lru_cache(maxsize=4096)
def _device_steps(name: str, num_devices: int, chunks: int, m: int) -> tuple:
    """Every device's compute steps in the schedule's order as `[D, L]` arrays: the step's
    (stage, part) as `3 stage + part`, and its micro-batch; a device with fewer steps (some
    backwards whole, others split) is padded at its end with `3 S`, a step of nothing."""
    spec = SCHEDULES[name]
    orders = [spec.order(d, num_devices, chunks, m) for d in range(num_devices)]
    size, pad = max(map(len, orders)), 3 * num_devices * chunks
    code = np.full((num_devices, size), pad)
    k = np.zeros((num_devices, size))
    for d, o in enumerate(orders):
        code[d, : len(o)] = [3 * s + PARTS[kind] for kind, s, _ in o]
        k[d, : len(o)] = [j for _, _, j in o]
    return code, k


@functools.lru_cache(maxsize=256)
def _afters(num: int) -> np.ndarray:
    """`_after` of every (stage, part), `[S, 3, 4 S - 1]`."""
    return np.stack([[_after(num, t, part) for part in range(3)] for t in range(num)])


def _after(num: int, stage: int, part: int) -> np.ndarray:
    """Coefficients over `[f, i, w, c]` of what must still run after a step, on its
    micro-batch: after an input-grad (or whole backward) at `stage` the ones below it with
    their hops, then (split) stage 0's W; nothing after a W; after a forward the rest of the
    way down and everything back."""
    row = np.zeros(4 * num - 1)
    below = np.arange(num) < stage
    if part == 1:
        row[num : 2 * num] = below
        row[3 * num :] = below[: num - 1]
    elif part == 0:
        row[1 + stage : num] = 1.0
        row[num : 2 * num] = 1.0
        row[3 * num :] = 1.0 + (np.arange(num - 1) >= stage)
    if (part != 2 and stage > 0) or part == 0:
        row[2 * num] = 1.0  # stage 0's W (0 s when backwards are whole)
    return row


def first_reach_s(
    fwd_s: Times, bwd_s: Times, comm_s: Times, m: int, schedule: str, num_devices: int,
    weight_s: Times,
) -> float:  # fmt: skip
    """The longest of a family of paths through the replay, read off the schedule's order:
    a step of a device, the device's steps from it up to a later one, then what must still
    run after that one on its micro-batch (`_after`). A step cannot start before its
    micro-batch's own way reaches it (forwards down every stage and hop, then the
    input-grads, or whole backwards, back up to it; a W after its I), and micro-batch k's
    no earlier than the first's plus k times the slowest stage or hop on that way: each stage
    runs its micro-batches in order, and a link carries them in order. The device holding the
    last stages waits for the forwards to come down the pipeline at the pace of its slowest
    stage, device 0 for the first backward to come back, and whatever either has left then
    runs one step after another. Links are free beyond that, so it is a lower bound on the
    replay (exact for one micro-batch on a loop); `[D, L]` numpy over the devices' orders."""
    num = len(fwd_s)
    f, b = np.asarray(fwd_s, dtype=float), np.asarray(bwd_s, dtype=float)
    w = np.asarray(weight_s, dtype=float) if SCHEDULES[schedule].splits_backward else 0.0 * b
    i, c = b - w, np.asarray(comm_s, dtype=float)
    f_start = np.concatenate([[0.0], np.cumsum(f[:-1] + c)])
    i_start = f_start[-1] + f[-1] + np.concatenate([np.cumsum((i[1:] + c)[::-1])[::-1], [0.0]])
    way = np.stack([f_start, i_start, i_start + i], axis=1)  # [stage, part]
    down = np.maximum.accumulate(np.concatenate([f[:1], np.maximum(f[1:], c)]))
    up = np.maximum.accumulate(np.concatenate([np.maximum(i[:-1], c), i[-1:]])[::-1])[::-1]
    pace = np.maximum(up, down[-1])
    pace = np.stack([down, pace, pace], axis=1)
    took = np.stack([f, i, w], axis=1)
    after = _afters(num) @ np.concatenate([f, i, w, c])  # [stage, part]
    code, k = _device_steps(schedule, num_devices, num // num_devices, m)
    dur = np.append(took, 0.0)[code]  # the padding takes nothing and starts nothing
    done = np.cumsum(dur, axis=1)
    start = np.append(way, -np.inf)[code] + k * np.append(pace, 0.0)[code] - (done - dur)
    end = (done + np.append(after, 0.0)[code])[:, ::-1]
    end = np.maximum.accumulate(end, axis=1)[:, ::-1]
    return float((start + end).max())


class TimingRule(NamedTuple):
    """How a schedule's pipeline time `fill + (m - 1) * beat` is made. All take
    `(fwd_s, bwd_s, comm_s, num_devices, weight_s)` (per stage; `weight_s` is the W part of each
    backward, read by the split-backward rules)."""

    fill: Callable[..., float]
    """Seconds of the first micro-batch through all stages and back (fill and drain)."""
    beat: Callable[..., float]
    """Steady-state seconds each further micro-batch adds."""
    few: Callable[..., tuple[float, float]] | None = None
    """A second line `(fill, beat)` the time never falls below, for schedules whose steady
    state needs more micro-batches than they may run (`pipeline_time_s` takes the larger; the
    planner's data balance reads the first line only, and the full cost judges its plans)."""
    paths: Callable[..., list[tuple[float, float]]] | None = None
    """More such lines, each one path through the replay at any m (a lower bound)."""
    one_round: Callable[..., list[tuple[float, float]]] | None = None
    """For interleaved schedules whose micro-batches make one round (`m < 2D`): lines that
    replace the first, since no steady state forms; the chunks run as flow lines one after
    another."""
    first_reach: bool = False
    """The time never falls below `first_reach_s` (read off the schedule's order for the
    pipeline's m, so not a line: the planner's data balance does not see it)."""
    steady_needs_hops: bool = False
    """The first line holds only where the beat is above the busiest device's work (hops
    join the lock-step): otherwise its fill charges every device the whole bubble, which the
    devices with less work absorb, and the per-device paths and `first_reach_s` set the time
    (interleaved 1F1B: up to 9% over the replay on the benchmark plans)."""


TIMING_RULES: dict[str, TimingRule] = {
    "lockstep": TimingRule(_traversal_fill, _lockstep_beat),
    "flow-lines": TimingRule(_traversal_fill, _flow_lines_beat),
    # no few-micro-batch line either: `first_reach_s` holds there, the line was up to 9% over
    "interleaved": TimingRule(
        _chunked_fill("loop", False),
        _chunked_beat("loop"),
        None,
        _busy_devices("loop", False),
        _one_round(False),
        first_reach=True,
        steady_needs_hops=True,
    ),
    # no few-micro-batch line: it charged the first micro-batch's whole path and then a beat
    # share per further one, up to 10% over the replay on the benchmark plans with m <= D;
    # `first_reach_s` is a path through the replay there (docs/benchmarks-sim.md)
    "zero-bubble": TimingRule(
        _chunked_fill("loop", True),
        _chunked_beat("loop", True),
        None,
        _busy_devices("loop", True),
        _one_round(True),
        first_reach=True,
    ),
    "zero-bubble-v": TimingRule(
        _chunked_fill("v", True),
        _chunked_beat("v", turns=V_TURNS["zbv"]),
        _chunked_few("v", True, turn_weight=True),
        _busy_devices("v", True),
        first_reach=True,
    ),
    "dualpipe-v": TimingRule(
        _chunked_fill("v", True),
        _chunked_beat("v", turns=V_TURNS["dualpipev"]),
        _chunked_few("v", True),
        _busy_devices("v", True),
        first_reach=True,
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
    """Time from the first forward to the last backward of one step: `fill + (m - 1) * beat`.

    `comm_s[s]` is the one-way activation (and gradient) transfer time between stage s and s+1
    (length S-1). The fill and drain traverse every stage once in each direction; `beat_s` paces
    the other m-1 micro-batches. Exact for GPipe. For 1F1B exact with free links when the last
    stage is the slowest; when an earlier stage paces, its warm-up forwards overlap the round
    trip behind it, which the fill still charges, so the form is pessimistic there (the simulator
    finds it within 5% on the plans of docs/benchmarks-sim.md). Multi-chunk schedules run on
    `num_devices` devices; their time is the largest of several lines (`TimingRule`): the
    steady one (in one round of an interleaved schedule, the flow-line path instead), the
    one for few micro-batches (V schedules), one per device kept busy throughout, and the
    paths read off the schedule's order (`first_reach_s`); on a loop the steady one only
    where hops pace it (`TimingRule.steady_needs_hops`)."""
    args = _rule_args(fwd_s, bwd_s, comm_s, num_devices, weight_s)
    rule = timing_rule(schedule)
    if rule.one_round and _rounds(args[3], num_micro_batches)[0] == 1:
        lines = rule.one_round(*args)
    else:
        lines = [(rule.fill(*args), rule.beat(*args))]
        busiest = _busiest_s(fwd_s, bwd_s, "loop", args[3]) if rule.steady_needs_hops else 0.0
        if rule.steady_needs_hops and lines[0][1] <= busiest * (1 + 1e-9):  # (a loop's rule)
            lines = []
    lines += [rule.few(*args)] if rule.few else []
    lines += rule.paths(*args) if rule.paths else []
    time = max(steady_time_s(fill, beat, num_micro_batches) for fill, beat in lines)
    if rule.first_reach:
        fwd, bwd, comm, d_count, weight = args
        time = max(
            time, first_reach_s(fwd, bwd, comm, num_micro_batches, schedule, d_count, weight)
        )
    return float(time)


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


def backward_done_s(bwd_s: Sequence[float], comm_s: Sequence[float], total_s: float) -> list[float]:
    """When each stage finishes its last backward: stage 0 at the end, stage s earlier by the
    backward and transfer times of the stages in front of it."""
    done, t = [], total_s
    for s in range(len(bwd_s)):
        done.append(t)
        if s < len(comm_s):
            t -= bwd_s[s] + comm_s[s]
    return done
