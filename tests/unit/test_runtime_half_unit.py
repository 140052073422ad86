"""The runtime at `layer_unit` half: a half-unit model is the block-unit one cut finer (the same
parameters under the same names inside their block, the same forward), and exports and imports
Hugging Face folders as the block-unit model does."""

from __future__ import annotations

import pytest
import torch

from hetpp.cli.main import main
from hetpp.runtime import checkpoint
from hetpp.runtime.hf_weights import SINGLE_FILE, export_stage, load_stage
from hetpp.runtime.model import BlockHalf, StageModule
from hetpp.runtime.recompute import recompute_blocks
from hetpp.specs import PRESETS

TINY = ["tiny-gpt", "tiny-llama"]


def _halved(name: str):
    return PRESETS[name].model_copy(update={"layer_unit": "half"})


def _full(c, seed: int = 5) -> StageModule:
    return StageModule(c, 0, c.layer_list_len, seed=seed, dtype=torch.float64)


def _by_block_unit_name(stage: StageModule) -> dict[str, torch.Tensor]:
    """Every parameter of a whole-model stage, named as in the block-unit model."""
    c = stage.config
    out = {}
    for i in range(c.layer_list_len):
        kind = c.layer_kind(i)
        index = {"embedding": 0, "head": c.num_layers + 1}.get(kind, c.block_of(i) + 1)
        for n, p in stage.layer(i).named_parameters(remove_duplicate=False):
            assert f"{index}.{n}" not in out, (i, n)
            out[f"{index}.{n}"] = p
    return out


@pytest.mark.parametrize("name", TINY)
def test_a_half_unit_model_is_the_block_unit_model(name):
    half_c = _halved(name)
    blocks, halves = _full(PRESETS[name]), _full(half_c)
    assert half_c.layer_list_len == 2 * half_c.num_layers + 2
    assert [type(halves.layer(i)).__name__ for i in (1, 2)] == ["BlockHalf", "BlockHalf"]
    want, got = _by_block_unit_name(blocks), _by_block_unit_name(halves)
    assert set(got) == set(want)
    assert all(torch.equal(got[n], want[n]) for n in want)
    x = torch.randint(0, half_c.vocab_size, (2, 16))
    assert torch.equal(halves(x), blocks(x))


def test_each_half_holds_only_its_own_part_of_the_block():
    c = _halved("tiny-llama")
    attn, mlp = _full(c).layer(3), _full(c).layer(4)
    assert isinstance(attn, BlockHalf) and isinstance(mlp, BlockHalf)
    assert {n.split(".")[0] for n, _ in attn.named_parameters()} == {"norm1", "attn"}
    assert {n.split(".")[0] for n, _ in mlp.named_parameters()} == {"norm2", "mlp"}


def test_recomputation_wraps_every_half_and_not_the_ends():
    c = _halved("tiny-gpt")
    stage = StageModule(c, 0, 4, seed=0, dtype=torch.float64)
    assert recompute_blocks(stage) == [1, 2, 3]
    head_stage = StageModule(c, 6, c.layer_list_len, seed=0, dtype=torch.float64)
    assert recompute_blocks(head_stage) == [6, 7, 8]


@pytest.mark.parametrize("name", TINY)
def test_export_writes_the_block_unit_files_and_a_half_stage_imports_them(name, tmp_path):
    c = _halved(name)
    export_stage(_full(PRESETS[name]), tmp_path / "blocks")
    export_stage(_full(c), tmp_path / "halves")
    for f in (SINGLE_FILE, "config.json"):
        assert (tmp_path / "halves" / f).read_bytes() == (tmp_path / "blocks" / f).read_bytes()
    # A stage cut mid-block (the MLP half of block 0 through the attention half of block 2)
    # reads exactly its own halves' tensors.
    part = StageModule(c, 2, 6, seed=99, dtype=torch.float64)
    load_stage(part, tmp_path / "blocks")
    want = _by_block_unit_name(_full(c))
    for i in range(2, 6):
        for n, p in part.layer(i).named_parameters():
            assert torch.equal(p, want[f"{c.block_of(i) + 1}.{n}"]), (i, n)


def test_hetpp_export_of_a_half_unit_checkpoint_writes_the_block_unit_files(tmp_path):
    c = _halved("tiny-llama")
    model = StageModule(c, 0, c.layer_list_len, seed=5, dtype=torch.float32)
    meta = checkpoint.CheckpointMeta(
        step=1, samples=8, seed=5, optimizer="sgd", model=c.model_dump(mode="json")
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    layers = list(range(c.layer_list_len))
    checkpoint.save(tmp_path / "ckpt", meta, model, opt, layers, rank=0, barrier=lambda: None)
    argv = ["export", "--checkpoint-dir", str(tmp_path / "ckpt"), "--hf", str(tmp_path / "hf")]
    assert main(argv) == 0
    blocks = PRESETS["tiny-llama"]
    export_stage(StageModule(blocks, 0, blocks.layer_list_len, 5, torch.float32), tmp_path / "ref")
    for f in (SINGLE_FILE, "config.json"):
        assert (tmp_path / "hf" / f).read_bytes() == (tmp_path / "ref" / f).read_bytes()
