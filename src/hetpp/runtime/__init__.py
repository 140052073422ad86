"""Runtime: executes a Plan with torch.distributed and torch.distributed.pipelining.

`trainer` is one rank's loop (`python -m hetpp.train`, started by torchrun or by `launch`, the
local launcher behind `hetpp train`; `env` the rank environment both set); `model` the layers;
`groups` the rank map and process groups; `stage` the timed/emulated pipeline stage; `gradsync`
block-wise gradient aggregation; `data`, `checkpoint`, `metrics`, `reference` (single-process
referee for --verify) and `profiler` (`hetpp profile`). Modules without torch: `options`, `env`,
`launch`, `metrics`.
"""
