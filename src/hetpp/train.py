"""`python -m hetpp.train --plan PLAN.json ...`: one rank of a training run.

torchrun starts one per device (`torchrun --nnodes N --nproc-per-node K -m hetpp.train --plan ...`);
so does `hetpp train`'s local launcher. Rank and rendezvous come from the environment.
"""

from __future__ import annotations

import sys

from hetpp.cli.main import OneLineParser
from hetpp.runtime.options import add_arguments, from_args
from hetpp.specs.errors import SpecError


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m hetpp.train", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        from hetpp.runtime.trainer import DistEnv
        from hetpp.runtime.trainer import main as run_rank

        return run_rank(from_args(args), DistEnv.from_environ())
    except SpecError as e:
        print(f"hetpp.train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
