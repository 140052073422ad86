"""`hetpp demo`: the main job on a built-in example."""

from __future__ import annotations

import argparse
import json
from importlib import resources

from rich.console import Console

from hetpp.cost.step import cost_model_for_plan, step_cost
from hetpp.report.tables import print_step
from hetpp.specs.io import validate_model
from hetpp.specs.plan import Plan


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the built-in example",
        description="Estimate a two-pipeline plan (gpt3-1.3b on 2 A100-80GB + 4 V100-16GB) "
        "with the cost model and print its breakdown.",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    console = Console()
    text = resources.files("hetpp.data").joinpath("demo_plan.json").read_text()
    plan = validate_model(Plan, json.loads(text), "demo_plan.json").validate_plan()
    console.rule("hetpp demo: cost-model estimate of a heterogeneous two-pipeline plan")
    print_step(
        step_cost(plan, cost_model_for_plan(plan)),
        [(p.micro_batch_size, p.num_micro_batches) for p in plan.pipelines],
        console,
    )
    return 0
