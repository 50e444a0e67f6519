"""Convert a table of text samples (TSV, CSV or JSON lines) into WebDataset tar shards.

Text data sets usually arrive as one big table (GLUE's ``train.tsv``, a CSV export, JSONL);
streaming training and seta_stream's per-sample pruning want tar shards with one key per
sample. This tool writes ``<prefix>-000000.tar``... with, per row, ``<key>.txt`` (the text,
UTF-8) and ``<key>.cls`` (the label as ASCII decimal, if a label column is given), plus any
other columns named with ``--extra col=ext``. Keys are ``<key-prefix><row number>`` in the
source's row order (zero-padded), so a sample keeps its key whatever the shuffle; ``--shuffle
SEED`` shuffles the rows before sharding (real sets are often sorted by label or source).

Bad input stops with the file, the line and what is wrong: a missing column, an empty text, a
label that is not an integer (or not in ``--labels``), a duplicate key.

    python -m tools.text_to_shards ../shared/data/sst2/train.tsv --out data/sst2 \\
        --text sentence --label label --prefix sst2-train --shard-size 5000 --shuffle 0

Prints one line per shard and a JSON summary (``--json``) of what was written.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from webdataset import TarWriter

from tools import draws


class ConversionError(ValueError):
    """The input cannot be converted; the message names the file, the line and the fix."""


def read_rows(path: Path, fmt: str | None = None) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a .tsv/.csv/.jsonl file; the first line of TSV/CSV is the header."""
    fmt = fmt or {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}.get(path.suffix.lower())
    if fmt is None:
        raise ConversionError(f"{path}: unknown format {path.suffix!r}; pass --format tsv|csv|jsonl")
    with open(path, encoding="utf-8", newline="") as fh:
        if fmt == "jsonl":
            for no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConversionError(f"{path}:{no}: not a JSON object ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise ConversionError(f"{path}:{no}: expected a JSON object per line, found {type(row).__name__}")
                yield no, {k: "" if v is None else str(v) for k, v in row.items()}
            return
        # GLUE's TSVs are not quoted: a sentence may contain '"'; QUOTE_NONE keeps it verbatim
        reader = csv.DictReader(
            fh, delimiter="\t" if fmt == "tsv" else ",", quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
        )
        for row in reader:
            if None in row:
                raise ConversionError(
                    f"{path}:{reader.line_num}: {len(reader.fieldnames or []) + len(row[None])} fields, the header "
                    f"has {len(reader.fieldnames or [])}; check the delimiter (--format) or quoting"
                )
            yield reader.line_num, row


def row_order(n: int, shuffle: int) -> list[int]:
    """The source rows in the order ``--shuffle SEED`` writes them: a uniform permutation of 0..n-1
    drawn by a NumPy generator of its own purpose and the seed (``tools/draws.py``)."""
    return draws.generator(draws.TEXT_SHUFFLE, shuffle).permutation(n).tolist()


def convert(
    src: Path,
    out: Path,
    *,
    text: str,
    label: str | None = None,
    labels: list[int] | None = None,
    extra: dict[str, str] | None = None,
    prefix: str = "shard",
    key_prefix: str = "",
    shard_size: int = 5000,
    shuffle: int | None = None,
    fmt: str | None = None,
    quiet: bool = False,
) -> dict:
    """Write the shards; returns a summary (shards, rows, label counts)."""
    if shard_size < 1:
        raise ConversionError(f"--shard-size must be >= 1, got {shard_size}")
    if "." in key_prefix:
        raise ConversionError(
            f"--key-prefix {key_prefix!r} contains a dot; webdataset cuts keys at the first dot of a member name"
        )
    extra = dict(extra or {})
    rows: list[tuple[int, dict[str, str]]] = list(read_rows(src, fmt))
    if not rows:
        raise ConversionError(f"{src}: no rows")
    needed = [text] + ([label] if label else []) + list(extra)
    missing = [c for c in needed if c not in rows[0][1]]
    if missing:
        raise ConversionError(f"{src}: no column {missing}; the columns are {sorted(rows[0][1])}")
    width = max(6, len(str(len(rows) - 1)))
    samples = []
    counts: dict[int, int] = {}
    for index, (no, row) in enumerate(rows):
        body = row[text]
        if not body.strip():
            raise ConversionError(f"{src}:{no}: empty {text!r}; remove the row or fill it")
        sample = {"__key__": f"{key_prefix}{index:0{width}d}", "txt": body}
        if label:
            try:
                y = int(row[label])
            except ValueError:
                raise ConversionError(
                    f"{src}:{no}: label {row[label]!r} in column {label!r} is not an integer"
                ) from None
            if labels is not None and y not in labels:
                raise ConversionError(f"{src}:{no}: label {y} is not one of --labels {labels}")
            counts[y] = counts.get(y, 0) + 1
            sample["cls"] = str(y)
        for col, ext in extra.items():
            sample[ext] = row[col]
        samples.append(sample)
    if shuffle is not None:
        samples = [samples[i] for i in row_order(len(samples), shuffle)]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    t0 = time.perf_counter()
    for s, start in enumerate(range(0, len(samples), shard_size)):
        path = out / f"{prefix}-{s:06d}.tar"
        tmp = path.with_suffix(".tar.tmp")
        with TarWriter(str(tmp), mtime=0) as sink:  # fixed mtime: identical input, identical bytes
            for sample in samples[start : start + shard_size]:
                sink.write(sample)
        tmp.replace(path)
        n = len(samples[start : start + shard_size])
        written.append({"shard": path.name, "samples": n})
        if not quiet:
            print(f"  {path} {n:,} samples", file=sys.stderr)
    summary = {
        "source": str(src),
        "rows": len(samples),
        "shards": written,
        "labels": {str(k): v for k, v in sorted(counts.items())},
        "shuffle": shuffle,
        "draws": draws.VERSION,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    (out / f"{prefix}.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="a .tsv, .csv or .jsonl file")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--text", required=True, help="column holding the text")
    p.add_argument("--label", help="column holding an integer label (written as .cls)")
    p.add_argument("--labels", help="allowed labels, comma separated (e.g. 0,1)")
    p.add_argument("--extra", action="append", default=[], metavar="COL=EXT", help="more columns to write")
    p.add_argument("--prefix", default="shard", help="shard file name prefix")
    p.add_argument("--key-prefix", default="", help="prefix of every key (no dots)")
    p.add_argument("--shard-size", type=int, default=5000)
    p.add_argument("--shuffle", type=int, metavar="SEED", help="shuffle the rows with this seed before sharding")
    p.add_argument("--format", choices=["tsv", "csv", "jsonl"], help="default: from the file extension")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = p.parse_args(argv)
    extra = {}
    for item in args.extra:
        col, sep, ext = item.partition("=")
        if not sep or not col or not ext:
            p.error(f"--extra {item!r}: expected COL=EXT")
        extra[col] = ext
    try:
        summary = convert(
            args.src,
            args.out,
            text=args.text,
            label=args.label,
            labels=[int(x) for x in args.labels.split(",")] if args.labels else None,
            extra=extra,
            prefix=args.prefix,
            key_prefix=args.key_prefix,
            shard_size=args.shard_size,
            shuffle=args.shuffle,
            fmt=args.format,
            quiet=args.json,
        )
    except (ConversionError, OSError) as exc:
        print(f"text_to_shards: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"{summary['rows']:,} rows -> {len(summary['shards'])} shards in {args.out} (labels {summary['labels']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
