"""What a recomputed stage keeps and re-runs under a split backward (I then W), measured in torch.

Findings (docs/benchmarks-planner.md, "Recomputation under a split backward"): between I and W a
recomputed stage keeps exactly what it keeps without recomputation less the saved activations
(the weighted ops' output gradients, `LayerSpec.weight_grad_input_bytes_per_sample`: the charge
is right), but its W runs each block's forward again once per parameter group (each group's
`torch.autograd.grad` is a graph task of its own, and non-reentrant checkpoint recomputes per
graph task), and the recomputed tensors live until the W ends: the W's transient exceeds what
the stage holds without recomputation. So the planner does not try split-backward schedules on
recomputing plans (`Problem.schedules_to_try`), and the runtime runs each W in one
`GraphExecGroup` (`runtime.stage.TimedStage`), which recomputes each block once per W.
"""

import contextlib
import gc
import weakref

import pytest
import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import GraphExecGroup

from hetpp.runtime.model import StageModule
from hetpp.runtime.recompute import recompute_blocks
from hetpp.specs import PRESETS
from hetpp.specs.model import ModelSpec

SEQ, BATCH = 8, 2
START, END = 1, 3  # two blocks: neither a pipeline's first stage nor its last


class _LiveElements(TorchDispatchMode):
    """Elements of the storages the ops made that are still alive (each storage once), and
    their peak since `reset`."""

    def __init__(self, exclude: set[int]):
        super().__init__()
        self.exclude, self.live, self.now, self.peak = exclude, {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out

    def _add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.exclude or storage.nbytes() == 0:
            return
        entry = self.live.setdefault(key, [0, storage.nbytes() // t.element_size()])
        if entry[0] == 0:
            self.now += entry[1]
            self.peak = max(self.peak, self.now)
        entry[0] += 1
        weakref.finalize(t, self._drop, key).atexit = False

    def _drop(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.live[key]

    def reset(self) -> int:
        gc.collect()
        self.peak = self.now
        return self.now


def _split_backward(name: str, recompute: bool, grouped: bool = False) -> dict:
    """One micro-batch through a stage of two blocks: live elements after F, after I and at W's
    peak; the forwards each step runs; the elements of the gradients kept for W; the weight
    gradients. `grouped`: W in one `GraphExecGroup`, as `runtime.stage.TimedStage` runs it."""
    torch.manual_seed(0)
    stage = StageModule(PRESETS[name], START, END, seed=0, dtype=torch.float32)
    runs = [0]
    for i in range(START, END):
        layer = stage.layer(i)
        forward = layer.forward

        def counted(x, forward=forward):
            runs[0] += 1
            return forward(x)

        layer.forward = counted
    if recompute:
        recompute_blocks(stage)
    x = torch.randn(BATCH, SEQ, stage.config.hidden_size).requires_grad_()
    params = {p.untyped_storage().data_ptr() for p in stage.parameters()}
    meter = _LiveElements(params | {x.untyped_storage().data_ptr()})
    with meter:
        out = stage(x)
    f = meter.reset()
    f_runs = runs[0]
    with meter:
        dx, groups = stage_backward_input([out], [torch.ones_like(out)], [x], stage.parameters())
    del dx  # sent to the previous stage
    x.grad = None
    i = meter.reset()
    i_runs = runs[0] - f_runs
    kept = {
        g.untyped_storage().data_ptr(): g.numel()
        for group in groups
        for grads in group["grads"]
        for g in grads or ()
        if g is not None
    }
    num_groups = len(groups)
    with meter, GraphExecGroup() if grouped else contextlib.nullcontext():
        stage_backward_weight(stage.parameters(), groups)
    return {
        "grads": [p.grad for p in stage.parameters()],
        "after_f": f,
        "i_adds": i - f,
        "w_peak": meter.peak - i,
        "kept": sum(kept.values()),
        "runs": f_runs,
        "i_runs": i_runs,
        "w_runs": runs[0] - f_runs - i_runs,
        "groups": num_groups,
    }


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt"])
def test_recomputed_stage_between_i_and_w(name):
    off, on = _split_backward(name, False), _split_backward(name, True)
    spec = ModelSpec(config=PRESETS[name], seq_len=SEQ, dtype_bytes=4)
    charged = sum(spec.layers[i].weight_grad_input_bytes_per_sample for i in range(START, END))
    # I to W: recomputation adds nothing to what I leaves (the recomputed activations die in
    # I), and what torch keeps for W is the charged count, with recomputation or without
    assert on["i_adds"] == off["i_adds"] == on["kept"] == off["kept"] == BATCH * charged // 4
    # without recomputation the forward runs once; with it, once more in I and once per
    # parameter group in W (7 per Llama block, 6 per GPT block)
    assert (off["runs"], off["i_runs"], off["w_runs"]) == (2, 0, 0)
    assert (on["runs"], on["i_runs"]) == (2, 2)
    assert on["w_runs"] == on["groups"] == 2 * {"tiny-llama": 7, "tiny-gpt": 6}[name]
    # and the W's recomputed tensors outlive their use: its transient exceeds both the W's
    # without recomputation and all the stage holds per micro-batch without recomputation
    assert on["w_peak"] > off["w_peak"] + off["after_f"]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt"])
def test_one_recomputation_per_weight_grad_step_in_a_group(name):
    plain, grouped = _split_backward(name, True), _split_backward(name, True, grouped=True)
    # in one GraphExecGroup, W recomputes each block once, and the gradients are the same
    assert grouped["w_runs"] == END - START
    assert all(torch.equal(a, b) for a, b in zip(plain["grads"], grouped["grads"], strict=True))
    assert grouped["w_peak"] < plain["w_peak"]
