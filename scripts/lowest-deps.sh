#!/usr/bin/env bash
# The operator tests against the lowest kopf and kubernetes (the official client) that
# pyproject.toml allows, so that its lower bounds stay versions the code really runs with.
#
#   scripts/lowest-deps.sh            (CI runs it after make test)
#
# A virtualenv of its own (LOWEST_VENV, default .venv-lowest) gets the project with its dev
# extras, then exactly the lower bound of each of the two, read from pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LOWEST_VENV:-.venv-lowest}
PYTHON=${PYTHON:-python3}

read -r kopf kubernetes < <("$PYTHON" - <<'PY'
import re, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
bounds = {}
for dep in deps:
    match = re.fullmatch(r"(kopf|kubernetes)>=([\w.]+)", dep.replace(" ", ""))
    if match:
        bounds[match[1]] = match[2]
missing = {"kopf", "kubernetes"} - bounds.keys()
if missing:
    sys.exit(f"lowest-deps: pyproject.toml has no '>=' bound for {', '.join(sorted(missing))}")
print(bounds["kopf"], bounds["kubernetes"])
PY
)

test -d "$VENV" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet -e '.[dev]'
"$VENV/bin/pip" install --quiet "kopf==$kopf" "kubernetes==$kubernetes"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as m
print("lowest-deps: kopf", m.version("kopf"), "kubernetes", m.version("kubernetes"))
PY
exec "$VENV/bin/pytest" -q -p no:cacheprovider tests/operator
