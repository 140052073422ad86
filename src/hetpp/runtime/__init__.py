"""Runtime: executes a Plan with torch.distributed and torch.distributed.pipelining.

`trainer` is one rank's loop (`python -m hetpp.train`, started by torchrun or by `launch`, the
local launcher behind `hetpp train`); `model` the layers; `groups` the rank mapping and process
groups; `stage` the timed/emulated pipeline stage; `gradsync` block-wise gradient aggregation;
`data`, `checkpoint`, `metrics`, `reference` (single-process referee for --verify) and `profiler`
(`hetpp profile`). Modules without torch: `options`, `launch`, `metrics`.
"""
