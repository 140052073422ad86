"""How close hetpp's layers are to transformers: per family, the largest logit and loss
differences of a three-stage split against transformers' forward, fp32 and fp64, on the tiny
random models of the faithfulness test (tests/hfmodels.py; nothing downloaded).

    python bench/hf_faithful.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests/unit")]

from hfmodels import CONFIGS, make_hf_model, reference_forward, reference_model  # noqa: E402
from test_runtime_hf_faithful import _pipelined  # noqa: E402

from hetpp.runtime.model import token_loss_sum  # noqa: E402
from hetpp.specs.presets import load_model_config  # noqa: E402


def main() -> None:
    print("| family | fp32 logits | fp32 loss | fp64 logits | fp64 loss |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONFIGS:
            folder = Path(tmp) / name
            hf = make_hf_model(name, folder)
            c = load_model_config(folder)
            gen = torch.Generator().manual_seed(1)
            tokens = torch.randint(0, c.vocab_size, (2, 13), generator=gen)
            cells = []
            for dtype in (torch.float32, torch.float64):
                want, want_loss = reference_forward(reference_model(name, hf, dtype), tokens, dtype)
                logits = _pipelined(c, folder, tokens[:, :-1], dtype)
                loss = token_loss_sum(logits, tokens[:, 1:]) / tokens[:, 1:].numel()
                cells += [(logits - want).abs().max().item(), abs(loss.item() - want_loss.item())]
            print(f"| {name} | " + " | ".join(f"{x:.1e}" for x in cells) + " |")


if __name__ == "__main__":
    main()
