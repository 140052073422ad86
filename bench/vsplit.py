"""How far a V-placed pipeline's split sits from the least busiest device its cuts allow, and
what the splits that reach it cost (issue 13: the *imbalance* share of lab-64 gpt3-13b).

    .venv/bin/python bench/vsplit.py --only CLUSTER:MODEL [...] [--plans DIR] [--window N]

Per V-placed pipeline shape of hpp's plan (zbv, dualpipev: device d runs stages d and 2D-1-d),
`least_busiest` is an exact DP over every split whose cuts lie within `--window` layers of the
plan's own: per device, the pair (end of its first chunk, start of its second) is the state, the
value the busiest device so far (forward + backward per micro-batch, the embedding and head
where they sit). Run once per cap on any one stage's time (each stage time the window allows,
up to 1.3x the plan's largest), each split it returns is costed in full (`step_cost`: the plan
with every identical pipeline on the split) with whether it fits. `pair_moves` costs every pair
of single-layer cut moves by the moved pipeline's time alone (`pipeline_bound`, memory
included), the neighbourhood the planner's climb (single moves, first improvement) does not see.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import numpy as np
from imbalance import chosen_plans

from hetpp.cost.step import cost_model_for_plan, pipeline_bound, step_cost
from hetpp.planner.resplit import _built, _recut
from hetpp.specs.plan import PipelinePlan, Plan


def cuts_of(pipe: PipelinePlan) -> list[int]:
    """The pipeline's stage bounds over the layer list."""
    return [pipe.stages[0].layers[0]] + [st.layers[1] for st in pipe.stages]


def near_cuts(cuts: list[int], window: int) -> list[list[int]]:
    """Per stage bound, where it may go: within `window` of its own, the first and last fixed."""
    end = cuts[-1]
    near = [sorted({min(max(c + k, 1), end - 1) for k in range(-window, window + 1)}) for c in cuts]
    return [[0], *near[1:-1], [end]]


def stage_caps(work: list[np.ndarray], at: list[int], near: list[list[int]]) -> list[float]:
    """Every time a stage can take with its bounds in `near` (stage s on device `at[s]`)."""
    return sorted(
        {
            float(work[at[s]][b] - work[at[s]][a])
            for s in range(len(at))
            for a, b in itertools.product(near[s], near[s + 1])
            if a < b
        }
    )


def least_busiest(
    work: list[np.ndarray], near: list[list[int]], tau: float
) -> tuple[float, tuple[int, ...]] | None:
    """The least busiest device's work over V splits with stage bounds in `near` (`near_cuts`)
    and every stage at most `tau` seconds, and one split that reaches it; None where none does.
    `work[d]`: device d's cumulative forward + backward seconds over the layer list (from 0)."""
    devices, num = len(work), len(near) - 1
    end = near[-1][0]

    def w(d: int, a: int, b: int) -> float:
        return float(work[d][b] - work[d][a])

    states: dict[tuple[int, int], tuple[float, tuple[int, int] | None]] = {(0, end): (0.0, None)}
    history = []
    for d in range(devices):
        new: dict[tuple[int, int], tuple[float, tuple[int, int] | None]] = {}
        last = d == devices - 1
        for (a, b), (value, _) in states.items():
            for a2, b2 in itertools.product(near[d + 1], near[num - 1 - d]):
                if not a < a2 <= b2 < b or (a2 == b2) != last:
                    continue
                first, second = w(d, a, a2), w(d, b2, b)
                if max(first, second) > tau:
                    continue
                v = max(value, first + second)
                if (a2, b2) not in new or v < new[(a2, b2)][0]:
                    new[(a2, b2)] = (v, (a, b))
        history.append(new)
        states = new
    if not states:
        return None
    key, (value, _) = min(states.items(), key=lambda kv: kv[1][0])
    bounds = [0] * (num + 1)
    bounds[-1] = end
    for d in range(devices - 1, -1, -1):
        bounds[d + 1], bounds[num - 1 - d] = key
        key = history[d][key][1]
    return value, tuple(bounds)


def pair_moves(plan: Plan, pipe: PipelinePlan) -> tuple[int, int, float, tuple[int, ...] | None]:
    """(pairs tried, pairs that fit, the least pipeline time among them and its cuts) over every
    two single-layer moves of different cuts of `pipe`."""
    cm = cost_model_for_plan(plan)
    cuts = cuts_of(pipe)
    moves = [(j, d) for j in range(1, len(cuts) - 1) for d in (-1, 1)]
    tried = fit = 0
    best: tuple[float, tuple[int, ...] | None] = (float("inf"), None)
    for (j1, d1), (j2, d2) in itertools.combinations(moves, 2):
        new = list(cuts)
        new[j1] += d1
        new[j2] += d2
        if j1 == j2 or any(not a < b for a, b in itertools.pairwise(new)):
            continue
        tried += 1
        t = pipeline_bound(_recut(pipe, new), cm, plan.optimizer_shards)
        if t is not None:
            fit += 1
            best = min(best, (t, tuple(new)))
    return tried, fit, *best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=int, default=4, help="layers each cut may move")
    args, rest = ap.parse_known_args(argv)
    for cluster_file, model, _, plan_ in chosen_plans(__doc__, rest):
        cm = cost_model_for_plan(plan_)
        step = step_cost(plan_, cm)
        pipe = plan_.pipelines[0]
        spec = pipe.schedule_in(plan_.train)
        print(f"\n{cluster_file.stem} {model}: step {step.iteration_time_s:.4f} s")
        if spec.placement != "v":
            print("  first pipeline not V-placed: skipped")
            continue
        members = [i for i, p in enumerate(plan_.pipelines) if cuts_of(p) == cuts_of(pipe)]
        work = [
            np.concatenate([[0.0], np.cumsum(c.fwd_s + c.bwd_s)])
            for c in (
                cm.layer_costs(cm.cluster.gpu(dev), pipe.micro_batch_size) for dev in pipe.devices
            )
        ]
        cuts, num = cuts_of(pipe), len(pipe.stages)
        at = [spec.device_index(s, len(pipe.devices)) for s in range(num)]
        own = [0.0] * len(pipe.devices)
        for s in range(num):
            own[at[s]] += float(work[at[s]][cuts[s + 1]] - work[at[s]][cuts[s]])
        stage_max = max(float(work[at[s]][cuts[s + 1]] - work[at[s]][cuts[s]]) for s in range(num))
        print(f"  plan: busiest device {max(own):.5f} s, largest stage {stage_max:.5f} s")
        near = near_cuts(cuts, args.window)
        seen = set()
        for tau in [t for t in stage_caps(work, at, near) if t <= 1.3 * stage_max][-25:]:
            got = least_busiest(work, near, tau)
            if got is None or got[1] in seen:
                continue
            seen.add(got[1])
            trial = step_cost(_built(plan_, members, got[1]), cm)
            print(
                f"  stage cap {tau:.5f} s: busiest device {got[0]:.5f} s, step "
                f"{trial.iteration_time_s:.4f} s, fits {trial.fits}"
            )
        tried, fit, best_s, best_cuts = pair_moves(plan_, pipe)
        print(
            f"  pair moves: {tried} tried, {fit} fit, least pipeline time {best_s:.4f} s "
            f"(the plan's {step.pipeline_time_s[0]:.4f} s)"
        )
        if best_cuts is not None:
            moved = step_cost(_built(plan_, members, best_cuts), cm)
            print(f"  its step {moved.iteration_time_s:.4f} s, fits {moved.fits}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
