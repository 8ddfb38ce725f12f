#!/usr/bin/env bash
# Redraws docs/mlflow_registry.png: the MLflow UI's page of a registered version (its aliases
# and lineage tags) after `export --mlflow --promote` of a small digits study.
#
#   scripts/mlflow_screenshot.sh            # from the repository root, venv in .venv
#   PYTHON=/path/to/python scripts/mlflow_screenshot.sh
#
# Everything but the PNG lives in a temporary folder: the study (4 trials of 3 epochs), the
# MLflow server's SQLite store and artifacts (127.0.0.1, a free port). Needs Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
OUT=${OUT:-docs/mlflow_registry.png}
NAME=cnn-digits
work=$(mktemp -d)
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port

# the server in its own process group, stopped (with its workers) on exit
setsid "$PY" -m mlflow server --host 127.0.0.1 --port "$port" --workers 1 \
  --backend-store-uri "sqlite:///$work/mlflow.db" --artifacts-destination "$work/artifacts" \
  >"$work/server.log" 2>&1 &
server=$!
trap 'kill -- -$server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$work"' EXIT

# three tries: on a busy machine Ray's start can time out; the same command continues the study
for try in 1 2 3; do
  "$PY" -m search run spaces/cnn.yaml --trials 4 --max-epochs 3 \
    --storage "sqlite:///$work/optuna.db" --results "$work/results" && break
  [ "$try" = 3 ] && exit 1
done
until curl -sf "$url/health" >/dev/null; do
  kill -0 "$server" 2>/dev/null || { cat "$work/server.log"; exit 1; }
  sleep 1
done
"$PY" -m search export "$NAME" --storage "sqlite:///$work/optuna.db" --results "$work/results" \
  --top-k 2 --seeds 2 --mlflow "$url" --promote

mkdir -p "$(dirname "$OUT")"
"$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$work/chromium" --window-size=1400,900 --virtual-time-budget=15000 \
  --screenshot="$OUT" "$url/#/models/$NAME/versions/1"
echo "wrote $OUT"
