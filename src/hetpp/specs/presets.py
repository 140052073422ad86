"""Named model presets and import from a Hugging Face `config.json`."""

from __future__ import annotations

from pathlib import Path

from hetpp.specs.errors import SpecError
from hetpp.specs.hf_config import from_hf
from hetpp.specs.io import read_mapping, validate_model
from hetpp.specs.model import ModelConfig, ModelSpec


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelConfig:
    # GPT-3 paper, Table 2.1: vocab 50257, context 2048, FFN 4h, tied embeddings, learned positions.
    # 13B uses hidden 5120 (the paper's 5140 is not divisible by its 40 heads; Megatron uses 5120).
    return ModelConfig(
        name=name,
        family="gpt",
        vocab_size=50257,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        ffn_hidden_size=4 * hidden,
        max_seq_len=2048,
        tie_embeddings=True,
    )


def _llama(
    name: str,
    vocab: int,
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    ffn: int,
    seq: int,
    theta: float,
) -> ModelConfig:
    return ModelConfig(
        name=name,
        family="llama",
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        ffn_hidden_size=ffn,
        max_seq_len=seq,
        position="rope",
        qkv_bias=False,
        dense_bias=False,
        rope_theta=theta,
        norm_eps=1e-5,
    )


PRESETS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        _gpt3("gpt3-350m", 24, 1024, 16),
        _gpt3("gpt3-1.3b", 24, 2048, 16),
        _gpt3("gpt3-2.7b", 32, 2560, 32),
        _gpt3("gpt3-6.7b", 32, 4096, 32),
        _gpt3("gpt3-13b", 40, 5120, 40),
        _llama("llama2-7b", 32000, 32, 4096, 32, 32, 11008, 4096, 1e4),
        _llama("llama2-13b", 32000, 40, 5120, 40, 40, 13824, 4096, 1e4),
        _llama("llama3-8b", 128256, 32, 4096, 32, 8, 14336, 8192, 5e5),
        # Small sizes for tests, demos and CPU runs (byte-level vocabulary).
        ModelConfig(
            name="tiny-gpt",
            family="gpt",
            vocab_size=256,
            hidden_size=64,
            num_layers=4,
            num_heads=4,
            ffn_hidden_size=256,
            max_seq_len=128,
            tie_embeddings=True,
        ),
        _llama("tiny-llama", 256, 4, 64, 4, 2, 176, 128, 1e4),
        ModelConfig(
            name="gpt-demo",
            family="gpt",
            vocab_size=256,
            hidden_size=256,
            num_layers=8,
            num_heads=8,
            ffn_hidden_size=1024,
            max_seq_len=256,
        ),
    )
}


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """A preset by name, a Hugging Face `config.json` or model folder (the `from_pretrained`
    convention: its `config.json`), or a hetpp ModelConfig YAML/JSON file."""
    key = str(name_or_path)
    if key.lower() in PRESETS:
        return PRESETS[key.lower()]
    p = Path(key)
    if not p.exists():
        raise SpecError(
            f"not a preset and no such file; presets: {', '.join(PRESETS)}", field="model", file=key
        )
    if p.is_dir():
        p = p / "config.json"
        key = str(p)
        if not p.is_file():
            raise SpecError("a model folder needs a config.json", file=key)
    data = read_mapping(p)
    if "model_type" in data:
        try:
            # A folder's config.json is named after the folder; any other file after itself.
            named = p.parent.name if p.name == "config.json" else p.stem
            fields = from_hf(data, data.get("_name_or_path") or named or p.stem)
        except SpecError as e:
            raise e.in_file(key) from None
        # A key absent from config.json maps to None: let validation call it missing.
        return validate_model(ModelConfig, {k: v for k, v in fields.items() if v is not None}, key)
    return validate_model(ModelConfig, data, key)


def load_model(name_or_path: str | Path, seq_len: int, dtype_bytes: int = 2) -> ModelSpec:
    """ModelSpec for a preset or config file at a sequence length."""
    cfg = load_model_config(name_or_path)
    if seq_len > cfg.max_seq_len:
        raise SpecError(
            f"seq_len {seq_len} exceeds the model's max_seq_len {cfg.max_seq_len}", field="seq_len"
        )
    return ModelSpec(config=cfg, seq_len=seq_len, dtype_bytes=dtype_bytes)


def check_folder_model(c: ModelConfig, folder: str | Path) -> None:
    """SpecError unless the folder's config.json is the architecture `c` (names aside)."""
    theirs = load_model_config(folder)
    key = c.first_difference(theirs)
    if key is not None:
        raise SpecError(
            f"the folder's model differs from the plan's: {key} is "
            f"{getattr(theirs.resolved(), key)!r}, the plan has {getattr(c.resolved(), key)!r}",
            file=str(Path(folder) / "config.json"),
        )
