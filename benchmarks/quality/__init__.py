"""Does pruning keep accuracy? Every policy trained through the real pipeline on real data.

Shards -> ``seta.attach`` (skip_shards + keep_filter) -> DataLoader worker -> model -> recorded
per-sample losses -> compaction -> plan of the next epoch, exactly as a user's loop does it.

Two studies, one command (``python -m benchmarks.quality``, see ``__main__``):

* ``--study short`` (default): every policy at 6 (CIFAR-10) / 5 (SST-2) epochs, clean and with
  40% label noise;
* ``--study converged``: CIFAR-10 trained for E epochs, long enough that full data has converged
  (checked against 2E), the pruned runs at E, and full data trained for round(E (1 - p)) epochs
  for each measured pruned fraction p: the same compute as the pruned run.

Each finished run is one JSON file under ``docs/quality-runs/`` (``converged/`` for the second
study); a rerun skips finished runs, so a study resumes (a converged-study run also resumes
from the checkpoint of its last finished epoch). The converged study may run as several processes
into the same results, one per core: each trains the plan's next run no other process has
claimed. ``--report-only`` rewrites
docs/quality.md, its plots and docs/results.md's table from those files; every number in their
generated prose comes from the run files (``reading``, ``reading_short``, ``report_collapses``).

Modules, one job each (an arrow = may import):

    layout      where results, documents, plots and run directories live
    data        the data sets (splits) and the fixed label corruption
    models      the models and the text featurisation
    pipeline    the training loader through seta.attach, collation, evaluation
    machine     how much of the machine other processes used (CPU readings)
    train       one training run -> a result dict             (data, models, pipeline, machine)
    calibrate   pruning settings from the full run's training losses
    configs     which runs each study makes, their ids, the run order
    study       runs the plan, writes and resumes result files (all of the above)
    results     reads result files; grouping and formatting helpers
    checks      result files and run directories against the policy rules (configs)
    plots       the figures                                   (results)
    report      the short study's section of docs/quality.md, and the splicing of a generated
                section between its markers                   (results, plots, checks, configs, layout)
    report_converged  the converged study's section           (report, results, plots, checks, configs, collapses)
    collapses   the rule for a run whose accuracy fell to chance, the plan before it (policy rules, lr
                schedule), the schema of docs/quality-runs/collapses.json            (train)
    report_collapses  the section listing every collapse      (collapses, report, results, configs)
    reading     the converged study's prose, the summary at the top of docs/quality.md, numbers from
                the run files  (report_converged, machine, report)
    results_table  docs/results.md's table of the converged study           (reading, results)
    reading_short  the short study's prose ("The regime", "Findings")      (report, results)
    collapse    the collapse experiments: a run forked at its epochs' final batches (train, configs, data, pipeline)
    collapse_list  docs/quality-runs/collapses.json: the epochs at chance, their plans and experiments (train, layout)
    __main__    the command line
"""
