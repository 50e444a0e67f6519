#!/usr/bin/env bash
# The test command: installs what the tests need (tools/setup.sh), runs the whole suite, then
# runs the tests of the webdataset stages and readers again in .venv-wds-oldest, against the
# oldest webdataset pyproject.toml admits (OpenCLIP's training extra pins webdataset<=0.2.86).
# With arguments, runs only pytest with them in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
.venv/bin/python -m pytest -q -p no:cacheprovider

OLDEST=$(sed -n 's/^ *"webdataset>=\([0-9.]*\)",$/\1/p' pyproject.toml)
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
exec "$OLD/bin/python" -m pytest -q -p no:cacheprovider -k "not spawn" \
    tests/test_stage.py tests/test_readers_agree.py tests/test_tario.py tests/test_index_reader.py \
    tests/test_url_idioms.py tests/test_listing.py tests/test_openclip.py tests/test_balance.py
