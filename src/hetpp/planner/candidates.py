"""What the large-cluster search tries: homogeneous depths per type, mixed-type templates, the
(template, copies) options with their optimistic bounds, and nested homogeneous layouts."""

from __future__ import annotations

import itertools

import numpy as np

from hetpp.cost.memory import devices_to_hold, model_state_bytes, usable_bytes
from hetpp.planner.layout import Layout
from hetpp.planner.shapes import ShapeContext, TemplateCost

DEPTH_SPAN = 4
"""Homogeneous depths tried per type: the least that fits memory and this many more."""
MIXED_RICH_MAX = 4
"""Most devices of the memory-rich type in a mixed template."""
MIXED_SPAN = 2
"""Mixed templates per rich count: the fewest poor-type devices that fit, and this many more."""
NESTED_DEPTHS = 3
"""Large clusters: common depths tried for nested layouts (from the deepest least depth)."""


def homogeneous_items(ctx: ShapeContext) -> dict[str, list[TemplateCost]]:
    """Per type, the feasible homogeneous depths from the least that fits upward (a type that
    fits neither at its memory floor nor at its greatest depth is taken to fit at none: the
    scan in between would cost a split per depth for nothing)."""
    out = {}
    for key, count in zip(ctx.keys, ctx.counts):
        found: list[TemplateCost] = []
        top, floor = min(count, ctx.layer_list_len), _least_depth(ctx, key)
        if floor > top or (
            ctx.homogeneous(key, floor) is None and ctx.homogeneous(key, top) is None
        ):
            out[key] = found
            continue
        for d in range(floor, top + 1):
            t = ctx.homogeneous(key, d)
            if t is not None:
                found.append(t)
            if found and d >= found[0].num_stages + DEPTH_SPAN:
                break
        out[key] = found
    return out


def _least_depth(ctx: ShapeContext, key: str) -> int:
    """Devices of one type that can hold the model states at all (a floor for the depth scan)."""
    return _devices_for(ctx, key, model_state_bytes(ctx.cm.model, ctx.cm.train))


def _devices_for(ctx: ShapeContext, key: str, nbytes: float) -> int:
    """Devices of one type that hold `nbytes` of model state (more than the layers if none)."""
    need = devices_to_hold(nbytes, ctx.tables(key).capacity, ctx.cm.train)
    return ctx.layer_list_len + 1 if need is None else need


def mixed_templates(
    ctx: ShapeContext, items: dict[str, list[TemplateCost]], every: bool = False
) -> list[TemplateCost]:
    """Two-type shapes: a few devices a of a type with more memory per device (up to
    `MIXED_RICH_MAX`) and c of the other. Where the other type cannot hold the model alone, the
    rich devices carry the layers it cannot hold: c from the fewest that fit and a few more.
    Where it can, a fast rich device can also take a large share of the layers while several
    slow ones share the rest (1 H100 + 8 T4 beats homogeneous T4 pipelines next to an idle
    H100): c also over powers of two. (Proportional mixes: `proportional_templates`.)
    `every` (for the count DP of `search._search_pairs`): a few of either type, and every c
    from the fewest that fit (3 A100-40GB + 8 H100, 1 RTX-4090 + 5 A100 next to
    2 A100 + 13 RTX-4090)."""
    pools = ctx.problem.pools
    out: list[TemplateCost] = []
    idx = {k: i for i, k in enumerate(ctx.keys)}
    states = model_state_bytes(ctx.cm.model, ctx.cm.train)
    for rich, poor in itertools.permutations(ctx.keys, 2):
        mem_rich, mem_poor = pools[rich].gpu.memory_bytes, pools[poor].gpu.memory_bytes
        if not every and (mem_rich < mem_poor or (mem_rich == mem_poor and rich > poor)):
            continue
        # beyond its shallowest homogeneous depth a type would run alone, except in the count
        # DP, where a chunked schedule can make the deeper mix win (16 H100 + 16 A100-40GB:
        # 4 H100 + 8 A100-40GB in ZB-V, H100 alone from 2)
        alone = items[rich][0].num_stages if items[rich] and not every else pools[rich].count
        usable_rich = usable_bytes(ctx.tables(rich).capacity, ctx.cm.train)
        for a in range(1, min(pools[rich].count, MIXED_RICH_MAX, alone) + 1):
            top = min(pools[poor].count, ctx.layer_list_len - a)
            floor = _devices_for(ctx, poor, states - a * usable_rich)
            spread = {c for c in _powers_of_two(top) if c > floor} if items[poor] else set()
            found = 0
            for c in range(floor, top + 1):
                if not every and found > MIXED_SPAN and c not in spread:
                    if c > max(spread, default=0):
                        break
                    continue
                comp = [0] * len(ctx.keys)
                comp[idx[rich]], comp[idx[poor]] = a, c
                got = ctx.orders(tuple(comp))
                if got or found:
                    found += 1
                    out += got
    return out


