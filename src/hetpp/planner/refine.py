"""Local moves on a layout: the large-cluster search's last step.

The decomposed search builds layouts from homogeneous depths plus one mixed template taken k
times, so it cannot reach layouts of several different mixed shapes, which the exact search
finds: two 4 A100 + 4 L40S pipelines lose 4% to one 4 + 3 and one 4 + 5 (the second takes
more micro-batches). Hill climbing over single-device moves reaches them cheaply: each move
changes one or two pipelines by one device, re-split with the composition's best stage order
(`ShapeContext.orders`, cached: the best `ORDERS` of them), and the layout is ranked by the same
estimate as the search (balanced closed form plus the sync and optimizer tail). Two devices of
different types can also trade places between pipelines (in each composition's best `ORDERS`),
and where neither move improves, the one-device moves try the second-best orders too. Both
were added for 3 A100 + 5 V100 + 7 T4 (gpt3-2.7b), whose exact plan, 4 T4 + A100,
2 T4 + A100 + V100 and T4 + 4 V100 + A100 (T4s in front, a cut at layer 8 shared by all three,
so the gradient buckets stay apart), takes second-best orders: one-device moves in best orders
stopped 1.7% short of it. With trades only where the one-device moves stop, the climb ended
0.3% short until the receive buffers were charged (issue 15): they re-split the T4-heavy shapes
(6 T4 + V100 cuts at 2, not 1), the one-device moves then led to a local optimum 1.7% short,
and only a trade (6 T4 with 2 V100 + 2 A100, a T4 for an A100, the second in its second-best
order) leads on from the step where the climbs part. Trades every round end 0.3% short again.
Half of k copies of one template can also become one device smaller and half one larger at
once: 4 T4 + A100 + V100 pipelines (4 A100 + 4 V100 + 4 T4) reach the exact plan, two
T4 + A100 and two T4 + 2 V100 + A100, only so; one pair at a time the estimate rises first.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from hetpp.planner.assemble import layout_key
from hetpp.planner.layout import Layout, layout_time
from hetpp.planner.multisets import composition
from hetpp.planner.shapes import ShapeContext, TemplateCost
from hetpp.planner.tail import layout_tail

ROUNDS = 12
"""Most improving moves taken from one start."""
ORDERS = 2
"""Stage orders tried per composition (best by bottleneck and fill first)."""


def estimate(ctx: ShapeContext, layout: Layout) -> float:
    """The search's estimate of a layout: balanced pipelines plus sync and optimizer tail."""
    total = ctx.problem.micro_batches(ctx.mbs)
    t = layout_time(layout, total, use_tail=False)
    return t + layout_tail(ctx, layout) if t < float("inf") else t


def refine(ctx: ShapeContext, layout: Layout) -> list[Layout]:
    """The layouts a hill climb from `layout` passes through, each better than the one
    before (empty when no move improves the estimate)."""
    best, path = estimate(ctx, layout), []
    seen: dict[tuple, float] = {}  # neighbours recur from round to round
    total = ctx.problem.micro_batches(ctx.mbs)
    for _ in range(ROUNDS):
        # Second-best orders for the one-device moves only where those in best orders and the
        # trades stop: they multiply the neighbours.
        for wide in (False, True):
            scored = []
            for n in _neighbours(ctx, layout, wide):
                key = layout_key(n)
                if key not in seen:
                    # The tail is never negative: a layout whose balanced time alone does not
                    # beat the best cannot win, now or in a later round (the best only falls).
                    t = layout_time(n, total, use_tail=False)
                    seen[key] = t + layout_tail(ctx, n) if t < best * (1 - 1e-9) else t
                if seen[key] < best * (1 - 1e-9):
                    scored.append((seen[key], n))
            if scored:
                break
        if not scored:
            break
        best, layout = min(scored, key=lambda x: x[0])
        path.append(layout)
    return path


