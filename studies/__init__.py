"""The accuracy studies: does pruning keep accuracy, and does the noise rule leave noisy samples out? Every
number of docs/quality*.md, docs/baselines*.md, docs/cifar-gpu.md, docs/words-noise.md, docs/results.md
and README's headline comes from a result file under docs/quality-runs/ that one of these studies wrote,
and each page is generated from those files. One command, from the repository root::

    python -m studies --help                              # the studies, one line each
    python -m studies baselines_pairs --report-only       # docs/baselines.md from its result files
    python -m studies quality --report-only               # every section of the quality pages

(``python -m studies.NAME`` runs the same module.)

Packages and modules, one job each (no circle: tests/test_tree_shape.py):

    quality/    the studies' runner, data sets, models, training, reports (its own docstring maps it),
                and the instability scan every page reads
    engines/    the training loops the pairs and word-image studies train through (examples/ holds the
                loops a user copies; these are the studies', changed only with them)
    baselines_labels, baselines_pairs, cifar_gpu, words_noise   a study each, with its page
    headline    README's headline table and docs/results.md's finding, from the baselines' files
    noise_study, pairs_study, noise_scale_check   the quality package's studies by name
    seam        the library's private names a study needs (the only file here importing one)

The speed benchmarks are the other wing, ``benchmarks/``; this one imports nothing of it. Both build on
``tools`` (``tools.draws``: every seeded choice; ``tools.results``: result files and the gap verdict).
"""
