"""The population of a plan: every (shard, key) of the data set, merged into the loss table's rows.

``plan_epoch(..., population=...)`` plans the samples a run never recorded as unseen rows
(otherwise the stages apply the plan's absent rule to them). This module turns a population
(pairs, a dict of columns or a table, with or without the ``url`` column ``list_samples`` gives)
into (shard, key) rows, checks its shard names against their locations and the loss table's
(:func:`population_table`), adds the samples the table lacks as unseen rows grouped by shard
(:func:`merge_population`), splits it by bucket for a partitioned run
(:func:`split_population`), and gives the locations a ``Pruner`` checks recorded URLs against
(:func:`population_locations`). Part of planning (``seta_stream._planning``); reads no run file.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._kernels.arrays import group_order
from .._store.layout import MANIFEST
from .._store.runfs import RunDir
from ..errors import InvalidInputError, PopulationLocationError
from ..ids import ShardLocations, sample_uids, shard_bucket, shard_location

__all__ = [
    "TABLE_COLUMNS",
    "HISTORY_INPUTS",
    "table_columns",
    "population_locations",
    "population_table",
    "with_population",
    "merge_population",
    "split_population",
]

TABLE_COLUMNS = ["shard", "key", "uid", "last_loss", "last_epoch", "seen", "ema"]
#: Loss-history columns, read only for a policy that declares them (the noise rule).
HISTORY_INPUTS = ["loss_count", "loss_mean"]
#: The value of each input column for a listed sample the table lacks (never recorded).
_UNSEEN: dict[str, tuple[Any, Any]] = {
    "last_loss": (np.nan, np.float32),
    "last_epoch": (-1, np.int32),
    "seen": (0, np.int32),
    "ema": (np.nan, np.float64),
    "loss_count": (0, np.int32),
    "loss_mean": (np.nan, np.float64),
}


def table_columns(declared: list[str]) -> list[str]:
    """The table columns a plan with a population reads: identities, the plan's numeric columns,
    and the history columns when the policy or a stage in front of it declares them (``declared``:
    the plan's table columns, ``policies.registry.planned_table_columns``)."""
    return TABLE_COLUMNS + [c for c in HISTORY_INPUTS if c in declared]


#: how to fix a population whose locations are not the ones training recorded (the end of the error)
_POPULATION_HINT = (
    "The loss table holds the locations of the URLs training recorded, so the population and the training "
    "URLs name different locations (a mirror listed, other URLs trained?): list the population from the same "
    "URLs you train from, population=seta_stream.list_samples(<the URLs the training pipeline reads>); a run "
    "keeps the locations it first recorded, so training from shards moved elsewhere needs a new run directory"
)


def _shard_urls(t: pa.Table) -> list[dict[str, str]]:
    """The distinct (shard, url) pairs of a population table with a ``url`` column."""
    return (
        pa.table({"shard": pc.cast(t.column("shard"), pa.string()), "url": pc.cast(t.column("url"), pa.string())})
        .group_by(["shard", "url"])
        .aggregate([])
        .to_pylist()
    )


def population_locations(population: Any) -> dict[str, str]:
    """{shard name: location} of a population that carries its shards' URLs (the ``url`` column
    of ``list_samples``, in a table or a dict of columns); {} for one without (pairs are not
    consumed). A name with several locations keeps one: planning refuses such a population."""
    if isinstance(population, pa.Table):
        t = population
    elif isinstance(population, dict) and "url" in population and "shard" in population:
        t = pa.table({"shard": population["shard"], "url": population["url"]})
    else:
        return {}
    if "url" not in t.column_names or "shard" not in t.column_names or not t.num_rows:
        return {}
    out: dict[str, str] = {}
    for pair in _shard_urls(t):
        out.setdefault(pair["shard"], shard_location(pair["url"]))
    return out


def population_table(population: Any, locations: dict[str, str], run: RunDir) -> pa.Table:
    """(shard, key) of the population; with a ``url`` column (as ``list_samples`` returns) the
    shard names are checked against their locations and the loss table's (a name standing for
    two shards stops planning with :class:`ShardNameConflictError`, one the table recorded
    elsewhere with :class:`PopulationLocationError`)."""
    if isinstance(population, pa.Table):
        t = population
    elif isinstance(population, dict):
        t = pa.table({c: population[c] for c in ("shard", "key", "url") if c in population})
    else:
        pairs = list(population)
        t = pa.table({"shard": [p[0] for p in pairs], "key": [p[1] for p in pairs]})
    missing = {"shard", "key"} - set(t.column_names)
    if missing:
        raise InvalidInputError(f"population lacks column(s) {sorted(missing)}; expected shard and key")
    if "url" in t.column_names and t.num_rows:
        seen = ShardLocations(
            locations,
            f"the loss table ({run.display(MANIFEST)})",
            "their samples would share one plan row per key, so nothing was planned",
            known_hint=_POPULATION_HINT,
            known_error=PopulationLocationError,
        )
        for pair in _shard_urls(t):
            seen.check(pair["shard"], shard_location(pair["url"]), f"the population, url {pair['url']!r}")
    return t.select(["shard", "key"]).cast(pa.schema([("shard", pa.string()), ("key", pa.string())]))


def with_population(table: pa.Table, population: Any, locations: dict[str, str], run: RunDir) -> pa.Table:
    return merge_population(table, population_table(population, locations, run))


def merge_population(table: pa.Table, pop: pa.Table) -> pa.Table:
    """``table``'s rows and the population's samples it lacks (unseen rows), grouped by shard."""
    if pop.num_rows == 0:
        return table
    uid = sample_uids(pop.column("shard"), pop.column("key"))
    uid, first = np.unique(uid, return_index=True)
    pop = pop.take(pa.array(first))
    known = np.isin(uid, table.column("uid").to_numpy())
    add = np.flatnonzero(~known)
    if len(add) == 0:
        return table
    n = len(add)
    columns = [c for c in table.column_names if c not in ("shard", "key", "uid")]
    extra = pa.table(
        {
            "shard": pop.column("shard").take(pa.array(add)),
            "key": pop.column("key").take(pa.array(add)),
            "uid": pa.array(uid[add], type=pa.uint64()),
            **{c: pa.array(np.full(n, _UNSEEN[c][0], dtype=_UNSEEN[c][1])) for c in columns},
        }
    )
    merged = pa.concat_tables([table.select(extra.column_names).cast(extra.schema), extra]).combine_chunks()
    # keep rows grouped by shard (stable: table order within a shard, then new rows)
    enc = pc.dictionary_encode(merged.column("shard")).combine_chunks()
    names = np.array(enc.dictionary.to_pylist(), dtype=object)
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(names, kind="stable")] = np.arange(len(names))
    perm = group_order(rank[enc.indices.to_numpy(zero_copy_only=False)], len(names))
    return merged.take(pa.array(perm))


def split_population(population: Any, locations: dict[str, str], run: RunDir) -> list[pa.Table]:
    """The population's (shard, key) rows per bucket (checked against the table's locations)."""
    pop = population_table(population, locations, run)
    enc = pc.dictionary_encode(pop.column("shard")).combine_chunks()
    lut = np.array([shard_bucket(s, run.buckets) for s in enc.dictionary.to_pylist()], np.int64)
    where = lut[enc.indices.to_numpy(zero_copy_only=False)] if len(lut) else np.zeros(0, np.int64)
    return [pop.take(pa.array(np.flatnonzero(where == b))) for b in range(run.buckets)]
