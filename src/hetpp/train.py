"""`python -m hetpp.train --plan PLAN.json ...`: one rank of a training run.

torchrun starts one per device (`torchrun --nnodes N --nproc-per-node K -m hetpp.train --plan ...`);
so does `hetpp train`'s local launcher. Rank and rendezvous come from the environment.
"""

from __future__ import annotations

import os
import sys

from hetpp.runtime.options import add_arguments, from_args
from hetpp.specs.errors import SpecError
from hetpp.specs.values import OneLineParser


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m hetpp.train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        from hetpp.runtime.env import DistEnv
        from hetpp.runtime.preflight import LAUNCHED, check_run
        from hetpp.runtime.trainer import main as run_rank
        from hetpp.specs.plan import load_plan

        opts, env = from_args(args), DistEnv.from_environ()
        if not os.environ.get(LAUNCHED):  # torchrun: no launcher checked the options
            notices = check_run(opts, load_plan(opts.plan), local=False)
            for notice in notices if env.rank == 0 else ():
                print(f"hetpp.train: {notice}", file=sys.stderr, flush=True)
        return run_rank(opts, env)
    except SpecError as e:
        print(f"hetpp.train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