def _powers_of_two(top: int) -> list[int]:
    return [1 << i for i in range(top.bit_length()) if 1 << i <= top]


def nested_layouts(ctx: ShapeContext, items: dict[str, list[TemplateCost]]) -> list[Layout]:
    """Homogeneous pipelines whose splits refine one another: the least deep type is split
    freely, each deeper one must cut wherever the shallower ones do (types of equal depth share
    one split). Then every gradient block of a coarse stage is owned by whole stages of the
    finer pipelines, so buckets chain only inside one coarse stage and all-reduce in parallel
    across them, where unrelated splits would chain through the whole model.

    Layouts: for each prefix of the types ordered by speed (slow types may be better left
    out), every type at its least depth, and every type at one common depth (one split for
    all: the fewest buckets) from the deepest least depth up a few (deeper: less to sync)."""
    usable = [k for k in ctx.keys if items[k]]
    rate = {k: 1 / (items[k][0].beat_s * items[k][0].num_stages) for k in usable}
    by_speed = sorted(usable, key=lambda k: -rate[k])
    out = []
    for j in range(1, len(by_speed) + 1):
        chosen = by_speed[:j]
        least = {k: items[k][0].num_stages for k in chosen}
        plans = [least]
        top = max(least.values())
        plans += [{k: d for k in chosen} for d in range(top, top + NESTED_DEPTHS)]
        for depths in plans:
            layout = _nested(ctx, depths)
            if layout:
                out.append(layout)
    return out


