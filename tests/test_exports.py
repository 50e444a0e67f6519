"""The public API: exactly the names in __all__, each importable, each in one place, and nothing
else public; the names the package exported before its face was narrowed still resolve, with a
DeprecationWarning naming where they live."""

import importlib
import pkgutil
import warnings

import pytest

import seta_stream

EXPECTED = {
    # the training loop
    "Pruner",
    "attach",
    "skip_shards",
    "kept_tar_samples",
    "keep_filter",
    "stage_counters",
    "read_kept",
    "index_shard",
    "weighted_mean",
    "balanced_epoch",
    "split_balanced",
    "one_pass_per_epoch",
    "epoch_steps",
    "EpochClock",
    "list_samples",
    # offline
    "RunDir",
    "compact",
    "plan_epoch",
    "load_plan",
    "load_summary",
    "load_table",
    # the public modules
    "errors",
    "ids",
    "index",
    "inspect",
    "openclip",
    "policies",
    "__version__",
}

#: the public modules and what each exports (the package's subpackages ``inspect`` and
#: ``policies`` export what their parts define)
MODULES = {
    "errors": None,  # every class it defines
    "ids": {"shard_location", "shard_name", "sample_uid", "sample_uids"},
    "index": {"load_index", "index_path", "index_while_streaming", "INDEX_SUFFIX"},
    "inspect": {"run_summary", "format_summary", "plot_epoch", "suspects", "suspect_report", "format_suspects"},
    "openclip": {"adapt", "pair_losses", "training_pipeline", "IDS", "MEMBERS"},
}

#: what moved out of ``seta_stream.__all__``, and its one place now
MOVED = {
    **dict.fromkeys(
        [
            "BalanceError",
            "CorruptPartError",
            "EpochOrderError",
            "InvalidInputError",
            "PlanMissingError",
            "PlanWarning",
            "PopulationLocationError",
            "RunFormatError",
            "RunLockedError",
            "SampleIdCollisionError",
            "SetaStreamError",
            "SetaStreamWarning",
            "ShardNameConflictError",
            "ShardNameError",
            "UnsupportedPipelineError",
        ],
        "seta_stream.errors",
    ),
    **dict.fromkeys(["sample_uid", "shard_location", "shard_name"], "seta_stream.ids"),
    **dict.fromkeys(["POLICIES", "PolicyInput", "describe_policies", "run_policy"], "seta_stream.policies"),
    **dict.fromkeys(["LossRecorder", "PlanView", "set_current_epoch"], "seta_stream.testing"),
    "CompactionReport": "seta_stream._losses.compaction",
    "BalancedEpoch": "seta_stream._reading.balance",
}

#: submodules bound on the package once imported that are not the API
NOT_THE_API = {"testing"}


def test_all_is_the_curated_api():
    assert set(seta_stream.__all__) == EXPECTED
    assert len(seta_stream.__all__) == len(EXPECTED) == 28
    for name in seta_stream.__all__:
        assert getattr(seta_stream, name) is not None


def test_all_is_exactly_the_public_names_of_the_package():
    """As httpx checks it: every name of vars(seta_stream) not starting with '_' is in __all__
    (private modules are ``_name``), also after every submodule has been imported; the one
    submodule that is not the API, ``testing``, is named apart."""
    for info in pkgutil.walk_packages(seta_stream.__path__, "seta_stream."):
        importlib.import_module(info.name)
    public = {name for name in vars(seta_stream) if not name.startswith("_")} | {"__version__"}
    assert public == set(seta_stream.__all__) | NOT_THE_API
    assert not set(MOVED) & set(vars(seta_stream)) and not set(MOVED) & set(dir(seta_stream))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_public_module_exports_its_own_names(module):
    mod = importlib.import_module(f"seta_stream.{module}")
    if MODULES[module] is None:  # errors: every class defined there
        defined = {n for n, v in vars(mod).items() if isinstance(v, type) and v.__module__ == mod.__name__}
        assert set(mod.__all__ if hasattr(mod, "__all__") else defined) == defined
    else:
        assert set(mod.__all__) == MODULES[module]


def test_each_public_name_in_one_place():
    """No object exported both by the package and by a public module (``inspect`` and
    ``policies`` are the faces of their parts)."""
    top = {id(getattr(seta_stream, n)) for n in seta_stream.__all__ if not n.startswith("__")}
    for module, names in MODULES.items():
        mod = importlib.import_module(f"seta_stream.{module}")
        names = names if names is not None else {n for n in vars(mod) if isinstance(vars(mod)[n], type)}
        assert not {n for n in names if id(getattr(mod, n)) in top}, module


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_resolves_to_its_new_home_with_a_deprecation_warning(name):
    home = importlib.import_module(MOVED[name])
    with pytest.warns(DeprecationWarning, match=rf"^seta_stream\.{name} moved to {MOVED[name]}\.{name}; "):
        value = getattr(seta_stream, name)
    assert value is getattr(home, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec(f"from seta_stream import {name} as imported", ns := {})  # the import statement too
    assert ns["imported"] is value
    assert name not in vars(seta_stream)  # resolved each time, never bound


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'nosuch'"):
        _ = seta_stream.nosuch


def test_every_error_derives_from_the_base():
    from seta_stream import errors

    for name in (
        "CorruptPartError",
        "EpochOrderError",
        "IndexMismatch",
        "IndexMissing",
        "InvalidInputError",
        "PlanMissingError",
        "RunFormatError",
        "RunLockedError",
        "SampleIdCollisionError",
    ):
        assert issubclass(getattr(errors, name), errors.SetaStreamError)
    assert issubclass(errors.InvalidInputError, ValueError)
    assert issubclass(errors.IndexMissing, FileNotFoundError)


def test_the_projects_own_code_uses_no_moved_name():
    """Studies, benchmarks, tools, examples, tests and docs reach a moved name at its new home
    (``seta.shard_name`` in a study warned on every CIFAR-10 run); only this file reads the old
    spellings, on purpose. Import statements are read whole (parenthesised ones across lines,
    and those in the scripts tests hand to subprocesses)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    names = "|".join(sorted(MOVED))
    attribute = re.compile(rf"\b(?:seta|seta_stream|ss)\.({names})\b")
    statement = re.compile(r"\bfrom seta_stream import (\([^)]*\)|[^;\n]*)")
    files = [
        p
        for d in ("seta_stream", "studies", "benchmarks", "tools", "examples", "tests")
        for p in (root / d).rglob("*.py")
    ]
    files += [*(root / "docs").glob("*.md"), root / "README.md"]
    found = set()
    for p in files:
        if p.name == "test_exports.py":
            continue
        text = p.read_text()
        found |= {f"{p.relative_to(root)}: {m.group(0)}" for m in attribute.finditer(text)}
        found |= {
            f"{p.relative_to(root)}: {m.group(0)}"
            for m in statement.finditer(text)
            if re.search(rf"\b({names})\b", m.group(1))
        }
    assert found == set()
