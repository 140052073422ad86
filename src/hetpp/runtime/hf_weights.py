"""Hugging Face weights in and out: a model folder's safetensors to hetpp layers, and back.

hetpp fuses q/k/v into one `attn.qkv` projection and keeps `nn.Linear` layouts; each family's
names and layouts are mapped here, one `Group` per hetpp parameter (or per HF tensor, when one HF
tensor holds several hetpp ones, like Phi-3's `gate_up_proj`). Reading is lazy: `safe_open` maps
the files and a rank reads only the tensors of its own layers. The embedding and head matrices are
padded to `padded_vocab` rows in hetpp: import fills the real rows and zeroes the padding, export
writes the real rows only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from hetpp.runtime.model import StageModule, vocab_rows
from hetpp.specs.errors import SpecError
from hetpp.specs.hf_config import to_hf
from hetpp.specs.model import ModelConfig
from hetpp.specs.presets import check_folder_model

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class Group:
    """hetpp parameters (names inside their layer) that are, concatenated along dim 0, the HF
    tensors `hf` concatenated along dim 0 (after `transpose` / the NeoX head interleave)."""

    params: tuple[str, ...]
    hf: tuple[str, ...]
    hf_rows: tuple[int, ...] = ()
    """Rows of each HF tensor, when there are several (to split on export)."""
    transpose: bool = False
    """GPT-2's Conv1D stores weights as [in, out]."""
    neox_heads: int = 0
    """GPT-NeoX's fused qkv is ordered (head, q/k/v, dim); hetpp's is (q/k/v, head, dim)."""


# hetpp module -> HF module, inside one block, per family.
_BLOCK = {
    "llama": {
        "norm1": "input_layernorm",
        "norm2": "post_attention_layernorm",
        "attn.out": "self_attn.o_proj",
        "mlp.gate": "mlp.gate_proj",
        "mlp.up": "mlp.up_proj",
        "mlp.down": "mlp.down_proj",
    },
    "gpt2": {
        "norm1": "ln_1",
        "norm2": "ln_2",
        "attn.qkv": "attn.c_attn",
        "attn.out": "attn.c_proj",
        "mlp.up": "mlp.c_fc",
        "mlp.down": "mlp.c_proj",
    },
    "gpt_neox": {
        "norm1": "input_layernorm",
        "norm2": "post_attention_layernorm",
        "attn.qkv": "attention.query_key_value",
        "attn.out": "attention.dense",
        "mlp.up": "mlp.dense_h_to_4h",
        "mlp.down": "mlp.dense_4h_to_h",
    },
}
_BLOCK["gemma2"] = _BLOCK["llama"] | {
    "post_attn_norm": "post_attention_layernorm",
    "norm2": "pre_feedforward_layernorm",
    "post_mlp_norm": "post_feedforward_layernorm",
}
# (prefix of blocks, embedding tensors, final norm, lm head)
_OUTER = {
    "llama": ("model.layers", {"tok": "model.embed_tokens"}, "model.norm", "lm_head"),
    "gpt2": (
        "transformer.h",
        {"tok": "transformer.wte", "pos": "transformer.wpe"},
        "transformer.ln_f",
        "lm_head",
    ),
    "gpt_neox": (
        "gpt_neox.layers",
        {"tok": "gpt_neox.embed_in"},
        "gpt_neox.final_layer_norm",
        "embed_out",
    ),
}


def hf_family(c: ModelConfig) -> str:
    """The HF architecture a config is read from and written as."""
    if c.hf_model_type is not None:
        return c.hf_model_type
    return "gpt2" if c.family == "gpt" else "llama"


def _names(family: str) -> tuple[dict, tuple]:
    base = family if family in _BLOCK else "llama"
    return _BLOCK[base], _OUTER.get(family, _OUTER["llama"])


def layer_groups(c: ModelConfig, index: int, params: list[str]) -> list[Group]:
    """The groups covering layer `index`'s hetpp parameters `params` (their names in the layer)."""
    family = hf_family(c)
    block, (blocks, emb, norm, head) = _names(family)
    if index == 0:
        return [Group((p,), (f"{emb[p.split('.')[0]]}.weight",)) for p in params]
    if index == c.head_index:
        return [
            Group((p,), (f"{head if p.startswith('lm_head') else norm}.{p.split('.')[-1]}",))
            for p in params
        ]
    pre = f"{blocks}.{c.block_of(index)}"  # a half maps to its block's names
    out = []
    for p in params:
        module, kind = p.rsplit(".", 1)
        if family == "phi3" and module in ("mlp.gate", "mlp.up"):
            if module == "mlp.gate":  # gate and up are the two halves of gate_up_proj
                hf = (f"{pre}.mlp.gate_up_proj.{kind}",)
                out.append(Group((f"mlp.gate.{kind}", f"mlp.up.{kind}"), hf))
            continue
        if module == "attn.qkv" and family == "phi3":
            out.append(Group((p,), (f"{pre}.self_attn.qkv_proj.{kind}",)))
        elif module == "attn.qkv" and module not in block:
            q, kv = c.q_dim, c.kv_heads * c.head_dim
            hf = tuple(f"{pre}.self_attn.{x}_proj.{kind}" for x in "qkv")
            out.append(Group((p,), hf, hf_rows=(q, kv, kv)))
        else:
            conv1d = family == "gpt2" and kind == "weight" and not module.startswith("norm")
            neox = c.num_heads if family == "gpt_neox" and module == "attn.qkv" else 0
            out.append(Group((p,), (f"{pre}.{block[module]}.{kind}",), (), conv1d, neox))
    return out


