"""What gloo achieves over loopback on this machine, in the cost model's terms (link GB/s, latency).

The emulated clusters (`src/hetpp/data/demo-cluster.yaml`, `bench/e2e.py`) run every rank on this
box, so their links are loopback TCP. This measures, with one thread per rank as the runtime uses,
P2P one-way times (ping-pong / 2) at activation sizes and ring all-reduce times at gradient-bucket
sizes over 2..4 ranks, and fits one (bandwidth, latency) pair to the cost model's formulas
(`hetpp.cost.comm`: bytes / bw + latency; 2(P-1)/P * bytes / bw + 2(P-1) * latency): latency from
the quickest P2P, bandwidth the median of what the all-reduces imply. Prints every point, the
fitted model's value and its error.

    python bench/loopback.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

P2P_BYTES = (64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20)
ALLREDUCE_BYTES = (1 << 20, 4 << 20, 16 << 20)
RANKS = (2, 3, 4)


def _worker(rank: int, world: int, port: int, repeats: int, queue) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    out: dict[tuple[str, int], float] = {}
    if world == 2:
        for n in P2P_BYTES:
            t = torch.zeros(n // 4)
            times = []
            for _ in range(repeats + 3):
                dist.barrier()
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(t, 1)
                    dist.recv(t, 1)
                else:
                    dist.recv(t, 0)
                    dist.send(t, 0)
                times.append((time.perf_counter() - t0) / 2)
            out[("p2p", n)] = statistics.median(times[3:])
    for n in ALLREDUCE_BYTES:
        t = torch.zeros(n // 4)
        times = []
        for _ in range(repeats + 3):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        out[("allreduce", n)] = statistics.median(times[3:])
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def measure(world: int, repeats: int, port: int) -> dict[tuple[str, int], float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, repeats, queue)) for r in range(world)
    ]
    for p in procs:
        p.start()
    out = queue.get()
    for p in procs:
        p.join()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20, help="timed repetitions per point")
    args = ap.parse_args()
    # Each point: (seconds, coefficient of 1/bw, coefficient of latency)
    points: list[tuple[str, float, float, float]] = []
    for k, world in enumerate(RANKS):
        for (kind, n), t in sorted(measure(world, args.repeats, 29600 + k).items()):
            if kind == "p2p":
                points.append((f"p2p {n >> 10} KiB", t, n, 1.0))
            else:
                p = world
                points.append(
                    (f"all-reduce {n >> 20} MiB, {p} ranks", t, 2 * (p - 1) / p * n, 2 * (p - 1))
                )
    # Latency: the quickest one-way P2P (small messages are latency-bound; the box is shared, so
    # noise only ever adds time). Bandwidth: from the gradient all-reduces, which move the bytes
    # that matter (MBs per step, vs KBs per activation): the median over points of what each
    # implies with that latency held.
    latency = min(x[1] for x in points if x[0].startswith("p2p"))
    implied = [x[2] / (x[1] - x[3] * latency) for x in points if x[0].startswith("all-reduce")]
    inv_bw = 1 / statistics.median(b for b in implied if b > 0)
    print(f"{'point':32s} {'measured':>10s} {'fitted':>10s}")
    for name, secs, cb, cl in points:
        fit = cb * inv_bw + cl * latency
        print(f"{name:32s} {secs * 1e3:8.3f} ms {fit * 1e3:8.3f} ms  {fit / secs - 1:+.0%}")
    print(f"fit: {1 / inv_bw / 1e9:.2f} GB/s, latency {latency * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
