#!/usr/bin/env bash
# The test command: installs what the tests need (tools/setup.sh), runs the whole suite, then
# runs the tests of the webdataset stages, readers and examples again in .venv-wds-oldest, against
# the oldest webdataset pyproject.toml admits (OpenCLIP's training extra pins webdataset<=0.2.86).
# With arguments, runs only pytest with them in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
.venv/bin/python -m pytest -q -p no:cacheprovider

# each "pkg>=X" of pyproject.toml's dependencies as pkg==X: the oldest versions it admits
LOWEST=$(sed -n '/^dependencies = \[/,/^\]/s/^ *"\([A-Za-z0-9_-]*\)>=\([0-9.]*\)",.*$/\1==\2/p' pyproject.toml)
OLDEST=$(echo "$LOWEST" | sed -n 's/^webdataset==//p')
if [ -z "$OLDEST" ]; then
    echo "tools/test.sh: no \"webdataset>=X\" line in pyproject.toml's dependencies" >&2
    exit 1
fi
PYTHON=${PYTHON:-python3}
OLD=.venv-wds-oldest
if [ ! -x "$OLD/bin/python" ]; then
    "$PYTHON" -m venv "$OLD"
fi
# torch==2.13.0 comes from .venv: a .pth file puts .venv's site-packages after this venv's own,
# so webdataset and the project's other dependencies are this venv's (installing torch again
# would add about two minutes to CI)
own=$("$OLD/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
rm -f "$own/venv-torch.pth"
"$OLD/bin/python" -m pip install -q --disable-pip-version-check -e . "webdataset==$OLDEST" "pytest>=8"
.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$own/venv-torch.pth"
"$OLD/bin/python" -c "
import sys, torch, webdataset
assert webdataset.__version__ == '$OLDEST' and torch.__version__.startswith('2.13.0'), (webdataset.__file__, torch.__version__)
print('webdataset', webdataset.__version__, 'torch', torch.__version__, 'Python', sys.version.split()[0])"
# the spawn-context tests are left out here: they test torch's worker start, not webdataset
"$OLD/bin/python" -m pytest -q -p no:cacheprovider -k "not spawn" \
    tests/test_stage.py tests/test_readers_agree.py tests/test_tario.py tests/test_index_reader.py \
    tests/test_url_idioms.py tests/test_listing.py tests/test_openclip.py tests/test_balance.py \
    tests/test_examples.py

# The core (recording, compaction, planning, inspection, the readers; no torch, no extra) on the
# oldest Python and dependency versions pyproject.toml admits ($LOWEST) and on the newest Python
# here with the newest releases. Neither has torch: no CPU build of it is reachable for those
# Pythons, and the core runs without it.
CORE_TESTS=(arrays buckets cli crash_compaction errors exact exports fold ids index_headers index_reader
    keys_file kmeans1d layout listing mixture_spec parts plan plan_kernels plans planview policies
    policy_evolved policy_full policy_infobatch policy_noise policy_random policy_random_draws
    policy_seta policy_steps readers_agree runfs session shard_conflicts state steps suspects table
    tario text_to_shards worker_imports)
find_python() {  # an interpreter of Python $1: on PATH, else pyenv's newest $1.x
    if "python$1" -c "" 2>/dev/null; then
        command -v "python$1"
    elif command -v pyenv >/dev/null && v=$(pyenv versions --bare | grep -E "^$1\.[0-9]+$" | tail -1) && [ -n "$v" ]; then
        echo "$(pyenv root)/versions/$v/bin/python$1"
    else
        return 1
    fi
}
core_run() {  # core_run VENV PYTHON_VERSION PIP_ARGS...: a venv of that Python with the core installed, the core tests
    local venv=$1 version=$2 python
    shift 2
    if ! python=$(find_python "$version"); then
        echo "tools/test.sh: no Python $version on this machine (PATH or pyenv): its core run is left out" >&2
        return 0
    fi
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e . "$@" "pytest>=8" "hypothesis>=6.100" "pillow>=10"
    "$venv/bin/python" -c "
import sys, numpy, pyarrow, polars, fsspec, tqdm, webdataset
print('core on Python', sys.version.split()[0], 'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__,
      'polars', polars.__version__, 'fsspec', fsspec.__version__, 'tqdm', tqdm.__version__, 'webdataset', webdataset.__version__)"
    local files=() t
    for t in "${CORE_TESTS[@]}"; do files+=("tests/test_$t.py"); done
    "$venv/bin/python" -m pytest -q -p no:cacheprovider "${files[@]}"
}
REQUIRES=$(sed -n 's/^requires-python = ">=\([0-9.]*\)"$/\1/p' pyproject.toml)
# shellcheck disable=SC2086  # one argument per pin
core_run .venv-core-oldest "$REQUIRES" $LOWEST
core_run .venv-core-newest 3.13 --upgrade numpy pyarrow polars fsspec tqdm webdataset
