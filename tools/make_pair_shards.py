"""Generate an SS1M-like set of web-crawled image-text pairs as WebDataset tar shards.

Web-crawled caption sets (SBU, CC3M, LAION, DataComp; OpenCLIP trains on them) reach training
code as img2dataset's output: shards ``00000.tar``, ``00001.tar``... holding for every pair a
``<key>.jpg``, the caption as ``<key>.txt`` and the crawl metadata as ``<key>.json``. This tool
writes such a set without downloading anything: every image is a small scene rendered with
Pillow (a shape of some colour and size at some place on a coloured background, with jitter
and clutter) and its caption comes from one of several web-like templates, some of which leave
attributes out, as alt-texts do. The typical defect of crawled pairs is a caption that belongs
to another image: ``--noise`` gives that caption to a seeded share of the training pairs, and
``noise.parquet`` lists exactly those pairs, so a study can tell clean from mismatched.

Layout, as img2dataset writes it (``--output_format webdataset``)::

    OUT/train/00000.tar  00001.tar ...    members 000000000.jpg 000000000.txt 000000000.json ...
    OUT/test/00000.tar ...                the clean held-out pairs (retrieval evaluation)
    OUT/noise.parquet                     shard, key, donor_key, caption, clean_caption
    OUT/info.json                         counts, vocabulary, arguments

Keys follow img2dataset's ``compute_key``: ``shard_id * 10**ceil(log10(shard_size)) + index``
zero-padded to that many digits plus the shard-name digits (5 or more), so with 2,000 pairs a
shard the 12th pair of shard 0 is ``000000012`` and the first of shard 3 is ``000030000``.
(img2dataset's ``files`` output stores the same pair as ``00000/000000012.jpg``; in its
webdataset output the key has no folder, and the shard file is the folder.) Keys are unique
within a split; the train and test splits use the same shard names in different folders.

Deterministic for ``--seed``: the same arguments write byte-identical shards (JPEG bytes from
the same Pillow build). Images and clean captions do not depend on ``--noise``, so sets made
with different noise levels differ only in the captions of the mismatched pairs: exactly
round(noise x n) of a shard's n pairs, chosen and given their donors by keyed hashes of the key
(``tools/draws.py``), so a lower level mismatches a subset of a higher level's pairs,
each with the same caption.

    python -m tools.make_pair_shards --out bench-out/pairs/noise20 --train 24000 --test 1000 --noise 0.2
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tools import draws

SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring", "star", "bar")
COLOURS = {
    "red": (210, 30, 30),
    "green": (40, 170, 50),
    "blue": (30, 60, 210),
    "yellow": (235, 215, 40),
    "purple": (130, 40, 160),
    "orange": (245, 140, 20),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
BACKGROUNDS = {"gray": (125, 125, 125), "brown": (115, 75, 40), "pink": (235, 170, 190), "teal": (20, 120, 125)}
POSITIONS = {  # name -> (column, row) of a 3x3 grid
    "top left": (0, 0),
    "top": (1, 0),
    "top right": (2, 0),
    "left": (0, 1),
    "center": (1, 1),
    "right": (2, 1),
    "bottom left": (0, 2),
    "bottom": (1, 2),
    "bottom right": (2, 2),
}
SIZES = ("small", "large")
TEMPLATES = (  # web-like alt texts; some leave attributes out, as crawled captions do
    "a {size} {colour} {shape} in the {pos} on a {bg} background",
    "{colour} {shape}, {size}, {pos}, {bg} backdrop",
    "photo of a {colour} {shape} at the {pos} of the frame, {bg} background",
    "{size} {colour} {shape} {pos} over {bg} | free stock image",
    "{bg} wallpaper with a {colour} {shape} in the {pos}",
    "the {pos} shows a {size} {shape} painted {colour}",
    "{colour} {shape} icon on {bg}, hd",
    "{size} {shape} ({colour}) placed {pos} - {bg} texture",
)
MTIME = 1_700_000_000  # member mtime written into every tar header
RENDER = 64  # drawn at this size, then downsampled (anti-aliasing)


def shape_polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a polygonal shape of radius ``r`` centred at (cx, cy), rotated by ``angle``."""
    if shape == "square":
        pts = [(math.pi / 4 + i * math.pi / 2, r) for i in range(4)]
    elif shape == "diamond":
        pts = [(i * math.pi / 2, r) for i in range(4)]
    elif shape == "triangle":
        pts = [(-math.pi / 2 + i * 2 * math.pi / 3, r) for i in range(3)]
    elif shape == "star":
        pts = [(-math.pi / 2 + i * math.pi / 5, r if i % 2 == 0 else 0.45 * r) for i in range(10)]
    elif shape == "cross":
        a, b = 0.33 * r, r
        xy = [
            (-a, -b),
            (a, -b),
            (a, -a),
            (b, -a),
            (b, a),
            (a, a),
            (a, b),
            (-a, b),
            (-a, a),
            (-b, a),
            (-b, -a),
            (-a, -a),
        ]
        pts = [(math.atan2(y, x), math.hypot(x, y)) for x, y in xy]
    elif shape == "bar":
        xy = [(-r, -0.35 * r), (r, -0.35 * r), (r, 0.35 * r), (-r, 0.35 * r)]
        pts = [(math.atan2(y, x), math.hypot(x, y)) for x, y in xy]
    else:
        raise ValueError(f"{shape} is not a polygon")
    return [(cx + d * math.cos(t + angle), cy + d * math.sin(t + angle)) for t, d in pts]


