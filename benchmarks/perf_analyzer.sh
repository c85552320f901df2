#!/bin/bash
# Run Triton's perf_analyzer (2.60.0) against a running Sluice endpoint on the digits model,
# for a bounded time. Uses /tmp/anchors/perf_analyzer, the wrapper that
# ../shared/bench/setup_anchors.sh (or benchmarks/install_perf_analyzer.sh, which installs only
# perf_analyzer) writes: it runs the manylinux_2_38 binary through an unpacked Debian 13 libc.
#
# Usage:
#   bash benchmarks/perf_analyzer.sh [options] [-- extra perf_analyzer args]
# Options (defaults in brackets):
#   -u, --url HOST:PORT         server endpoint [127.0.0.1:8000; use :8001 with -i grpc]
#   -i, --protocol http|grpc    [http]
#   -m, --model NAME            [digits]
#   -b, --batch N               batch size per request [1]
#   -c, --concurrency-range R   start:end[:step] [1:4]
#   -p, --interval-ms MS        measurement window [3000]
#   -r, --max-trials N          windows per concurrency before giving up on stability [4]
#   -s, --stability PCT         stability threshold, as in run_anchors.sh [100]
#   --random-data               send perf_analyzer's random data instead of the held-out
#                               digit images (the default for any model other than digits)
#   -o, --out DIR               where the CSV and input data go [benchmarks/results/perf_analyzer]
# The whole run is killed after (levels * max-trials * interval + 60) seconds.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
PA=${PERF_ANALYZER:-/tmp/anchors/perf_analyzer}
URL=127.0.0.1:8000
PROTO=http
MODEL=digits
BATCH=1
CRANGE=1:4
INTERVAL=3000
TRIALS=4
STAB=100
RANDOM_DATA=0
OUT=$ROOT/benchmarks/results/perf_analyzer
EXTRA=()

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    -u|--url) URL=$2; shift 2 ;;
    -i|--protocol) PROTO=$2; shift 2 ;;
    -m|--model) MODEL=$2; shift 2 ;;
    -b|--batch) BATCH=$2; shift 2 ;;
    -c|--concurrency-range) CRANGE=$2; shift 2 ;;
    -p|--interval-ms) INTERVAL=$2; shift 2 ;;
    -r|--max-trials) TRIALS=$2; shift 2 ;;
    -s|--stability) STAB=$2; shift 2 ;;
    --random-data) RANDOM_DATA=1; shift ;;
    -o|--out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 64 ;;
  esac
done

if [ ! -x "$PA" ]; then
  cat >&2 <<MSG
error: perf_analyzer not found at $PA
Install it with the peer setup (perf_analyzer, Triton, MLServer, wrk; ~5 min, all under /tmp/anchors):
    bash ../shared/bench/setup_anchors.sh
or only perf_analyzer (~1 min, same paths under /tmp/anchors):
    bash benchmarks/install_perf_analyzer.sh
MSG
  exit 2
fi

# concurrency levels -> time bound
IFS=: read -r c0 c1 cstep <<<"$CRANGE"
c1=${c1:-$c0}; cstep=${cstep:-1}
levels=$(( (c1 - c0) / cstep + 1 ))
LIMIT=$(( levels * TRIALS * INTERVAL / 1000 + 60 ))

mkdir -p "$OUT"
STAMP=$(date +%Y%m%d-%H%M%S)
CSV=$OUT/${MODEL}_${PROTO}_b${BATCH}_c${CRANGE//:/-}_$STAMP.csv

DATA_ARGS=()
if [ "$MODEL" = digits ] && [ "$RANDOM_DATA" = 0 ]; then
  PY=${PYTHON:-$ROOT/.venv/bin/python}
  [ -x "$PY" ] || PY=python3
  DATA=$OUT/digits_input_data.json
  if "$PY" - "$ROOT/examples/build_models.py" "$DATA" <<'EOF'
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("bm", sys.argv[1])
bm = importlib.util.module_from_spec(spec); spec.loader.exec_module(bm)
x, _ = bm.digits_test_split()
with open(sys.argv[2], "w") as f:
    json.dump({"data": [{"input": [float(v) for v in row]} for row in x]}, f)
EOF
  then
    DATA_ARGS=(--input-data "$DATA")
  else
    echo "warning: could not write the held-out digits as input data; using random data" >&2
  fi
fi

CMD=("$PA" -m "$MODEL" -u "$URL" -i "$PROTO" -b "$BATCH"
     --concurrency-range "$CRANGE" -p "$INTERVAL" -r "$TRIALS" -s "$STAB"
     --percentile 99 -f "$CSV" "${DATA_ARGS[@]}")
# perf_analyzer refuses a warm-up count with more than one concurrency level
[ "$levels" -eq 1 ] && CMD+=(--warmup-request-count 100)
CMD+=("${EXTRA[@]}")
echo "+ ${CMD[*]}   (killed after ${LIMIT}s)"
set +e
timeout --kill-after=10 "$LIMIT" "${CMD[@]}"
rc=$?
set -e
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
  echo "error: perf_analyzer did not finish within ${LIMIT}s" >&2
elif [ $rc -ne 0 ]; then
  echo "error: perf_analyzer exited with $rc (see its message above; 99 = e.g. no server on $URL" \
       "or model '$MODEL' not ready, 2 = no stable measurement: raise -p/-r/-s)" >&2
fi
if [ -s "$CSV" ]; then
  echo "CSV: $CSV"
  # one line per concurrency: throughput and p50/p99 in microseconds
  awk -F, 'NR==1{for(i=1;i<=NF;i++)h[$i]=i; next}
           {printf "  concurrency %s: %s infer/s  p50 %s us  p99 %s us\n",
             $h["Concurrency"], $h["Inferences/Second"], $h["p50 latency"], $h["p99 latency"]}' "$CSV"
fi
exit $rc
