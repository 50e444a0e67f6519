"""Where everything lives in a run directory: every run-relative path is spelled here.

docs/format.md is the authority; this module is its index in code. Paths are relative to the
run directory and use ``/`` on every storage (``RunDir.path`` joins them to the root)::

    seta-stream.json                                   FORMAT_FILE (runfs)
    losses/rank=R/epoch=E/part-*.parquet               loss parts (parts)
    losses-quarantine/rank=R/epoch=E/part-*.parquet    parts set aside by compact(on_corrupt="skip")
    losses-superseded/rank=R/epoch=E/part-*.parquet    parts of an interrupted epoch (session)
    table/manifest.json, table/table-*.parquet, table/keys-*.arrow      loss table, version 1 (table)
    table/gen-G-TOKEN/part-BBBBB.parquet, table/keys/bBBBBB-G-TOKEN.arrow  loss table, version 2 (table)
    plans/epoch=E/{plan.parquet/, summary.json, stage.arrow, shards.arrow | stage/}  (plans)
    state.json                                         policy settings, history, current epoch (state)
    stats/epoch=E/rank=R.json                          samples each rank trained (session, inspect)
    slots/epoch=E/world=W-workers=N-rank=R-worker=K    slot claims of a balanced epoch (slots)
    locks/NAME.lock                                    (runfs)

Pure string functions, no I/O.
"""

from __future__ import annotations

import re

__all__ = [
    "FORMAT_FILE",
    "STATE",
    "MANIFEST",
    "LOSSES",
    "PARTS_GLOB",
    "QUARANTINE",
    "SUPERSEDED",
    "PLANS_GLOB",
    "part_path",
    "moved_part",
    "table_file",
    "keys_file",
    "plan_stage_file",
    "table_folder",
    "bucket_table_file",
    "bucket_keys_file",
    "plan_dir",
    "plan_file",
    "stats_file",
    "stats_glob",
    "SLOTS",
    "slot_claim_file",
    "slot_claims_glob",
    "lock_file",
    "epoch_of",
    "rank_of",
]

FORMAT_FILE = "seta-stream.json"
STATE = "state.json"
MANIFEST = "table/manifest.json"
LOSSES = "losses/"
PARTS_GLOB = "losses/rank=*/epoch=*/part-*.parquet"
QUARANTINE = "losses-quarantine/"
SUPERSEDED = "losses-superseded/"
PLANS_GLOB = "plans/epoch=*/summary.json"
#: Every table file, keys file and temporary of ``table/`` (cleanup removes those no manifest names).
TABLE_GLOBS = ("table/table-*.parquet", "table/keys-*.arrow", "table/.tmp-*", "table/gen-*", "table/keys/*.arrow")

_EPOCH = re.compile(r"(?:^|/)epoch=(\d+)(?:/|$)")
_RANK = re.compile(r"(?:^|/)rank=(\d+)(?:/|$)")


def part_path(rank: int, epoch: int, seq0: int, token: str) -> str:
    """A loss part's path: rank, epoch, first ``seq`` and a random token (docs/format.md)."""
    return f"losses/rank={rank}/epoch={epoch}/part-R{rank:05d}-E{epoch:06d}-{seq0:020d}-{token}.parquet"


def moved_part(rel: str, folder: str) -> str:
    """Where a part under ``losses/`` goes in ``folder`` (QUARANTINE or SUPERSEDED)."""
    if not rel.startswith(LOSSES):
        raise ValueError(f"{rel!r} is not a loss part path (expected it under {LOSSES!r})")
    return folder + rel[len(LOSSES) :]


def table_file(generation: int, token: str) -> str:
    return f"table/table-{generation:06d}-{token}.parquet"


def keys_file(generation: int, token: str) -> str:
    return f"table/keys-{generation:06d}-{token}.arrow"


def table_folder(generation: int, token: str) -> str:
    """The folder of a partitioned table (format version 2): one Parquet file per bucket, so that
    polars and pyarrow read the folder, and duckdb ``folder/*.parquet``, as one table."""
    return f"table/gen-{generation:06d}-{token}"


def bucket_table_file(folder: str, bucket: int) -> str:
    """Bucket ``bucket``'s file in a partitioned table's ``folder`` (name order = bucket order)."""
    return f"{folder}/part-{bucket:05d}.parquet"


def bucket_keys_file(bucket: int, generation: int, token: str) -> str:
    """The keys file of one bucket of a partitioned table (kept across generations while the
    bucket gains no sample)."""
    return f"table/keys/b{bucket:05d}-{generation:06d}-{token}.arrow"


def plan_dir(epoch: int) -> str:
    return f"plans/epoch={int(epoch)}"


def plan_file(epoch: int, name: str) -> str:
    """A file of the plan of ``epoch``: plan.parquet, summary.json, stage.arrow, shards.arrow."""
    return f"{plan_dir(epoch)}/{name}"


def plan_stage_file(epoch: int, bucket: int, kind: str) -> str:
    """A partitioned plan's stage file of one bucket: ``kind`` "stage" (its rows, one record
    batch per shard) or "shards" (its shard index)."""
    return f"{plan_dir(epoch)}/stage/{kind}-{int(bucket):05d}.arrow"


def stats_file(epoch: int, rank: int) -> str:
    return f"stats/epoch={int(epoch)}/rank={int(rank)}.json"


def stats_glob(epoch: int) -> str:
    return f"stats/epoch={int(epoch)}/rank=*.json"


SLOTS = "slots"


def slot_claim_file(epoch: int, world_size: int, workers: int, rank: int, worker: int) -> str:
    """The claim of one reader of a balanced epoch: its count of the job's slots and its slot."""
    return f"{SLOTS}/epoch={int(epoch)}/world={world_size}-workers={workers}-rank={rank}-worker={worker}"


def slot_claims_glob(epoch: int) -> str:
    return f"{SLOTS}/epoch={int(epoch)}/world=*"


def lock_file(name: str) -> str:
    return f"locks/{name}.lock"


def epoch_of(rel: str) -> int:
    """The E of an ``epoch=E`` path component (parts, plans, stats)."""
    match = _EPOCH.search(rel)
    if match is None:
        raise ValueError(f"{rel!r} has no epoch=E component")
    return int(match.group(1))


def rank_of(rel: str) -> int:
    """The R of a ``rank=R`` path component (parts)."""
    match = _RANK.search(rel)
    if match is None:
        raise ValueError(f"{rel!r} has no rank=R component")
    return int(match.group(1))
