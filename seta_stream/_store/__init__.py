"""Every on-disk format of a run directory and the access to its storage (private).

``runfs`` (``RunDir``: the only way to a run directory's files), ``layout`` (every run-relative
path), ``faults`` (named crash points of the write steps), and one module per format: ``parts``
(loss parts), ``table`` (the loss table), ``planfiles`` (the plan folders), ``state``
(state.json), ``slots`` (slot claims). They decide nothing; docs/architecture.md and
docs/format.md map them.
"""
