"""`hetpp data prepare`: tokenize text / JSONL / parquet into token shards for `hetpp train`."""

from __future__ import annotations

import argparse

EXAMPLES = """examples:
  hetpp data prepare --tokenizer tok/tokenizer.json --input corpus/*.txt --out data/
  hetpp data prepare --tokenizer hf-model/ --input docs.jsonl --field body --out data/
  hetpp data prepare --tokenizer hf-model/ --input part-0.parquet part-1.parquet --out data/
  hetpp train --plan plan.json --data data/ --eval-every 50
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "data",
        help="prepare token datasets (tokenize text, JSONL or parquet)",
        description="Datasets for `hetpp train --data`.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    prep = sub.add_parser(
        "prepare",
        help="tokenize documents into uint16/uint32 token shards with an index",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prep.add_argument(
        "--tokenizer", required=True, help="tokenizer.json, or a folder with one (local only)"
    )
    prep.add_argument(
        "--input",
        required=True,
        nargs="+",
        metavar="FILE",
        help="text files (one document each), .jsonl (one per line) or .parquet (one per row)",
    )
    prep.add_argument("--out", required=True, metavar="DIR", help="folder for the shards")
    prep.add_argument("--field", default="text", help="JSONL key / parquet column (default text)")
    prep.add_argument("--eos", help="EOS token (default: the tokenizer's, or a usual name)")
    prep.add_argument(
        "--val-every",
        type=int,
        default=20,
        metavar="N",
        help="every N-th document goes to the validation split (0: none; default 20)",
    )
    prep.set_defaults(func=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from hetpp.dataset.prepare import PrepareOptions, prepare
    from hetpp.specs.errors import SpecError

    if args.val_every < 0:
        raise SpecError("must be 0 or more", field="--val-every")
    opts = PrepareOptions(
        tokenizer=args.tokenizer,
        inputs=tuple(args.input),
        out=args.out,
        field=args.field,
        eos=args.eos,
        val_every=args.val_every,
    )
    with Progress(transient=True) as bar:
        task = bar.add_task("tokenizing", total=len(opts.inputs))
        index = prepare(opts, on_input=lambda _: bar.advance(task))
    tokens = {s: sum(e["tokens"] for e in index[s]) for s in ("train", "val")}
    print(
        f"wrote {args.out}: {index['documents']} documents, {tokens['train']:,} train and "
        f"{tokens['val']:,} validation tokens ({index['dtype']}, vocabulary {index['vocab_size']})"
    )
    return 0
