"""Local moves on a layout: the large-cluster search's last step.

The decomposed search builds layouts from homogeneous depths plus one mixed template taken k
times, so it cannot reach layouts of several different mixed shapes, which the exact search
finds: two 4 A100 + 4 L40S pipelines lose 4% to one 4 + 3 and one 4 + 5 (the second takes
more micro-batches). Hill climbing over single-device moves reaches them cheaply: each move
changes one or two pipelines by one device, re-split with the composition's best stage order
(`ShapeContext.best`, cached), and the layout is ranked by the same estimate as the search
(balanced closed form plus the sync and optimizer tail).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetpp.planner.layout import Layout, layout_time
from hetpp.planner.multisets import composition
from hetpp.planner.shapes import ShapeContext, TemplateCost
from hetpp.planner.tail import layout_tail

ROUNDS = 12
"""Most improving moves taken from one start."""


def estimate(ctx: ShapeContext, layout: Layout) -> float:
    """The search's estimate of a layout: balanced pipelines plus sync and optimizer tail."""
    total = ctx.problem.micro_batches(ctx.mbs)
    t = layout_time(layout, total, use_tail=False)
    return t + layout_tail(ctx, layout) if t < float("inf") else t


def refine(ctx: ShapeContext, layout: Layout) -> list[Layout]:
    """The layouts a hill climb from `layout` passes through, each better than the one
    before (empty when no move improves the estimate)."""
    best, path = estimate(ctx, layout), []
    for _ in range(ROUNDS):
        scored = [(estimate(ctx, n), n) for n in _neighbours(ctx, layout)]
        scored = [(e, n) for e, n in scored if e < best * (1 - 1e-9)]
        if not scored:
            break
        best, layout = min(scored, key=lambda x: x[0])
        path.append(layout)
    return path


def _neighbours(ctx: ShapeContext, layout: Layout) -> Iterator[Layout]:
    """Every layout one device away: a copy of a template gains or loses a device of one type
    (from or to the idle ones), two copies of one template become one with a device less and
    one with a device more, or a device moves from a copy of one template to one of another."""
    comps = [composition(ctx, t) for t, _ in layout]
    idle = [n - sum(c[j] * k for c, (_, k) in zip(comps, layout)) for j, n in enumerate(ctx.counts)]
    budget = ctx.problem.micro_batches(ctx.mbs) if _budgeted(ctx) else 1 << 40
    used = sum(t.num_stages * k for t, k in layout)
    for i, c in enumerate(comps):
        for j in range(len(ctx.keys)):
            grow, shrink = _shifted(c, j, +1), _shifted(c, j, -1)
            if idle[j] > 0 and used < budget:
                yield from _replace(ctx, layout, {i: 1}, [grow])
            if shrink:
                yield from _replace(ctx, layout, {i: 1}, [shrink])
            if shrink and layout[i][1] >= 2:
                yield from _replace(ctx, layout, {i: 2}, [shrink, grow])
            for o, d in enumerate(comps):
                if o != i and shrink:
                    yield from _replace(ctx, layout, {i: 1, o: 1}, [shrink, _shifted(d, j, +1)])


def _budgeted(ctx: ShapeContext) -> bool:
    return ctx.problem.schedule_spec.devices_within_batch


def _shifted(comp: tuple[int, ...], j: int, delta: int) -> tuple[int, ...] | None:
    """`comp` with `delta` more devices of type j; None if that leaves none or too many."""
    c = list(comp)
    c[j] += delta
    return tuple(c) if c[j] >= 0 and any(c) else None


def _replace(
    ctx: ShapeContext, layout: Layout, take: dict[int, int], add: list[tuple[int, ...] | None]
) -> Iterator[Layout]:
    """`layout` less `take[i]` copies of entry i, plus one pipeline of each composition in
    `add` (nothing if one has no feasible split or exceeds the layers)."""
    if any(layout[i][1] < n for i, n in take.items()):
        return
    new: list[TemplateCost] = []
    for comp in add:
        if comp is None or sum(comp) > ctx.layer_list_len:
            return
        t = ctx.best(comp)
        if t is None:
            return
        new.append(t)
    out: dict[TemplateCost, int] = {}
    for i, (t, k) in enumerate(layout):
        if k - take.get(i, 0):
            out[t] = out.get(t, 0) + k - take.get(i, 0)
    for t in new:
        out[t] = out.get(t, 0) + 1
    yield list(out.items())
