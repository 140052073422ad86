"""Size limits checked before anything is expanded into lists, arrays or processes.

A cluster file, model file or plan is a few lines that describe something that can be huge
(`count: 1000000000` nodes, a million layers, 10^17 micro-batches). Everything that expands one
checks its size here first and refuses with a message that names the size and the limit; the
limits sit far above any real cluster or model, so only mistakes and hostile files hit them.
"""

from __future__ import annotations

from hetpp.specs.errors import SpecError

MAX_FILE_BYTES = 64 * 2**20
"""Largest spec file read (cluster, model, plan, profile); real ones are kilobytes."""
MAX_NESTING = 64
"""Deepest nesting of mappings and lists in a spec file (real ones nest 4-5 levels)."""
MAX_NODES = 1_000_000
"""Most values a YAML/JSON document may expand to, counting every use of an alias."""
MAX_DEVICES = 16_384
"""Most GPUs in a cluster or plan."""
MAX_TP_DEGREE = 64
"""Most devices in one tensor-parallel group (one node; the largest nodes have a few dozen)."""
MAX_LAYERS = 10_000
"""Most transformer blocks in a model (the largest published models have a few hundred)."""
MAX_GLOBAL_BATCH = 10_000_000
"""Most samples per optimizer step."""
MAX_LOCAL_RANKS = 256
"""Most processes `hetpp train` starts on one machine (a node has at most a few dozen GPUs)."""
MAX_SIM_ACTIONS = 2_000_000
"""Most forward/backward actions one simulated step may hold (stages x micro-batches x 2): the
simulator replays about 150,000 a second (docs/benchmarks-sim.md), so this is about 15 s."""


def check_size(what: str, size: int, limit: int, *, file: str | None = None, field: str) -> None:
    """Refuse `size` above `limit` before anything of that size is built."""
    if size > limit:
        raise SpecError(f"{what} is {size:,}, above the limit of {limit:,}", file=file, field=field)
