#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Python packages the tests use beyond Debian's (scripts/deps.sh installs
# python3-torch, -numpy, -pytest, -venv): Hugging Face transformers and
# accelerate, for tests/python/test_hf_trainer.py. Debian's pip refuses to
# install into the system (PEP 668), so they go into a virtual environment
# in the checkout, .venv-test/, made from /usr/bin/python3 with
# --system-site-packages so that it sees Debian's torch 1.13;
# tests/python/run.sh uses it when it is there. transformers 4.40.2 (with
# accelerate 0.30.1) runs on torch 1.13; later lines want a newer torch.
# Idempotent: nothing is fetched when the pinned versions are in place.
# About 30 s from scratch (venv 6 s, pip 22 s downloading ~15 MB; measured
# here with an empty pip cache), well under a second once in place.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-test
pins=(transformers==4.40.2 accelerate==0.30.1)
if [ ! -x "$venv/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if "$venv/bin/python" - "${pins[@]}" <<'PY' 2>/dev/null; then
import importlib.metadata as md, sys
sys.exit(any(md.version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
PY
    exit 0
fi
echo "installing into $venv: ${pins[*]}"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}"
