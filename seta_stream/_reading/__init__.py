"""The reading side: what DataLoader workers run to apply a plan (private).

``planview`` (how readers apply a plan: ``PlanView``, ``ShardDecisions``, ``StageCounts``),
``stages`` (the webdataset stages and ``attach``), ``balance`` (balanced epochs), ``reader``
(``read_kept``: range reads through a shard index), ``shardindex`` (the shard indexes;
``seta_stream.index`` is their public face), ``tario`` (tar members), ``wds`` (what differs
between webdataset releases), ``listing`` (``list_samples``), ``epochs`` (epochs that follow the
plan). They read the run's files through ``_store`` and draw with ``_kernels.draws``; they
import no policy and nothing of planning (``_planning``) or of the loss table's writers
(``_losses``), so a worker imports none of them (tests/test_worker_imports.py).
"""
