"""Reading Hugging Face folders: a sharded index works, a rank reads only its own layers' tensors,
and a folder whose model is not the plan's is refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from hfmodels import make_hf_model
from safetensors import safe_open

from hetpp.runtime.hf_weights import INDEX_FILE, SINGLE_FILE, HfFolder, export_stage, load_stage
from hetpp.runtime.model import StageModule
from hetpp.specs import PRESETS, SpecError
from hetpp.specs.presets import check_folder_model, load_model_config


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    model = make_hf_model("llama", folder)
    model.save_pretrained(folder, max_shard_size="40KB")  # several files and an index
    (folder / "model.safetensors").unlink(missing_ok=True)
    return folder, model


def test_a_sharded_folder_loads_and_a_stage_reads_only_its_layers(sharded, monkeypatch):
    folder, model = sharded
    assert len(set(json.loads((folder / INDEX_FILE).read_text())["weight_map"].values())) > 1
    c = load_model_config(folder)
    read: list[str] = []
    get = HfFolder.get
    monkeypatch.setattr(HfFolder, "get", lambda self, name: read.append(name) or get(self, name))
    stage = StageModule(c, 2, 4, seed=0, dtype=torch.float32)  # blocks 1 and 2 (HF layers 1, 2)
    load_stage(stage, folder)
    assert read and all(n.startswith(("model.layers.1.", "model.layers.2.")) for n in read)
    hf = dict(model.named_parameters())
    assert torch.equal(stage.layer(2).mlp.down.weight, hf["model.layers.1.mlp.down_proj.weight"])


def test_a_folder_for_another_model_is_refused(sharded):
    folder, _ = sharded
    with pytest.raises(SpecError, match="differs from the plan's: vocab_size") as e:
        check_folder_model(PRESETS["tiny-llama"], folder)
    assert e.value.file == str(folder / "config.json")


def test_a_missing_tensor_names_it(tmp_path, sharded):
    folder, _ = sharded
    index = json.loads((folder / INDEX_FILE).read_text())
    del index["weight_map"]["model.norm.weight"]
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    c = load_model_config(tmp_path)
    head = StageModule(c, c.num_layers + 1, c.num_layers + 2, seed=0, dtype=torch.float32)
    with pytest.raises(SpecError, match=r"tensor model\.norm\.weight is missing"):
        load_stage(head, tmp_path)


def test_import_pads_the_vocabulary_and_export_drops_the_padding(sharded, tmp_path):
    folder, model = sharded
    c = load_model_config(folder)
    assert (c.vocab_size, c.padded_vocab) == (67, 128)
    full = StageModule(c, 0, c.num_layers + 2, seed=0, dtype=torch.float32)
    load_stage(full, folder)
    hf = dict(model.named_parameters())
    for w, name in (
        (full.layer(0).tok.weight, "model.embed_tokens.weight"),
        (full.layer(c.num_layers + 1).lm_head.weight, "lm_head.weight"),
    ):
        assert w.shape == (128, c.hidden_size) and not w[67:].any()
        assert torch.equal(w[:67], hf[name])
    export_stage(full, tmp_path / "out")
    with safe_open(tmp_path / "out" / SINGLE_FILE, "pt") as f:
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            assert torch.equal(f.get_tensor(name), hf[name])
