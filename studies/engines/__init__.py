"""The training loops the studies train through: ``pairs`` (a small CLIP on image-text pairs from
``tools.make_pair_shards``: the pairs, noise and baselines-pairs studies, the collapse readings) and
``words`` (a small CNN on word images from ``tools.make_word_shards``: the words-noise study), sharing
``common`` (the policy options, run names, the small-final-batch warning, the two-run comparison).

Each ``run()`` trains one configuration and returns what the studies record: per epoch the kept and
trained counts, the loss, the held-out metrics, the steps and the last batch's length, and on request the
keys delivered in every epoch (``keep_keys``), a validation split's metrics (``val``, pairs) and an equal
compute budget (``budget``, pairs). Their results are committed under docs/quality-runs/: a change to
these loops changes what a study would measure again, so they change only with the studies.
``examples/`` holds the loops a user copies (the public API only, nothing shared with these).

``python -m studies.engines.pairs ARGS`` (``words``) trains the chosen policy and full data from the same
seed and prints the comparison: ``bash tools/demo.sh`` runs the pairs engine with the noise study's
calibrated setting.
"""
