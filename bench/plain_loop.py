"""A plain PyTorch training loop of a model, beside `hetpp train` of the same model on one rank.

Same layers (`StageModule`), precision as the runtime runs it (`runtime.precision.Precision`:
autocast forward, half-precision residual stream, one cast of each weight per step, fp32 master
weights), AdamW, micro-batches and sequence length; no pipelining library, no hetpp step
machinery. Prints tokens/s (median of steps 2..N) and MFU against the device's dense bf16 peak,
and, given a hetpp metrics file of the same shape, the ratio hetpp / plain (the runtime's
overhead). `--device cpu` only checks that it runs (bench/gpu_check.sh --dry-run).

    python bench/plain_loop.py --plan plan.json --steps 20 [--hetpp-metrics run.jsonl]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hetpp.runtime.metrics import load_metrics, summarize
from hetpp.runtime.model import StageModule, token_loss_sum
from hetpp.runtime.precision import Precision
from hetpp.specs.catalog import CATALOG
from hetpp.specs.model import ModelSpec
from hetpp.specs.plan import load_plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hetpp-metrics")
    ap.add_argument("--gpu", default="h200", help="catalog entry for the MFU peak")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args()
    plan = load_plan(args.plan)
    (pipe,) = plan.pipelines
    dev = torch.device(args.device)
    precision = Precision.of(plan)
    model = StageModule(plan.model, 0, plan.layer_list_len, 0, precision.param_dtype).to(dev)
    precision.prepare(model, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = plan.global_batch * plan.seq_len
    g = torch.Generator(device=dev).manual_seed(0)
    shape = (pipe.micro_batch_size, plan.seq_len)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        with precision.step_region(dev):
            for _ in range(pipe.num_micro_batches):
                x = torch.randint(0, plan.model.vocab_size, shape, device=dev, generator=g)
                (token_loss_sum(model(x), x) / tokens).backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times[1:])
    spec = ModelSpec(config=plan.model, seq_len=plan.seq_len)
    flops_per_token = 3 * sum(x.fwd_flops_per_token for x in spec.layers)  # forward + backward
    peak = CATALOG[args.gpu].peak_flops_per_s
    plain = tokens / step_s
    print(f"plain loop: {plain:.0f} tokens/s, MFU {plain * flops_per_token / peak:.1%}")
    if args.hetpp_metrics:
        hetpp = summarize(load_metrics(args.hetpp_metrics))["tokens_per_s"]
        print(f"hetpp train: {hetpp:.0f} tokens/s, MFU {hetpp * flops_per_token / peak:.1%}")
        print(f"hetpp / plain: {hetpp / plain:.3f}")


if __name__ == "__main__":
    main()