def _neox_order(x: torch.Tensor, heads: int, to_hf: bool) -> torch.Tensor:
    shape = (3, heads) if to_hf else (heads, 3)
    rest = x.shape[1:]
    y = x.reshape(*shape, x.shape[0] // (3 * heads), *rest).transpose(0, 1)
    return y.reshape(x.shape)


def _from_hf(g: Group, tensors: list[torch.Tensor]) -> torch.Tensor:
    full = torch.cat([t.T if g.transpose else t for t in tensors])
    return _neox_order(full, g.neox_heads, to_hf=False) if g.neox_heads else full


def _to_hf(g: Group, params: list[torch.Tensor]) -> list[torch.Tensor]:
    full = torch.cat(params)
    if g.neox_heads:
        full = _neox_order(full, g.neox_heads, to_hf=True)
    parts = list(full.split(g.hf_rows)) if g.hf_rows else [full]
    return [p.T.contiguous() if g.transpose else p.contiguous() for p in parts]


class HfFolder:
    """Lazy access to the tensors of a Hugging Face model folder (one file or a sharded index)."""

    def __init__(self, folder: str | Path):
        self.root = Path(folder)
        index, single = self.root / INDEX_FILE, self.root / SINGLE_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                self.where = {k: self.root / v for k, v in weight_map.items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                raise SpecError(
                    "expected a JSON object with a weight_map", file=str(index)
                ) from None
        elif single.is_file():
            with safe_open(single, "pt") as f:
                self.where = dict.fromkeys(f.keys(), single)
        else:
            raise SpecError(f"no {SINGLE_FILE} or {INDEX_FILE}", file=str(self.root))
        self._open: dict[Path, object] = {}

    def get(self, name: str) -> torch.Tensor:
        # Checkpoints saved from a base model (GPT-2 on the Hub) lack the `transformer.` prefix.
        key = name if name in self.where else name.split(".", 1)[1]
        if key not in self.where:
            raise SpecError(f"tensor {name} is missing", file=str(self.root))
        path = self.where[key]
        if path not in self._open:
            self._open[path] = safe_open(path, "pt")
        return self._open[path].get_tensor(key)


@torch.no_grad()
def load_stage(stage: StageModule, folder: str | Path) -> None:
    """Copy the stage's layers (and a tied head's copy of the embedding) from an HF folder."""
    check_folder_model(stage.config, folder)
    src, c = HfFolder(folder), stage.config
    for i in range(stage.start, stage.end):
        layer = stage.layer(i)
        named = dict(layer.named_parameters(remove_duplicate=False))
        for g in layer_groups(c, i, [n for n, _ in stage.own_parameters(i)]):
            value = _from_hf(g, [src.get(n) for n in g.hf])
            rows = [vocab_rows(c, name, named[name]) for name in g.params]
            for name, part, n in zip(g.params, value.split(rows), rows):
                _copy_padded(named[name], part, n, g, folder)
    tied = stage.tied_weight()
    if tied is not None and stage.start != 0:
        (g,) = layer_groups(c, 0, ["tok.weight"])
        _copy_padded(tied, src.get(g.hf[0]), c.vocab_size, g, folder)


def _copy_padded(
    p: torch.Tensor, value: torch.Tensor, rows: int, g: Group, folder: str | Path
) -> None:
    """p's first `rows` rows from `value`, the rest (vocabulary padding) zero."""
    if value.shape != (rows, *p.shape[1:]):
        raise SpecError(
            f"tensor {g.hf[0]} has shape {tuple(value.shape)}, expected {(rows, *p.shape[1:])}",
            file=str(folder),
        )
    p.zero_()
    p[:rows].copy_(value)


def export_stage(stage: StageModule, out: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write a whole-model stage as an HF folder: config.json and model.safetensors."""
    c = stage.config
    if (stage.start, stage.end) != (0, c.layer_list_len):
        raise ValueError("export needs every layer of the model")
    tensors: dict[str, torch.Tensor] = {}
    for i in range(stage.start, stage.end):
        own = dict(stage.own_parameters(i))
        for g in layer_groups(c, i, list(own)):
            real = [own[p][: vocab_rows(c, p, own[p])].detach().cpu() for p in g.params]
            parts = _to_hf(g, real)
            tensors |= {n: t.to(dtype) if dtype else t for n, t in zip(g.hf, parts)}
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, root / SINGLE_FILE, metadata={"format": "pt"})
    cfg = to_hf(c, hf_family(c))
    (root / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return root