def _neighbours(ctx: ShapeContext, layout: Layout, wide: bool = False) -> Iterator[Layout]:
    """Every layout one device away: a copy of a template gains or loses a device of one type
    (from or to the idle ones), two copies of one template become one with a device less and
    one with a device more (or half the copies the one and half the other), or a device moves
    from a copy of one template to one of another; new compositions in their best stage order,
    or (`wide`) in each of their best `ORDERS`. Then (not `wide`: they are the same in both)
    two devices of different types trading places between two copies, in each of the best
    `ORDERS`."""
    n_orders = ORDERS if wide else 1
    comps = [composition(ctx, t) for t, _ in layout]
    idle = [n - sum(c[j] * k for c, (_, k) in zip(comps, layout)) for j, n in enumerate(ctx.counts)]
    budget = ctx.problem.micro_batches(ctx.mbs) if _budgeted(ctx) else 1 << 40
    used = sum(t.num_stages * k for t, k in layout)
    for i, c in enumerate(comps):
        for j in range(len(ctx.keys)):
            grow, shrink = _shifted(c, j, +1), _shifted(c, j, -1)
            if idle[j] > 0 and used < budget:
                yield from _replace(ctx, layout, {i: 1}, [grow], n_orders)
            if shrink:
                yield from _replace(ctx, layout, {i: 1}, [shrink], n_orders)
            if shrink and layout[i][1] >= 2:
                yield from _replace(ctx, layout, {i: 2}, [shrink, grow], n_orders)
            half = layout[i][1] // 2  # the same move on several pairs at once
            if shrink and half >= 2:
                yield from _replace(ctx, layout, {i: 2 * half}, [shrink, grow], n_orders, half)
            for o, d in enumerate(comps):
                if o != i and shrink:
                    add = [shrink, _shifted(d, j, +1)]
                    yield from _replace(ctx, layout, {i: 1, o: 1}, add, n_orders)
    if not wide:
        yield from _swaps(ctx, layout, comps)


def _swaps(ctx: ShapeContext, layout: Layout, comps: list[tuple[int, ...]]) -> Iterator[Layout]:
    """A device of type j from a copy of entry i trades places with one of type k from a copy
    of entry o (o may be i when it has two copies)."""
    types = range(len(ctx.keys))
    for (i, c), (o, d) in itertools.combinations_with_replacement(enumerate(comps), 2):
        take = {i: 2} if i == o else {i: 1, o: 1}
        for j, k in itertools.permutations(types, 2):
            a, b = _shifted(c, j, -1), _shifted(d, k, -1)
            if a and b:
                add = [_shifted(a, k, +1), _shifted(b, j, +1)]
                yield from _replace(ctx, layout, take, add, ORDERS)


def _budgeted(ctx: ShapeContext) -> bool:
    return ctx.problem.schedule_spec.devices_within_batch


def _shifted(comp: tuple[int, ...], j: int, delta: int) -> tuple[int, ...] | None:
    """`comp` with `delta` more devices of type j; None if that leaves none or too many."""
    c = list(comp)
    c[j] += delta
    return tuple(c) if c[j] >= 0 and any(c) else None


def _replace(
    ctx: ShapeContext,
    layout: Layout,
    take: dict[int, int],
    add: list[tuple[int, ...] | None],
    n_orders: int = 1,
    copies: int = 1,
) -> Iterator[Layout]:
    """`layout` less `take[i]` copies of entry i, plus `copies` pipelines of each composition
    in `add`, in each of its best `n_orders` stage orders (nothing if one has no feasible split
    or exceeds the layers)."""
    if any(layout[i][1] < n for i, n in take.items()):
        return
    choices: list[list[TemplateCost]] = []
    for comp in add:
        if comp is None or sum(comp) > ctx.layer_list_len:
            return
        found = ctx.orders(comp)[:n_orders]
        if not found:
            return
        choices.append(found)
    kept: dict[TemplateCost, int] = {}
    for i, (t, k) in enumerate(layout):
        if k - take.get(i, 0):
            kept[t] = kept.get(t, 0) + k - take.get(i, 0)
    for new in itertools.product(*choices):
        out = dict(kept)
        for t in new:
            out[t] = out.get(t, 0) + copies
        yield list(out.items())
