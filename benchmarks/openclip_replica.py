"""OpenCLIP's tar reader, as open_clip_train/data.py (open-clip-torch 3.3.0, training branch)
defines it: a grouper that never raises on a repeated file name. ``seta_stream.openclip.adapt``
puts ``keep_filter`` after it (``attach`` finds it by its name, ``tarfile_to_samples_nothrow``).

One line is added in ``group_by_keys_nothrow`` (marked): it skips webdataset 1.x's end-of-shard
marker, which OpenCLIP, pinned to webdataset<=0.2.86, never meets. OpenCLIP itself is not
installed here; ``bench_stage.py`` times this copy and tests/test_openclip.py builds OpenCLIP's
pipeline with it (tools/openclip_check.sh runs OpenCLIP's own code, docs/openclip.md)."""

from __future__ import annotations

import logging

from webdataset.tariterators import base_plus_ext, tar_file_expander, url_opener, valid_sample


def log_and_continue(exn):
    logging.warning(f"Handling webdataset error ({repr(exn)}). Ignoring.")
    return True


def group_by_keys_nothrow(data, keys=base_plus_ext, lcase=True, suffixes=None, handler=None):
    current_sample = None
    for filesample in data:
        if not filesample:  # added: webdataset 1.x's end-of-shard marker
            continue
        assert isinstance(filesample, dict)
        fname, value = filesample["fname"], filesample["data"]
        prefix, suffix = keys(fname)
        if prefix is None:
            continue
        if lcase:
            suffix = suffix.lower()
        if current_sample is None or prefix != current_sample["__key__"] or suffix in current_sample:
            if valid_sample(current_sample):
                yield current_sample
            current_sample = dict(__key__=prefix, __url__=filesample["__url__"])
        if suffixes is None or suffix in suffixes:
            current_sample[suffix] = value
    if valid_sample(current_sample):
        yield current_sample


def tarfile_to_samples_nothrow(src, handler=log_and_continue):
    streams = url_opener(src, handler=handler)
    files = tar_file_expander(streams, handler=handler)
    samples = group_by_keys_nothrow(files, handler=handler)
    return samples
