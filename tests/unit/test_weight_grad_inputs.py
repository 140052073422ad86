"""What torch keeps between a split backward's I and W, measured against the model spec."""

import pytest
import torch
from torch.distributed.pipelining._backward import stage_backward_input

from hetpp.runtime.model import build_layer
from hetpp.specs import PRESETS
from hetpp.specs.model import ModelSpec

SEQ, BATCH = 8, 2


def _kept_elements(layer: torch.nn.Module, x: torch.Tensor, last: bool) -> tuple[int, bool]:
    """Elements of the gradients `stage_backward_input` keeps for the W (each storage once), and
    whether the output gradient passed in is one of them."""
    x = x.requires_grad_()
    out = layer(x)
    # the last stage's output is the loss (torch passes no output gradient)
    loss = [out.float().square().sum()]
    outputs, grads = (loss, None) if last else ([out], [torch.ones_like(out)])
    _, groups = stage_backward_input(outputs, grads, [x], layer.parameters())
    storages = {
        g.untyped_storage().data_ptr(): g.numel()
        for group in groups
        for grad_inputs in group.get("grads") or ()
        for g in grad_inputs or ()
        if g is not None
    }
    aliased = not last and grads[0].untyped_storage().data_ptr() in storages
    return sum(storages.values()), aliased


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt"])
def test_spec_counts_what_stage_backward_input_keeps(name):
    torch.manual_seed(0)
    c = PRESETS[name]
    spec = ModelSpec(config=c, seq_len=SEQ, dtype_bytes=4)
    h = c.hidden_size
    block, head = spec.layers[1], spec.layers[-1]
    x = torch.randn(BATCH, SEQ, h)
    for index, layer in ((1, block), (c.num_layers + 1, head)):
        built = build_layer(c, index, seed=0, dtype=torch.float32)
        kept, aliased = _kept_elements(built, x.clone(), last=layer.kind == "head")
        assert kept == BATCH * layer.weight_grad_input_bytes_per_sample // 4, (name, layer.kind)
        # a block's down projection's output gradient is the block's: on a stage's last block
        # the receive buffer (`cost.memory._pending_bytes` charges it there, once)
        assert aliased == (layer.kind == "block")
    # the figures the benchmark notes measured: per token 11.5 h (llama) or 11.0 h (gpt) a
    # block, the vocabulary plus the final norm for the head
    per_token = block.weight_grad_input_bytes_per_sample / (SEQ * 4 * h)
    assert per_token == {"tiny-llama": 11.5, "tiny-gpt": 11.0}[name]
    assert head.weight_grad_input_bytes_per_sample == SEQ * 4 * (c.padded_vocab + h)
    assert spec.layers[0].weight_grad_input_bytes_per_sample == 0  # torch skips I on stage 0


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt"])
def test_mixed_precision_is_charged_what_stage_backward_input_keeps(name):
    # bf16 autocast over float32 parameters: the weighted ops' output gradients are bf16, but
    # an RMSNorm's float32 weight promotes its output, and so the gradient kept, to float32
    # (`LayerSpec.weight_grad_input_rms_norm_bytes_per_sample`); GPT's LayerNorm stays bf16.
    from test_sim_plan import EXAMPLES

    from hetpp.cost.compute import CostModel
    from hetpp.specs import TrainSpec
    from hetpp.specs.cluster import load_cluster

    torch.manual_seed(0)
    c = PRESETS[name]
    spec = ModelSpec(config=c, seq_len=SEQ, dtype_bytes=2)
    train = TrainSpec(global_batch=BATCH, seq_len=SEQ, precision="bf16")
    cm = CostModel(spec, train, load_cluster(EXAMPLES / "a100-v100.yaml"))
    costs = cm.layer_costs(cm.cluster.gpu(0), BATCH, False)
    built = build_layer(c, 1, seed=0, dtype=torch.float32)
    x = torch.randn(BATCH, SEQ, c.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = built(x)
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], built.parameters())
    storages = {
        g.untyped_storage().data_ptr(): g.untyped_storage().nbytes()
        for group in groups
        for grad_inputs in group.get("grads") or ()
        for g in grad_inputs or ()
        if g is not None
    }
    assert sum(storages.values()) == costs.weight_grad_input_bytes[1]
    promoted = spec.layers[1].weight_grad_input_rms_norm_bytes_per_sample
    assert (promoted > 0) == (name == "tiny-llama")
