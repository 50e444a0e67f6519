"""Pure array kernels, and where the map/reduce steps of partitioned work run (private).

``arrays`` (Arrow columns to NumPy, grouping orders, shard runs), ``exact`` (exact mergeable
sums, radix order statistics, distinct keys), ``mapreduce`` (the ``Step`` protocol and its exact
cuts), ``engine`` (local threads or Ray tasks), ``kmeans1d`` and ``mixture1d`` (the 1-D
clusterings of SeTa and the noise rule), ``draws`` (the per-sample uniform draw of (uid, seed,
epoch, stream)) and ``batches`` (the batch-size check and the small-final-batch warning). They
read and write no run file and name no policy; docs/architecture.md maps them.
"""
