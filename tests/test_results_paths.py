"""No committed page or result file names a folder of the machine it was written on: every file
under docs/ (result files, logs, pages) and README.md is free of absolute paths such as /tmp/...,
/root/..., /home/..., /work/..., /Users/... or C:\\...; a path is named relative to the repository
or as ``<elsewhere>/NAME`` (``tools.results.path_label``, ``label_paths``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.results import MACHINE_PATH, argv_labels, label_paths

ROOT = Path(__file__).resolve().parent.parent


def committed_texts() -> list[Path]:
    """Every text file under docs/ (binary files such as plots left out) and README.md."""
    out = []
    for p in sorted((ROOT / "docs").rglob("*")) + [ROOT / "README.md"]:
        if not p.is_file():
            continue
        data = p.read_bytes()
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append(p)
    return out


def offending_lines(paths: list[Path]) -> list[str]:
    """'FILE:LINE: the path' for every absolute path of a machine in ``paths``."""
    found = []
    for p in paths:
        for i, line in enumerate(p.read_text().splitlines(), 1):
            for m in MACHINE_PATH.finditer(line):
                found.append(f"{p.relative_to(ROOT).as_posix()}:{i}: {m.group(0)}")
    return found


def test_no_committed_file_names_a_folder_of_a_machine() -> None:
    paths = committed_texts()
    assert len(paths) > 600  # the result files are read, not skipped
    found = offending_lines(paths)
    head = f"{len(found)} absolute paths of a machine under docs/ or in README.md:"
    assert not found, "\n".join([head, *found[:200]])


@pytest.mark.parametrize(
    "text",
    [
        '"run_dir": "/work/main/bench-out/pairs/runs/x"',
        "--out /tmp/collapse/out",
        "--out=/root/out",
        "prepared /tmp/work/cifar10.npz in 8.1s",
        '  File "/home/me/seta_stream/x.py", line 3',
        "/Users/me/data",
        r'"C:\\Users\\me\\runs"',
        r"C:\Users\me\runs",
    ],
)
def test_the_check_finds_each_kind_of_machine_path(text: str) -> None:
    assert MACHINE_PATH.search(text)
    assert not MACHINE_PATH.search(label_paths(text))  # what the writers put in its place passes


@pytest.mark.parametrize(
    "text",
    ["bench-out/work/x", "../shared/data/cifar10", "<elsewhere>/out", "/data/cifar10", "a:\\n\\n", "https://x/tmp/y"],
)
def test_relative_paths_labels_and_example_paths_pass(text: str) -> None:
    assert not MACHINE_PATH.search(text)


def test_the_writers_labels() -> None:
    # a folder of this machine neither in the checkout nor beside it (a clone under /tmp has /tmp beside it)
    far = next(
        f for f in ("/tmp", "/root", "/home") if not ROOT.parent.is_relative_to(f) and f != ROOT.parent.as_posix()
    )
    assert label_paths(f"prepared {ROOT}/bench-out/x.npz in 1s") == "prepared bench-out/x.npz in 1s"
    assert label_paths(f"prepared {ROOT.parent}/no-such-folder/x.npz in 1s") == "prepared ../no-such-folder/x.npz in 1s"
    assert label_paths(f"--out {far}/collapse/out") == "--out <elsewhere>/out"
    assert label_paths(f"no such file: {far}/a/b.") == "no such file: <elsewhere>/b."
    assert argv_labels(["--run", "full", "--out", f"{far}/collapse/out"]) == [
        "--run",
        "full",
        "--out",
        "<elsewhere>/out",
    ]
