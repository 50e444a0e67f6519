"""The public API: exactly the names in __all__, each importable, and nothing else public."""

import seta_stream

EXPECTED = {
    "errors",
    "ids",
    "index",
    "openclip",
    "policies",
    "POLICIES",
    "BalanceError",
    "BalancedEpoch",
    "balanced_epoch",
    "split_balanced",
    "EpochClock",
    "epoch_steps",
    "one_pass_per_epoch",
    "CompactionReport",
    "CorruptPartError",
    "EpochOrderError",
    "InvalidInputError",
    "LossRecorder",
    "PlanMissingError",
    "PlanView",
    "PlanWarning",
    "PolicyInput",
    "PopulationLocationError",
    "Pruner",
    "RunDir",
    "RunFormatError",
    "RunLockedError",
    "SampleIdCollisionError",
    "SetaStreamError",
    "SetaStreamWarning",
    "ShardNameConflictError",
    "ShardNameError",
    "UnsupportedPipelineError",
    "__version__",
    "attach",
    "index_shard",
    "read_kept",
    "compact",
    "describe_policies",
    "inspect",
    "keep_filter",
    "kept_tar_samples",
    "list_samples",
    "load_plan",
    "load_summary",
    "load_table",
    "plan_epoch",
    "run_policy",
    "sample_uid",
    "set_current_epoch",
    "shard_location",
    "shard_name",
    "skip_shards",
    "stage_counters",
    "weighted_mean",
}


def test_all_is_the_curated_api():
    assert set(seta_stream.__all__) == EXPECTED
    for name in seta_stream.__all__:
        assert getattr(seta_stream, name) is not None


def test_all_is_exactly_the_public_names_of_the_package():
    """As httpx checks it: every name of vars(seta_stream) not starting with '_' is in __all__
    (private modules are ``_name``), also after every submodule has been imported."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(seta_stream.__path__, "seta_stream."):
        importlib.import_module(info.name)
    public = {name for name in vars(seta_stream) if not name.startswith("_")} | {"__version__"}
    assert public == set(seta_stream.__all__)


def test_every_error_derives_from_the_base():
    for name in (
        "CorruptPartError",
        "EpochOrderError",
        "InvalidInputError",
        "PlanMissingError",
        "RunFormatError",
        "RunLockedError",
        "SampleIdCollisionError",
    ):
        assert issubclass(getattr(seta_stream, name), seta_stream.SetaStreamError)
    assert issubclass(seta_stream.InvalidInputError, ValueError)
