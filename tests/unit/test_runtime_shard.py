"""The flat shard layout of one bucket over its owners (no process group needed)."""

import torch

from hetpp.runtime.shard import BucketShard, ShardedStep


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [
        torch.nn.Parameter(torch.randn(*s, dtype=torch.float64)) for s in ((3, 4), (5,), (2, 3))
    ]


def _index(params, p) -> int:
    return next(i for i, q in enumerate(params) if q is p)


def test_shards_cover_every_element_once_and_pad_the_last():
    params = _params()  # 12 + 5 + 6 = 23 elements over 3 owners: shards of 8, the last padded
    owners = (7, 2, 5)
    shards = [BucketShard(params, owners, r) for r in owners]
    assert [(s.size, s.padded, s.numel) for s in shards] == [(8, 24, 23)] * 3
    spans = [
        [(_index(params, p.param), p.start, p.end, p.offset) for p in s.pieces] for s in shards
    ]
    assert spans == [
        [(0, 0, 8, 0)],
        [(0, 8, 12, 0), (1, 0, 4, 4)],
        [(1, 4, 5, 0), (2, 0, 6, 1)],
    ]
    for s in shards:  # pieces are views: stepping them writes the parameters
        for p in s.pieces:
            assert p.view.data_ptr() == p.param.data_ptr() + p.start * 8
    flat = shards[0].flat(params, torch.float64)
    assert flat.shape == (24,) and flat[23] == 0
    assert torch.equal(flat[:12], params[0].detach().reshape(-1))
    mine = shards[2].shard([p.view for p in shards[2].pieces], torch.float64)
    assert torch.equal(mine, torch.cat([flat[16:23], torch.zeros(1, dtype=torch.float64)]))
    back = shards[1].unflatten(flat)
    assert all(torch.equal(b, p.detach()) for b, p in zip(back, params))


def test_pieces_keep_their_parameters_decay_group():
    params = _params()
    step = ShardedStep([(BucketShard(params[:2], (0, 1), 1), None)])
    whole = torch.nn.Parameter(torch.zeros(4, 4))
    got, decays = step.optimizer_params([whole, *params[:2]])
    assert got[0] is whole and len(got) == 3  # the unsharded one whole, then two pieces
    assert [decays[p] for p in got] == [True, True, False]  # piece of the 3x4 matrix decays


def test_contract_runs_fp32_sharded_plans_and_refuses_mixed_precision_ones():
    import pytest

    from hetpp.runtime.contract import check_executable
    from hetpp.specs import PRESETS, Plan
    from hetpp.specs.errors import SpecError

    def plan(precision: str) -> Plan:
        one = {"stages": [{"devices": [0], "layers": [0, 6]}], "micro_batch_size": 1}
        two = {"stages": [{"devices": [1], "layers": [0, 6]}], "micro_batch_size": 1}
        return Plan(
            train={"global_batch": 2, "seq_len": 16, "precision": precision},
            model=PRESETS["tiny-llama"],
            sharding="optimizer",
            pipelines=[{**one, "num_micro_batches": 1}, {**two, "num_micro_batches": 1}],
        )

    check_executable(plan("fp32"))
    check_executable(plan("fp32"), fp64=True)
    for precision in ("bf16", "fp16"):
        with pytest.raises(SpecError, match="fp32 master weights") as e:
            check_executable(plan(precision))
        assert e.value.field == "sharding"


class _Work:
    """A finished all-gather that records when it is waited for."""

    def __init__(self, log: list, i: int):
        self.log, self.i = log, i

    def wait(self) -> None:
        self.log.append(("wait", self.i))


def test_a_forward_reads_its_buckets_gathered_values_never_stale_ones(monkeypatch):
    # Rank 0 of two owners per bucket: `gather` only issues the all-gathers; each module's
    # forward pre-hook waits for its bucket's and writes the other owner's half (here 7s)
    # before the forward reads it, the second module's first; a recomputed forward and
    # `finish` after it change nothing.
    import hetpp.runtime.shard as shard

    log: list = []

    def all_gather_single(full, mine, group, async_op):
        assert async_op
        full.copy_(torch.cat([mine, torch.full_like(mine, 7.0)]))
        log.append(("issue", group))
        return _Work(log, group)

    monkeypatch.setattr(shard.dist, "all_gather_single", all_gather_single)
    mods = [torch.nn.Linear(2, 2, dtype=torch.float64) for _ in range(2)]
    params = [list(m.parameters()) for m in mods]
    step = ShardedStep(
        [(BucketShard(ps, (0, 1), 0), i) for i, ps in enumerate(params)], [[m] for m in mods]
    )
    seen = []
    for m in mods:  # after the step's own hook: what the forward reads
        m.register_forward_pre_hook(lambda m, _: seen.append(m.weight.detach().clone()))
    step.gather()
    assert log == [("issue", 0), ("issue", 1)] and step.written == []
    assert all((m.weight != 7.0).all() for m in mods)  # nothing written before a forward
    x = torch.ones(1, 2, dtype=torch.float64)
    mods[1](x)
    assert step.written == [1] and log[-1] == ("wait", 1)
    assert torch.equal(seen[0].reshape(-1)[:3], mods[1].weight.detach().reshape(-1)[:3])
    assert (seen[0].reshape(-1)[3:] == 7.0).all() and mods[1].bias.eq(7.0).all()
    assert (mods[0].weight != 7.0).all()  # the other bucket still in flight, not written
    mods[0](x)
    mods[1](x)  # recomputed: no second wait
    step.finish()
    assert step.written == [1, 0] and [e for e in log if e[0] == "wait"] == [
        ("wait", 1),
        ("wait", 0),
    ]
    assert (seen[1].reshape(-1)[3:] == 7.0).all() and step.pending == {}
