"""Where a rank sits in the job: the environment torchrun sets, which the local launcher sets too.

No torch here: the launcher writes these variables, a rank reads them back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hetpp.specs.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class DistEnv:
    """Where this process sits in the job and how it meets the others."""

    rank: int
    world_size: int
    local_rank: int = 0
    """Index among the processes of this node (picks the GPU)."""
    local_world_size: int = 1
    """Processes on this node (CPU threads are shared among them)."""
    init_method: str = "env://"
    """Rendezvous: env:// (MASTER_ADDR/MASTER_PORT, as torchrun sets) or tcp://host:port."""

    @classmethod
    def from_environ(cls) -> DistEnv:
        env = os.environ
        try:
            return cls(
                rank=int(env["RANK"]),
                world_size=int(env["WORLD_SIZE"]),
                local_rank=int(env.get("LOCAL_RANK", 0)),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            )
        except KeyError as e:
            raise SpecError(
                f"{e.args[0]} is not set; start ranks with torchrun or `hetpp train`",
                field="environment",
            ) from None

    def to_environ(self) -> dict[str, str]:
        """The variables `from_environ` reads (rendezvous address not included)."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
        }
