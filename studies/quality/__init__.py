"""The accuracy studies: does pruning keep accuracy, and does the noise rule drop noisy samples?

Every policy trained through the real pipeline on real data: shards -> ``seta.attach`` -> DataLoader
worker -> model -> recorded per-sample losses -> compaction -> plan of the next epoch. One command
(``python -m studies quality``, ``__main__``) runs any study through one runner and rewrites every
generated section of the docs (``--report-only``); each finished run is one JSON file under
``docs/quality-runs/``, the evidence every number of the reports comes from.

The studies' seeded choices come from ``tools.draws`` (one keyed hash, one generator per purpose,
shared with the data tools; tests/test_study_draws.py checks each choice is what it says), the pairs
runs' training from ``studies.engines.pairs``.

Modules, one job each (in brackets what each may import; no circle, tests/test_tree_shape.py):

    layout, data, models, pipeline, machine, train   where things live; the data sets, networks,
                the training loader, the machine's load, one training run (data, models, pipeline,
                machine)
    harness     the one runner: a study's plan of jobs shared by processes under claims, resume
                (finished result files skipped), whole-file writes, the machine recorded, deadline
    configs, calibrate   the runs of the short and converged studies and their ids; settings chosen on
                training losses (``choose``, also the pairs study's)
    study       the short and converged studies' jobs        (harness, configs, calibrate, train)
    pairs       the image-text pairs study: jobs and report  (harness, calibrate, collapses, configs, docs)
    noise       the noise rule on pairs and noisy labels: jobs, measures, the rule's calibration
                (harness, pairs, configs, train); its report: noise_report (docs)
    noise_scale the closed-loop check of the rule's scale   (noise, noise_report, docs)
    collapses, collapse   the rule for a run that fell to chance and docs/quality-runs/collapses.json;
                the experiments on its cause
    instability the scan of every study's result files for runs that fell to chance (collapses), read by
                every page that marks them
    checks, plots  result files and run directories against the policy rules; the figures
    docs        the report layer's helpers (readers of result files, splicing, tables)
    report, reading_short   the short study's section and its findings table   (docs, checks, plots)
    report_converged, reading, report_collapses   the converged study's sections, its reading
                (one table of the pruned configurations), the summary and docs/results.md's table,
                the collapses section
    reports     every generated section (``report_all``)       (all the report modules)
"""
