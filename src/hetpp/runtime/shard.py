"""ZeRO-1 over block owners (`Plan.sharding = "optimizer"`): each gradient bucket's optimizer
work split over its owners, one per pipeline.

A bucket's parameters, flattened in bucket order (the same order on every owner) and padded with
zeros to a multiple of its P owners, are cut into P equal shards; the owner at place i of the
bucket's owner list (pipeline order) owns elements [i·S, (i+1)·S). After backward the bucket is
reduce-scattered (`reduce_scatter_single`: gloo and NCCL both have it), so each owner holds the
summed gradient of its shard only; the optimizer steps that shard; then the owners all-gather
(`all_gather_single`) the updated parameters, in forward order and overlapped with the next
step's forward (`ShardedStep`).

The shard of each parameter an owner overlaps is a `Piece`: a 1-d view into the parameter's own
storage, wrapped as a leaf the optimizer steps in place. So no copy of the weights is made, and
AdamW's moments exist for the shard only; a piece keeps its parameter's weight-decay group.
AdamW is elementwise, so stepping pieces is the same arithmetic as stepping whole parameters.

Checkpoints stay plan-independent: before a save the owners all-gather their moments into the
whole per-parameter state (`full_state`), which pipeline 0's owner writes as an unsharded run
would; a load reads the whole state and each owner keeps its slice (`load_state`). So a sharded
run resumes unsharded and the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hetpp.runtime.optim import MasterWeights


@dataclass(frozen=True)
class Piece:
    """This owner's part of one parameter: elements [start, end) of its flattening."""

    param: torch.nn.Parameter
    start: int
    end: int
    offset: int
    """Where the piece starts inside the owner's shard."""
    view: torch.nn.Parameter
    """The elements as a 1-d leaf over the parameter's storage: what the optimizer steps."""


