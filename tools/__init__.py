"""The repository's tools (run from the repository root, ``python -m tools.NAME``; the shell scripts with
``bash tools/NAME.sh``), and the two conventions both wings build on, so that neither imports the other:

* ``draws``: every seeded choice of the data tools and the studies (one keyed hash, one purpose each);
* ``results``: how a committed result file is written and judged (whole-file writes, no path of this machine
  in it, the one gap verdict), for the speed benchmarks (``benchmarks/``) and the accuracy studies
  (``studies/``) alike.

The data tools (``make_pair_shards``, ``make_word_shards``, ``text_to_shards``) write WebDataset sets; the
others check the tree (``tree_report``) or OpenCLIP (``openclip_check``, ``openclip_report``). Nothing here
imports ``benchmarks`` or ``studies``.
"""
