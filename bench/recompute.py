"""What recomputation per stage saves: plans searched with recomputation on, before and after the
planner drops it on the stages that fit without it (`planner/recompute.py`).

    python bench/recompute.py
"""

from __future__ import annotations

from hetpp.planner import Problem, plan
from hetpp.planner.assemble import evaluate
from hetpp.specs import Cluster, NodeGroup, TrainSpec, load_model
from hetpp.specs.plan import Plan

CASES = (
    ("gpt3-6.7b", (("A100-80GB", 2), ("V100-16GB", 4))),
    ("gpt3-2.7b", (("A100-40GB", 2), ("V100-16GB", 4))),
    ("llama2-7b", (("A100-80GB", 4), ("V100-32GB", 4))),
)


def _everywhere(p: Plan) -> Plan:
    """`p` with every stage back on the plan's default (recomputation on)."""
    pipes = tuple(
        pp.model_copy(
            update={"stages": tuple(s.model_copy(update={"recompute": None}) for s in pp.stages)}
        )
        for pp in p.pipelines
    )
    return p.model_copy(update={"pipelines": pipes})


def main() -> None:
    print("| model | cluster | stages recomputing | step, all (s) | step, per stage (s) | gain |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for model, groups in CASES:
        cluster = Cluster(
            nodes=[NodeGroup(gpu=g, gpus_per_node=n, intra_node_GBps=100.0) for g, n in groups],
            inter_node_GBps=25.0,
        )
        spec = load_model(model, 2048)
        prob = Problem(spec, cluster, TrainSpec(global_batch=32, seq_len=2048), recompute_mode="on")
        got = plan(prob, "hpp").final_plan()
        flags = [s.recomputes(got.train) for pp in got.pipelines for s in pp.stages]
        before = evaluate(prob, _everywhere(got)).iteration_time_s
        after = evaluate(prob, got).iteration_time_s
        where = " + ".join(f"{n} {g}" for g, n in groups)
        print(
            f"| {model} | {where} | {sum(flags)} of {len(flags)} | {before:.3f} | {after:.3f} "
            f"| {before / after:.2f}x |"
        )


if __name__ == "__main__":
    main()