class BucketShard:
    """One bucket's flat layout over its owners and this owner's pieces of it."""

    def __init__(self, params: Sequence[torch.nn.Parameter], owners: Sequence[int], rank: int):
        self.params = list(params)
        self.numel = sum(p.numel() for p in self.params)
        self.size = math.ceil(self.numel / len(owners))
        """Elements per shard (the last owners' shards end in padding)."""
        self.padded = self.size * len(owners)
        lo = owners.index(rank) * self.size
        hi = lo + self.size
        self.pieces: list[Piece] = []
        at = 0
        for p in self.params:
            a, b = max(lo, at), min(hi, at + p.numel())
            if a < b:
                view = torch.nn.Parameter(p.detach().view(-1)[a - at : b - at], requires_grad=False)
                self.pieces.append(Piece(p, a - at, b - at, a - lo, view))
            at += p.numel()

    def flat(self, tensors: Iterable[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The bucket's tensors (one per parameter) flattened and zero-padded."""
        flat = torch.cat([t.reshape(-1).to(dtype) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.padded - self.numel))

    def shard(self, tensors: Iterable[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """This owner's shard of per-piece tensors (zero padding where it has no piece)."""
        out = torch.zeros(self.size, dtype=dtype, device=self.params[0].device)
        for piece, t in zip(self.pieces, tensors):
            out[piece.offset : piece.offset + piece.end - piece.start] = t.reshape(-1)
        return out

    def scatter_grads(self, shard: torch.Tensor) -> None:
        """Give each piece its slice of the reduce-scattered gradient shard."""
        for piece in self.pieces:
            n = piece.end - piece.start
            piece.view.grad = shard[piece.offset : piece.offset + n].to(piece.view.dtype)

    def unflatten(self, full: torch.Tensor) -> list[torch.Tensor]:
        """A gathered flat buffer cut back into one tensor per parameter (views)."""
        parts = full[: self.numel].split([p.numel() for p in self.params])
        return [part.view_as(p) for part, p in zip(parts, self.params)]


@dataclass
class WholeState:
    """A stage's optimizer state per parameter, as an unsharded optimizer holds it: what
    `checkpoint.save` reads and `checkpoint.load` fills."""

    state: dict[torch.nn.Parameter, dict] = field(default_factory=dict)
    values: dict[torch.nn.Parameter, torch.Tensor] = field(default_factory=dict)
    """Half-precision parameters (`optim.MasterWeights`): each one's fp32 master, which a
    checkpoint stores in its place and a load fills."""
    dtype: torch.dtype | None = None
    """What a load gives the moments and `values`: the masters' dtype; None: the parameter's."""


class ShardedStep:
    """This rank's shards of every sharded bucket: the optimizer's parameters, the global norm
    over shards, the all-gather after the step, and whole-state checkpoints.

    The all-gathers overlap the next step's forward (Megatron's `overlap_param_gather`):
    `gather` issues them, in forward order (first layers first, `specs.plan.gather_order`: the
    shards come in that order, the same on every owner), and returns; a forward pre-hook on each
    module that reads a bucket's parameters (`readers`) waits for that bucket's all-gather and
    writes the gathered values before the forward runs (again in a recomputed forward: a no-op
    once written). Whatever reads the parameters outside a step calls `finish` first."""

    def __init__(
        self,
        shards: Sequence[tuple[BucketShard, dist.ProcessGroup]],
        readers: Sequence[Sequence[torch.nn.Module]] = (),
    ):
        self.shards = list(shards)
        self.sharded = {p for s, _ in self.shards for p in s.params}
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor, dist.Work]] = {}
        """Per shard index, its all-gather in flight: (own shard, gathered buffer, work)."""
        self.written: list[int] = []
        """Shard indices in the order their gathered values were written (tests read it)."""
        needs: dict[torch.nn.Module, list[int]] = {}
        for i, modules in enumerate(readers):
            for m in modules:
                needs.setdefault(m, []).append(i)
        for m, idx in needs.items():
            m.register_forward_pre_hook(lambda _m, _args, idx=idx: self.finish(idx))

    def pieces(self) -> list[Piece]:
        return [piece for s, _ in self.shards for piece in s.pieces]

    def optimizer_params(
        self, params: Iterable[torch.nn.Parameter]
    ) -> tuple[list[torch.nn.Parameter], dict[torch.nn.Parameter, bool]]:
        """What the optimizer steps: the stage's unsharded parameters (the tied weight) whole,
        and this rank's pieces of the rest; with each one's weight-decay flag (a piece decays as
        its parameter does: matrices only)."""
        whole = [p for p in params if p not in self.sharded]
        out = whole + [piece.view for piece in self.pieces()]
        decays = {p: p.ndim >= 2 for p in whole}
        decays.update({piece.view: piece.param.ndim >= 2 for piece in self.pieces()})
        return out, decays

    def gather(self) -> None:
        """Issue every bucket's all-gather of its updated parameters over its owners, in the
        shards' (forward) order, and return: `finish` (the readers' hooks) writes them."""
        self.finish()  # none in flight after a step's forward; kept safe for any caller
        self.written = []
        for i, (s, group) in enumerate(self.shards):
            dtype = s.params[0].dtype
            mine = s.shard([piece.view for piece in s.pieces], dtype)
            full = torch.empty(s.padded, dtype=dtype, device=mine.device)
            work = dist.all_gather_single(full, mine, group=group, async_op=True)
            self.pending[i] = (mine, full, work)

    def finish(self, shards: Iterable[int] | None = None) -> None:
        """Wait for the all-gathers of `shards` (default: all in flight), in issue order, and
        write each one's gathered values into its parameters; done ones are skipped."""
        todo = sorted(self.pending if shards is None else set(shards) & set(self.pending))
        with torch.no_grad():
            for i in todo:
                _, full, work = self.pending.pop(i)
                work.wait()
                s = self.shards[i][0]
                for p, value in zip(s.params, s.unflatten(full)):
                    p.copy_(value)
                self.written.append(i)

    def full_state(
        self,
        opt: torch.optim.Optimizer,
        params: Iterable[torch.nn.Parameter],
        masters: MasterWeights | None = None,
    ) -> WholeState:
        """Collective over every bucket's owners: the whole optimizer state of each of the
        stage's `params` (moments gathered from the shards; scalars such as Adam's step as they
        are), keyed by parameter, as an unsharded optimizer holds it; with `masters`, also each
        parameter's whole master (`WholeState.values`)."""
        self.finish()
        key = _keys(masters)
        out = whole_state(opt, (p for p in params if p not in self.sharded), masters)
        for s, group in self.shards:
            keys, scalars = _state_keys(opt, s, key)
            dtype = s.params[0].dtype if masters is None else masters.params[0].dtype
            gathered = {}
            for k in keys + (["master"] if masters is not None else []):
                got = [
                    key(x.view) if k == "master" else opt.state[key(x.view)][k] for x in s.pieces
                ]
                mine = s.shard(got, dtype)
                full = torch.empty(s.padded, dtype=dtype, device=mine.device)
                dist.all_gather_single(full, mine, group=group)
                gathered[k] = s.unflatten(full)
            for i, p in enumerate(s.params):
                # Own scalars per parameter: AdamW increments `step` in place, once per holder.
                own = {k: v.clone() if torch.is_tensor(v) else v for k, v in scalars.items()}
                out.state[p] = {**own, **{k: v[i] for k, v in gathered.items() if k in keys}}
                if masters is not None:
                    out.values[p] = gathered["master"][i]
        return out

    def load_state(
        self, opt: torch.optim.Optimizer, whole: WholeState, masters: MasterWeights | None = None
    ) -> None:
        """Take a whole-parameter state (as `checkpoint.load` fills it): unsharded parameters
        keep theirs, each piece its slice of its parameter's; with `masters`, each master its
        target's value from `whole.values`."""
        state = {p: st for p, st in whole.state.items() if p not in self.sharded}
        values = {p: v for p, v in whole.values.items() if p not in self.sharded}
        for piece in self.pieces():
            st = whole.state.get(piece.param)
            if st is not None:
                state[piece.view] = {
                    k: (v.reshape(-1)[piece.start : piece.end] if v.ndim else v).clone()
                    if torch.is_tensor(v)
                    else v
                    for k, v in st.items()
                }
            if piece.param in whole.values:
                values[piece.view] = whole.values[piece.param].reshape(-1)[piece.start : piece.end]
        if masters is not None:
            masters.load_state(opt, state, values)
        else:
            opt.state.update(state)


def whole_state(
    opt: torch.optim.Optimizer,
    params: Iterable[torch.nn.Parameter],
    masters: MasterWeights | None = None,
) -> WholeState:
    """The optimizer state of unsharded `params`, keyed by parameter (with `masters`: each
    one's master's state, and the master itself in `WholeState.values`)."""
    key = _keys(masters)
    out = WholeState()
    for p in params:
        if key(p) in opt.state:
            out.state[p] = opt.state[key(p)]
        if masters is not None:
            out.values[p] = masters.master[p]
    return out


def _keys(masters: MasterWeights | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The tensor the optimizer steps for a parameter or piece: itself, or its master."""
    return (lambda t: t) if masters is None else masters.master.__getitem__


def _state_keys(
    opt: torch.optim.Optimizer, s: BucketShard, key: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[list[str], dict]:
    """The per-element state keys of a bucket's pieces and their shared scalars. Every owner
    has stepped the same pieces the same number of times, so the keys agree; an owner without a
    piece (a bucket smaller than its owner count) takes the optimizer's own key list."""
    if s.pieces and key(s.pieces[0].view) in opt.state:
        st = opt.state[key(s.pieces[0].view)]
        keys = [k for k, v in st.items() if torch.is_tensor(v) and v.ndim]
        return keys, {k: v for k, v in st.items() if k not in keys}
    return (["exp_avg", "exp_avg_sq"] if isinstance(opt, torch.optim.AdamW) else []), {}