def _jitter(rgb: tuple[int, int, int], rng: random.Random, amount: int) -> tuple[int, int, int]:
    return tuple(max(0, min(255, c + rng.randint(-amount, amount))) for c in rgb)  # type: ignore[return-value]


def render(attrs: dict, rng: random.Random, size: int) -> bytes:
    """JPEG bytes of one scene (``size`` x ``size`` RGB)."""
    from PIL import Image, ImageDraw

    bg = _jitter(BACKGROUNDS[attrs["bg"]], rng, 20)
    img = Image.new("RGB", (RENDER, RENDER), bg)
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(2, 6)):  # background clutter in shades of the background
        xa, ya = rng.randint(0, RENDER), rng.randint(0, RENDER)
        draw.line(
            (xa, ya, xa + rng.randint(-25, 25), ya + rng.randint(-25, 25)),
            fill=_jitter(bg, rng, 45),
            width=rng.randint(1, 3),
        )
    col, row = POSITIONS[attrs["pos"]]
    cell = RENDER / 3
    cx = (col + 0.5) * cell + rng.uniform(-3, 3)
    cy = (row + 0.5) * cell + rng.uniform(-3, 3)
    r = rng.uniform(6, 8) if attrs["size"] == "small" else rng.uniform(10.5, 13)
    fg = _jitter(COLOURS[attrs["colour"]], rng, 25)
    shape = attrs["shape"]
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fg)
    elif shape == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=fg, width=max(2, round(r / 3)))
    else:
        draw.polygon(shape_polygon(shape, cx, cy, r, rng.uniform(-0.25, 0.25)), fill=fg)
    img = img.resize((size, size), Image.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def caption(attrs: dict, rng: random.Random) -> str:
    return rng.choice(TEMPLATES).format(**attrs)


def draw_attrs(rng: random.Random) -> dict:
    return {
        "shape": rng.choice(SHAPES),
        "colour": rng.choice(sorted(COLOURS)),
        "bg": rng.choice(sorted(BACKGROUNDS)),
        "pos": rng.choice(list(POSITIONS)),
        "size": rng.choice(SIZES),
    }


def oom_sample_per_shard(shard_size: int) -> int:
    """Digits img2dataset reserves for the index within a shard: ceil(log10(shard size))."""
    return max(1, math.ceil(math.log10(shard_size)))


def oom_shard_count(shards: int) -> int:
    """Digits of the shard names (img2dataset: at least 5)."""
    return max(5, math.ceil(math.log10(max(shards, 1))))


def compute_key(index: int, shard_id: int, shard_size: int, shards: int) -> str:
    """img2dataset's key of the ``index``-th pair of shard ``shard_id``."""
    digits = oom_sample_per_shard(shard_size)
    return f"{10**digits * shard_id + index:0{digits + oom_shard_count(shards)}d}"


def scene_rng(seed: int, test: bool, shard_id: int) -> random.Random:
    """The generator of a shard's scenes, clean captions and renderings, in that order: a stream of
    the shard's own (purpose ``pair-scene``), independent of the noise level."""
    return random.Random(draws.seed_int(draws.PAIR_SCENE, seed, test, shard_id))


def mismatched(keys: list[str], noise: float, seed: int) -> list[int]:
    """The positions (ascending) of the exactly round(noise * n) pairs of a shard's n ``keys`` given
    another image's caption: the keys first in the order of a keyed hash of (seed, key) (purpose
    ``pair-mismatch``). The order does not depend on ``noise``, so a lower level mismatches a subset of
    a higher level's pairs (each with the same donor: a keyed hash of its own, ``pair-donor``)."""
    pos = {k: i for i, k in enumerate(keys)}
    return sorted(pos[k] for k in draws.order(draws.PAIR_MISMATCH, seed, keys)[: round(noise * len(keys))])


def donor(keys: list[str], attrs: list[dict], i: int, seed: int) -> int | None:
    """The pair of the shard whose caption pair ``i`` gets: another image that shows a different
    object (shape or colour differ), the first such of the candidates a keyed hash of (seed, key of
    ``i``, attempt) draws uniformly from the shard (purpose ``pair-donor``); None after 1,000 tries."""
    for attempt in range(1000):
        d = draws.below(draws.PAIR_DONOR, seed, f"{keys[i]}/{attempt}", len(keys))
        if d != i and (attrs[d]["shape"], attrs[d]["colour"]) != (attrs[i]["shape"], attrs[i]["colour"]):
            return d
    return None


def _make_shard(job: dict) -> list[dict]:
    """Write one shard; return the mismatched pairs it holds."""
    import webdataset as wds

    rng = scene_rng(job["seed"], job["split"] == "test", job["shard_id"])
    n = job["stop"] - job["start"]
    keys = [compute_key(i, job["shard_id"], job["shard_size"], job["shards"]) for i in range(n)]
    attrs = [draw_attrs(rng) for _ in range(n)]
    clean = [caption(a, rng) for a in attrs]
    images = [render(a, rng, job["size"]) for a in attrs]
    shown = list(clean)
    noisy: list[dict] = []
    if job["noise"] > 0 and n > 1:
        for i in mismatched(keys, job["noise"], job["seed"]):
            d = donor(keys, attrs, i, job["seed"])
            if d is None:  # pragma: no cover - needs a shard of one repeated object
                continue
            shown[i] = clean[d]
            noisy.append(
                {
                    "shard": job["name"],
                    "key": keys[i],
                    "donor_key": keys[d],
                    "caption": clean[d],
                    "clean_caption": clean[i],
                }
            )
    with wds.TarWriter(job["path"], mtime=job["mtime"]) as sink:  # fixed mtime: reproducible bytes
        for i in range(n):
            meta = {
                "url": f"https://shapes.invalid/{job['split']}/{keys[i]}.jpg",
                "key": keys[i],
                "status": "success",
                "error_message": None,
                "width": job["size"],
                "height": job["size"],
                "original_width": RENDER,
                "original_height": RENDER,
                "caption": shown[i],
                "sha256": hashlib.sha256(images[i]).hexdigest(),
            }
            sink.write(
                {"__key__": keys[i], "jpg": images[i], "txt": shown[i], "json": json.dumps(meta, sort_keys=True)}
            )
    return noisy


def make_split(out: Path, split: str, n: int, shard_size: int, seed: int, noise: float, size: int, workers: int):
    (out / split).mkdir(parents=True, exist_ok=True)
    shards = math.ceil(n / shard_size)
    jobs = []
    for s in range(shards):
        name = f"{s:0{oom_shard_count(shards)}d}.tar"
        jobs.append(
            {
                "path": str(out / split / name),
                "name": name,
                "split": split,
                "shard_id": s,
                "shards": shards,
                "shard_size": shard_size,
                "start": s * shard_size,
                "stop": min(n, (s + 1) * shard_size),
                "seed": seed,
                "noise": noise,
                "size": size,
                "mtime": MTIME,
            }
        )
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(min(workers, len(jobs))) as pool:
            results = list(pool.map(_make_shard, jobs))
    else:
        results = [_make_shard(j) for j in jobs]
    return jobs, [row for r in results for row in r]


def write_noise(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = ("shard", "key", "donor_key", "caption", "clean_caption")
    table = pa.table({c: pa.array([r[c] for r in rows], pa.string()) for c in cols})
    pq.write_table(table, path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (train/, test/, noise.parquet, info.json)")
    p.add_argument("--train", type=int, default=24000, help="training pairs")
    p.add_argument("--test", type=int, default=1000, help="clean held-out pairs")
    p.add_argument("--shard-size", type=int, default=2000, help="pairs per shard (img2dataset: 10000)")
    p.add_argument("--noise", type=float, default=0.2, help="share of training pairs given another image's caption")
    p.add_argument("--size", type=int, default=32, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if not 0.0 <= args.noise < 1.0:
        p.error(f"--noise must be in [0, 1), got {args.noise}")
    if args.train < 2 or args.test < 1 or args.shard_size < 2:
        p.error("--train must be >= 2, --test >= 1 and --shard-size >= 2")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    train_jobs, noisy = make_split(out, "train", args.train, args.shard_size, args.seed, args.noise, args.size,
                                   args.workers)  # fmt: skip
    test_jobs, _ = make_split(out, "test", args.test, args.shard_size, args.seed, 0.0, args.size, args.workers)
    write_noise(out / "noise.parquet", noisy)
    info = {
        "format": "img2dataset-webdataset",
        "train": {"pairs": args.train, "shards": len(train_jobs), "mismatched": len(noisy)},
        "test": {"pairs": args.test, "shards": len(test_jobs), "mismatched": 0},
        "noise": args.noise,
        "seed": args.seed,
        "draws": draws.VERSION,
        "size": args.size,
        "shard_size": args.shard_size,
        "vocabulary": {
            "shapes": list(SHAPES),
            "colours": sorted(COLOURS),
            "backgrounds": sorted(BACKGROUNDS),
            "positions": list(POSITIONS),
            "sizes": list(SIZES),
            "templates": list(TEMPLATES),
        },
    }
    (out / "info.json").write_text(json.dumps(info, indent=1) + "\n")
    print(
        f"wrote {args.train} train pairs ({len(noisy)} mismatched) in {len(train_jobs)} shards and {args.test} "
        f"held-out pairs to {out} in {time.time() - t0:.1f}s"
    )


if __name__ == "__main__":
    main()
