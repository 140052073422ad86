"""The README's worked example, end to end on this machine (nothing downloaded):

1. make a small Hugging Face Llama folder locally (a BPE trained on the standard library's
   sources, a random 4-block model saved with transformers),
2. `hetpp data prepare` the standard library's email/json/http packages with that tokenizer,
3. `hetpp plan` it over the demo's emulated mixed cluster (3 fast, 4 slow devices),
4. `hetpp train --init-from` the folder, emulated, with warm-up + cosine and validation,
5. `hetpp export` the checkpoint and load it with transformers: its loss on the held-out batch is
   hetpp's last validation loss.

    python examples/finetune_hf.py [--work DIR] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch
import transformers

from hetpp.demo.corpus import stdlib_sources, train_tokenizer
from hetpp.runtime.data import validation_batch
from hetpp.runtime.model import token_loss_sum
from hetpp.specs.plan import load_plan

CLUSTER = Path(__file__).resolve().parents[1] / "src/hetpp/data/demo-cluster.yaml"


def hetpp(*args: str) -> None:
    print("$ hetpp", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "hetpp.cli.main", *args], check=True)


def make_model(folder: Path) -> None:
    train_tokenizer(stdlib_sources(1_000_000), folder / "tokenizer.json", 256)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("finetune-example"))
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    w = args.work
    w.mkdir(parents=True, exist_ok=True)
    make_model(w / "hf-small")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    inputs = sorted(
        str(p) for pkg in ("email", "json", "http") for p in (stdlib / pkg).glob("*.py")
    )
    hetpp(
        *f"data prepare --tokenizer {w}/hf-small --out {w}/data --val-every 10".split(),
        "--input",
        *inputs,
    )
    hetpp(
        *f"plan --cluster {CLUSTER} --model {w}/hf-small --global-batch 16 --seq-len 128 "
        f"--precision fp32 --reserve-gb 0 --out {w}/plan.json".split()
    )
    hetpp(
        *f"train --plan {w}/plan.json --init-from {w}/hf-small --data {w}/data --emulate "
        f"--steps {args.steps} --lr 2e-3 --warmup-steps 5 --lr-schedule cosine --eval-every 10 "
        f"--checkpoint-dir {w}/ckpt --metrics {w}/run.jsonl".split()
    )
    hetpp(
        *f"export --checkpoint-dir {w}/ckpt --hf {w}/hf-tuned --tokenizer-from {w}/hf-small".split()
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(w / "hf-tuned").eval()
    plan = load_plan(w / "plan.json")
    rows = validation_batch(str(w / "data"), plan, seed=0, count=plan.global_batch)
    with torch.no_grad():
        loss = token_loss_sum(model(rows[:, :-1]).logits, rows[:, 1:]) / rows[:, 1:].numel()
    last = [json.loads(line) for line in (w / "run.jsonl").read_text().splitlines()][-1]
    print(
        f"transformers' loss on the held-out batch: {loss.item():.6f}; "
        f"hetpp's last validation loss: {last['val_loss']:.6f}"
    )
    return 0 if abs(loss.item() - last["val_loss"]) <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
