"""Runtime: executes a Plan with torch.distributed and torch.distributed.pipelining."""
