"""The speed benchmarks: what the library's recording, compaction, planning and reading cost, each
beside a baseline measured in the same run. One command, from the repository root::

    python -m benchmarks --help                 # the benchmarks, one line each
    python -m benchmarks bench_plan --n 15000000 --repeat 7
    python -m benchmarks report                 # docs/benchmarks.md's blocks from docs/benchmarks/*.json

(``python -m benchmarks.NAME`` runs the same module.) Each benchmark writes one result file
(``common.Result``: the command line, the commit, the machine, the load, the baseline) under
docs/benchmarks/, and ``report`` renders docs/benchmarks.md's tables from them.

Modules: ``bench_*`` (one measurement each), ``ab_*`` (two source trees alternating in the same
period), ``common`` (synthetic runs, :func:`~benchmarks.common.measure` in a fresh interpreter, the
result file), ``report``, ``openclip_replica`` (OpenCLIP's tar reader, timed by ``bench_stage``),
``seam`` (the library's private names a benchmark times). The accuracy studies are the other wing,
``studies/``; this one imports nothing of it (both build on ``tools.results``).
"""
