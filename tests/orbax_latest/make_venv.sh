#!/usr/bin/env bash
# Builds .venv-orbax/: orbax-checkpoint 0.12.8 (orbax-latest, the anchor of tests/test_policies_differential.py)
# in its own Python 3.12 interpreter, since it needs a newer Python and jax than paxml 1.4.0's stack.
# Usage: tests/orbax_latest/make_venv.sh [python3.12]   (default: pyenv's 3.12, else python3.12 on PATH)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-orbax
PY=${1:-$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12*/bin/python3.12 2>/dev/null \
  | sort -rV | head -n1)}
PY=${PY:-$(command -v python3.12 || true)}
if [ -z "$PY" ]; then
  echo "error: Python 3.12 not found (orbax-checkpoint 0.12.8 needs it): install it (e.g. 'pyenv install 3.12') or pass its path" >&2
  exit 1
fi
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import orbax.checkpoint as o; assert o.__version__ == "0.12.8"' 2>/dev/null; then
  exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q 'orbax-checkpoint==0.12.8'
"$VENV/bin/python" -c 'import orbax.checkpoint as o; print("orbax-checkpoint", o.__version__, "in '"$VENV"'")'
