"""From recorded losses to the loss table (private).

``record`` (``LossRecorder``: the training process's side, writing loss parts), ``compaction``
(``compact``: the transaction that folds pending parts into the table), ``fold`` (its pure
kernel) and ``route`` (the scratch files that route a partitioned run's rows to their buckets).
They import storage (``_store``) and kernels (``_kernels``), never planning or the readers;
docs/architecture.md maps them.
"""
