#!/usr/bin/env bash
# Prints the path of a working Python interpreter of version $1 (e.g. 3.12), or nothing.
# Looks in pyenv's versions first, newest patch release first (the machines here keep 3.11,
# 3.12 and 3.13 there, and pyenv's shims run only the active version), then on PATH.
set -u
want=${1:?usage: tools/find_python.sh MAJOR.MINOR}
root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
mapfile -t installed < <(ls -d "$root"/versions/"$want".*/bin/python"$want" 2>/dev/null | sort -V -r)
for candidate in "${installed[@]}" "python$want"; do
  path=$(command -v "$candidate" 2>/dev/null) || continue
  check="import sys, venv; sys.exit(sys.version_info[:2] != tuple(map(int, '$want'.split('.'))))"
  if "$path" -c "$check" 2>/dev/null; then
    echo "$path"
    exit 0
  fi
done
