#!/bin/bash
# A tuning run whose Ray node crashes under it: `sodaray tune tuning/stories260k.yaml` (30
# trials of 3,000 steps, one replica), and 45 s in, `kill -9` of the raylet its driver started.
# Prints the exit code, the seconds the driver took to stop, its last lines and the study's
# trial states. Before the fix every trial left in the budget was marked FAIL at once; after,
# the run stops with a one-line error and the trial in flight stays RUNNING for the next run.
#
#   benchmarks/lost_node.sh [CODE_DIR (default: this checkout)] [OUT (default: a temp folder)]
set -u
code=${1:-$(cd "$(dirname "$0")/.." && pwd)}
out=${2:-$(mktemp -d)}
python=${PYTHON:-python}
rm -rf "$out" && mkdir -p "$out"
cd "$code" || exit 2
PYTHONPATH=$code setsid "$python" -m sodaray tune tuning/stories260k.yaml --workers 1 \
  --out "$out" trials=30 max_steps=3000 > "$out/log" 2>&1 &
pid=$!
sleep 45
kill -9 $(pgrep -P $pid -f raylet)
t0=$(date +%s)
wait $pid
rc=$?
echo "exit $rc, $(( $(date +%s) - t0 )) s after the raylet was killed"
tail -2 "$out/log"
"$python" - "$out/stories260k-soda/study.journal" <<'PY'
import collections, sys
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = JournalStorage(JournalFileBackend(sys.argv[1]))
study = optuna.load_study(study_name="stories260k-soda", storage=storage)
print("trials:", dict(collections.Counter(t.state.name for t in study.trials)))
PY