def _nested(ctx: ShapeContext, depths: dict[str, int]) -> Layout:
    """One pipeline template per type, shallowest first, each cutting where the previous did
    (a type goes deeper if it cannot fit its depth with those cuts, or is left out)."""
    count = dict(zip(ctx.keys, ctx.counts))
    forced: tuple[int, ...] = ()
    layout: Layout = []
    for k in sorted(depths, key=lambda k: depths[k]):
        for d in range(max(depths[k], len(forced) + 1), min(count[k], ctx.layer_list_len) + 1):
            t = ctx.template(((k, d),), forced)
            if t is not None:
                forced = t.bounds[1:-1]
                layout.append((t, count[k] // d))
                break
    return layout


def proportional_templates(ctx: ShapeContext) -> list[TemplateCost]:
    """Shapes taking N_t // P devices of every type for some pipeline count P (the shapes of
    the layer-balanced baseline), so that hpp can take k of them and balance the rest."""
    out, seen = [], set()
    states = model_state_bytes(ctx.cm.model, ctx.cm.train)
    usable = {k: usable_bytes(ctx.tables(k).capacity, ctx.cm.train) for k in ctx.keys}
    for p in range(1, max(ctx.counts) + 1):
        comp = tuple(n // p for n in ctx.counts)
        if comp in seen or sum(1 for c in comp if c) < 2 or sum(comp) > ctx.layer_list_len:
            continue
        seen.add(comp)
        if sum(c * usable[k] for c, k in zip(comp, ctx.keys)) < states:
            continue
        out += ctx.orders(comp) or _fewer_poor(ctx, comp)
    return out


def _fewer_poor(ctx: ShapeContext, comp: tuple[int, ...]) -> list[TemplateCost]:
    """A proportional shape that does not fit: fewer devices of its type with the least memory
    per device, down to the first count that fits (a longer pipeline keeps more micro-batches in
    flight at its front under 1F1B: 8 A100 + 10 V100 fit without recomputation where 8 + 16 do
    not)."""
    mem = {k: ctx.problem.pools[k].gpu.memory_bytes for k in ctx.keys}
    j = min((i for i, c in enumerate(comp) if c), key=lambda i: mem[ctx.keys[i]])
    for n in range(comp[j] - 1, 0, -1):
        got = ctx.orders((*comp[:j], n, *comp[j + 1 :]))
        if got:
            return got
    return []


def _copies(kmax: int) -> list[int]:
    """Copy counts tried for a mixed template: all, a few less, and a geometric sweep."""
    ks = {kmax, *range(max(1, kmax - 3), kmax + 1)}
    k = 1
    while k < kmax:
        ks.add(k)
        k *= 2
    ks |= {max(1, round(kmax * f)) for f in (0.25, 0.5, 0.75)}
    return sorted(ks)


def mixed_options(
    ctx: ShapeContext,
    items: dict[str, list[TemplateCost]],
    mixed: list[TemplateCost],
    total: int,
    budget: bool,
) -> list[tuple[float, Layout]]:
    """(optimistic time, fixed mixed pipelines) for no mixing and every (template, k), sorted.

    Bound: a pipeline runs at most max(0, (T - fill + beat) / beat) micro-batches by T, so the
    devices of type t together at most N_t max(0, T r_t - phi_t), with r_t the best rate per
    device and phi_t the least fill loss per device over t's homogeneous depths; k copies of a
    mixed template exactly k max(0, (T - fill + beat) / beat)."""
    keys = ctx.keys
    per_type = [
        (
            max((1 / (t.beat_s * t.num_stages) for t in items[k]), default=0.0),
            min(((t.fill_s - t.beat_s) / (t.beat_s * t.num_stages) for t in items[k]), default=0.0),
        )
        for k in keys
    ]
    rate = np.array([r for r, _ in per_type])
    loss = np.array([p for _, p in per_type])
    counts = np.array(ctx.counts, dtype=float)
    out = [(float(_capacity_bound(total, (counts * rate)[None], (counts * loss)[None])[0]), [])]
    for t in mixed:
        comp = np.zeros(len(keys))
        for k, n in t.runs:
            comp[keys.index(k)] += n
        kmax = int(min(counts[comp > 0] // comp[comp > 0]))
        if budget:
            kmax = min(kmax, total // t.num_stages)
        if kmax < 1:
            continue
        ks = np.array(_copies(kmax))[:, None]
        left = counts[None, :] - ks * comp[None, :]
        rates = np.hstack([left * rate, ks / t.beat_s])
        losses = np.hstack([left * loss, ks * (t.fill_s - t.beat_s) / t.beat_s])
        lbs = _capacity_bound(total, rates, losses)
        out += [(float(lb), [(t, int(k))]) for lb, k in zip(lbs, ks[:, 0])]
    out.sort(key=lambda x: x[0])
    return out


def _capacity_bound(total: int, rate: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """Per row, the T where sum over groups of max(0, rate T - loss) reaches `total`: the
    capacity bound is piecewise linear and increasing, so walk its breakpoints in order."""
    bp = np.where(rate > 0, loss / np.maximum(rate, 1e-300), np.inf)
    order = np.argsort(bp, axis=1)
    bp = np.take_along_axis(bp, order, axis=1)
    cr = np.cumsum(np.take_along_axis(rate, order, axis=1), axis=1)
    cl = np.cumsum(np.take_along_axis(loss, order, axis=1), axis=1)
    t = (total + cl) / np.maximum(cr, 1e-300)
    nxt = np.hstack([bp[:, 1:], np.full((len(bp), 1), np.inf)])
    ok = (cr > 0) & (t >= bp * (1 - 1e-12)) & (t <= nxt * (1 + 1e-12))
    return np.where(ok, t, np.inf).min(axis=1)
