"""`hetpp export`: a checkpoint as a Hugging Face model folder that `transformers` loads."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from hetpp.specs.errors import SpecError

EXAMPLES = """examples:
  hetpp export --checkpoint-dir ckpt --hf out/            # newest complete checkpoint
  hetpp export --checkpoint-dir ckpt --hf out/ --dtype bfloat16 --tokenizer-from hf-model/
  python -c "import transformers; transformers.AutoModelForCausalLM.from_pretrained('out')"
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face folder (config.json + model.safetensors)",
        description="Read the newest complete checkpoint of a run (any plan) and write its "
        "weights in the model's Hugging Face layout.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint-dir", required=True, metavar="D", help="a run's --checkpoint-dir")
    p.add_argument("--hf", required=True, metavar="OUT", help="folder to write")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16", "float64"),
        help="dtype of the written tensors (default float32)",
    )
    p.add_argument(
        "--tokenizer-from",
        metavar="DIR",
        help="copy the tokenizer files of this folder (e.g. the --init-from one) into OUT",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from hetpp.runtime import checkpoint
    from hetpp.runtime.hf_weights import export_stage
    from hetpp.runtime.model import StageModule
    from hetpp.specs.io import validate_model
    from hetpp.specs.model import ModelConfig

    path = checkpoint.latest(args.checkpoint_dir) if Path(args.checkpoint_dir).is_dir() else None
    if path is None:
        raise SpecError("no complete checkpoint here", file=args.checkpoint_dir)
    meta = checkpoint.read_meta(path)
    c = validate_model(ModelConfig, meta.model, str(path / "meta.json"))
    stage = StageModule(c, 0, c.layer_list_len, seed=0, dtype=torch.float32)
    # checkpoint.load also restores optimizer state: a throwaway optimizer receives it.
    checkpoint.load(path, stage, torch.optim.SGD(stage.parameters(), lr=0.0))
    tokenizer = _tokenizer_files(Path(args.tokenizer_from)) if args.tokenizer_from else []
    out = export_stage(stage, args.hf, getattr(torch, args.dtype) if args.dtype else None)
    for f in tokenizer:
        shutil.copyfile(f, out / f.name)
    print(
        f"wrote {out} ({c.name}, step {meta.step}, {sum(p.numel() for p in stage.parameters()):,} "
        "parameters)"
    )
    return 0


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _tokenizer_files(src: Path) -> list[Path]:
    if not (src / "tokenizer.json").is_file():
        raise SpecError("no tokenizer.json here", file=str(src), field="--tokenizer-from")
    return [src / f for f in TOKENIZER_FILES if (src / f).is_file()]
