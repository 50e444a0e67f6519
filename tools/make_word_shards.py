"""Generate an ST+MJ-like data set of rendered word images as WebDataset tar shards.

Synthetic text-recognition sets (MJSynth, SynthText) are millions of rendered word crops; this
tool renders a small one with Pillow so the demo and tests have real image shards with real
per-sample difficulty. The task is word classification over a vocabulary: each sample renders
one vocabulary word with a random font size, position, rotation, stroke colour/contrast, blur,
noise and occlusion. A share of samples is deliberately hard (heavy distortion), and a small
share carries a wrong label (``--label-noise``), so per-sample losses are skewed like real data.

Layout (like real sets): ``stmj-train-000000.tar``..., keys ``mj/<dir>/<n>/<index>_<Word>``
(slashes are allowed in webdataset keys, dots are not: the first dot of a member name starts
its extension). Members: ``<key>.png`` (8-bit grayscale, 32x128) and ``<key>.cls`` (label as
ASCII decimal). Deterministic from ``--seed``.

    python -m tools.make_word_shards --out demo-out/data --train 24000 --test 2400
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tools import draws

VOCAB = (
    "Lube Train Stream Shard Window Cluster Random Prune Epoch Loss Batch Tensor Kernel "
    "Vector Sample Record Table Plan Filter Stage Index Range Parallel Worker Rank Seed Merge "
    "Query Model Layer Token Image Label Noise Scale Anneal Budget Metric Score Weight Sketch "
    "Delta Alpha Sigma Gamma Omega Lambda Theta Kappa Zeta Beta"
).split()

HEIGHT, WIDTH = 32, 128


def _fonts(sizes: list[int]) -> list:
    from PIL import ImageFont

    fonts = [ImageFont.load_default(size=s) for s in sizes]
    for path in (
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf",
        "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    ):
        if os.path.exists(path):  # optional extra faces when the system has them
            fonts += [ImageFont.truetype(path, s) for s in sizes]
    return fonts


def render(word: str, rng: random.Random, fonts: list, hard: bool) -> bytes:
    """PNG bytes of one rendered word."""
    from PIL import Image, ImageDraw, ImageFilter

    font = rng.choice(fonts)
    bg = rng.randint(150, 255)
    fg = rng.randint(0, max(0, bg - (40 if hard else 90)))
    canvas = Image.new("L", (WIDTH + 40, HEIGHT + 20), bg)
    draw = ImageDraw.Draw(canvas)
    x0, y0, x1, y1 = draw.textbbox((0, 0), word, font=font)
    tx = rng.randint(12, max(12, 20 + WIDTH - (x1 - x0) - 8))
    ty = rng.randint(6, max(6, 10 + HEIGHT - (y1 - y0) - 4)) - y0
    draw.text((tx, ty), word, font=font, fill=fg)
    angle = rng.uniform(-12, 12) if hard else rng.uniform(-4, 4)
    canvas = canvas.rotate(angle, resample=Image.BILINEAR, fillcolor=bg)
    img = canvas.crop((20, 10, 20 + WIDTH, 10 + HEIGHT))
    if hard or rng.random() < 0.3:
        img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.6 if hard else 0.8)))
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(4, 14) if hard else rng.randint(0, 3)):  # clutter strokes
        xa, ya = rng.randint(0, WIDTH), rng.randint(0, HEIGHT)
        draw.line(
            (xa, ya, xa + rng.randint(-30, 30), ya + rng.randint(-8, 8)),
            fill=rng.randint(0, 255),
            width=rng.randint(1, 2),
        )
    if hard and rng.random() < 0.5:  # occlusion
        xa = rng.randint(0, WIDTH - 20)
        draw.rectangle((xa, 0, xa + rng.randint(10, 30), HEIGHT), fill=rng.randint(0, 255))
    px = img.load()
    for _ in range(rng.randint(200, 900) if hard else rng.randint(0, 120)):  # salt and pepper
        px[rng.randrange(WIDTH), rng.randrange(HEIGHT)] = rng.choice((0, 255))
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=False, compress_level=1)
    return buf.getvalue()


def random_label(key: str, share: float, seed: int, classes: int) -> int | None:
    """The random label (0..classes-1, maybe the true one) shown for the sample ``key``, or None
    for a sample shown its own: a share ``share`` of the samples, each in with probability ``share``
    by a keyed hash of (seed, key) (purpose ``word-noise-pick``) and its label a second one
    (``word-noise-label``). A lower share's samples are a subset of a higher share's, each shown the
    same label."""
    if draws.uniform(draws.WORD_NOISE_PICK, seed, key) >= share:
        return None
    return draws.below(draws.WORD_NOISE_LABEL, seed, key, classes)


def _make_shard(job: dict) -> dict:
    import webdataset as wds

    seed, where = job["seed"], (job["test"], job["shard"])
    rng = random.Random(draws.seed_int(draws.WORD_SAMPLE, seed, *where))  # words, casing, hard samples
    look = random.Random(draws.seed_int(draws.WORD_RENDER, seed, *where))  # their rendering
    fonts = _fonts([14, 17, 20, 23])
    vocab = VOCAB[: job["vocab"]]
    counts = {"hard": 0, "noisy_label": 0}
    with wds.TarWriter(job["path"]) as sink:
        for i in range(job["start"], job["stop"]):
            label = rng.randrange(len(vocab))
            word = vocab[label]
            if rng.random() < 0.3:
                word = word.upper() if rng.random() < 0.5 else word.lower()
            hard = rng.random() < job["hard"]
            key = f"mj/{i // 1000:04d}/{i % 7}/{i:07d}_{vocab[label]}"
            shown = random_label(key, job["label_noise"], seed, len(vocab))
            if shown is None:
                shown = label
            else:
                counts["noisy_label"] += int(shown != label)
            counts["hard"] += int(hard)
            sink.write({"__key__": key, "png": render(word, look, fonts, hard), "cls": str(shown)})
    return counts


def make_split(
    out: Path, split: str, n: int, shard_size: int, seed: int, vocab: int, hard: float, label_noise: float, workers: int
) -> dict:
    jobs = []
    for s, start in enumerate(range(0, n, shard_size)):
        jobs.append(
            {
                "path": str(out / f"stmj-{split}-{s:06d}.tar"),
                "start": start,
                "stop": min(n, start + shard_size),
                "seed": seed,
                "test": split == "test",
                "shard": s,
                "vocab": vocab,
                "hard": hard,
                "label_noise": label_noise,
            }
        )
    totals = {"hard": 0, "noisy_label": 0}
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_make_shard, jobs))
    else:
        results = [_make_shard(j) for j in jobs]
    for r in results:
        for k in totals:
            totals[k] += r[k]
    return {"samples": n, "shards": len(jobs), **totals}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder for the shards")
    p.add_argument("--train", type=int, default=24000, help="training samples")
    p.add_argument("--test", type=int, default=2400, help="test samples")
    p.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    p.add_argument("--vocab", type=int, default=50, help=f"vocabulary size (<= {len(VOCAB)})")
    p.add_argument("--hard", type=float, default=0.15, help="share of heavily distorted samples")
    p.add_argument("--label-noise", type=float, default=0.03, help="share of training samples with a random label")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if not 2 <= args.vocab <= len(VOCAB):
        p.error(f"--vocab must be in 2..{len(VOCAB)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    info = {
        "vocab": VOCAB[: args.vocab],
        "train": make_split(
            out, "train", args.train, args.shard_size, args.seed, args.vocab, args.hard, args.label_noise, args.workers
        ),
        "test": make_split(
            out, "test", args.test, args.shard_size, args.seed, args.vocab, args.hard, 0.0, args.workers
        ),
        "seed": args.seed,
        "draws": draws.VERSION,
    }
    (out / "info.json").write_text(json.dumps(info, indent=1))
    print(f"wrote {args.train} train and {args.test} test samples to {out} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
