"""Planning: from the loss table to the published plan of an epoch (private).

``transaction`` (``plan_epoch``: the settings, the plan lock, the order of publishing),
``settings`` (``PlanSettings``: what a plan is asked, in one value), ``population`` (the listed
samples merged into the table's rows), ``buckets`` (a partitioned plan's per-bucket inputs, kept
in memory or spilled) and ``tuning`` (normal memory pages and the imports done beside planning).
They run the policies (``seta_stream.policies``) on the table (``_store``); nothing here is
imported by the readers (``_reading``); docs/architecture.md maps them.
"""
