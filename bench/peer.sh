#!/usr/bin/env bash
# nursery beside real Triton 2.51 and MLServer, same models, same perf_analyzer, one run
# (../shared/bench/run_anchors.sh). Results and a ratio table land in bench/results/<name>/.
#
#   bash bench/peer.sh http       # HTTP: JSON tensors and the binary extension, no batching
#   bash bench/peer.sh grpc       # gRPC, no batching
#   bash bench/peer.sh batching   # the MLP with dynamic batching on (max_batch_size 32, 1 ms
#                                 # queue delay) at concurrency 1 4 16 64 over HTTP binary
#                                 # tensors and gRPC (MLServer: its JSON HTTP and gRPC)
#
# Knobs pass through: CONCURRENCY (default "1 16"), MODELS ("add_sub mlp"), REPEATS (2),
# MEASURE_MS (3000), BATCHING ("off"). ROUNDS=N (default 1) runs the servers' sweeps N times,
# one pass each, alternating which server goes first, into one results.csv: the summary's
# medians then compare passes taken side by side in time rather than one server's passes all
# before the other's (on a noisy machine, the load drifts over a sweep's minutes); with QUIET=SHARE
# each round first waits (up to 10 minutes) for a second in which the machine's CPU use is below
# SHARE (0-1), so that other work on a shared machine has paused. Set up the peers first (once
# per machine):
#   bash ../shared/bench/setup_envs.sh tools pa mlserver pytriton
# Never run two benchmarks at once on the 2-core machine. Beside the shared summary, cpu.md
# gives each row's server CPU per request (bench/peer_cpu.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="${SHARED_BENCH:-$ROOT/../shared/bench}"
proto="${1:-http}"
case "$proto" in
  http) np="http http-bin"; tp="http http-bin"; mp="http"; steps="models ort nursery triton mlserver summary" ;;
  grpc) np="grpc"; tp="grpc"; mp="grpc"; steps="models nursery triton mlserver summary" ;;
  batching) np="http-bin grpc"; tp="http-bin grpc"; mp="http grpc"
            steps="models nursery triton mlserver summary"
            MODELS="${MODELS:-mlp}"; CONCURRENCY="${CONCURRENCY:-1 4 16 64}"
            BATCHING="${BATCHING:-on}" ;;
  *) echo "usage: $0 http|grpc|batching" >&2; exit 2 ;;
esac
steps="${STEPS:-$steps}"  # e.g. STEPS="models nursery triton summary" leaves MLServer out
export NURSERY_ROOT="$ROOT" NURSERY_PROTOCOLS="$np" TRITON_PROTOCOLS="$tp" PROTOCOLS="$mp"
export CONCURRENCY="${CONCURRENCY:-1 16}" MODELS="${MODELS:-add_sub mlp}"
export REPEATS="${REPEATS:-2}" MEASURE_MS="${MEASURE_MS:-3000}" BATCHING="${BATCHING:-off}"
export OUT="${OUT:-$ROOT/bench/results/peer-$proto-$(date +%Y%m%d-%H%M)}"
mkdir -p "$OUT"
# server CPU per request beside every row (bench/peer_cpu.py: /proc of each server's session)
python3 "$ROOT/bench/peer_cpu.py" sample "$OUT/cpu.jsonl" &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT
rounds="${ROUNDS:-1}"
if [ "$rounds" -le 1 ]; then
  # shellcheck disable=SC2086
  bash "$SHARED/run_anchors.sh" $steps
else
  export REPEATS=1
  servers=""; rest=""
  for s in $steps; do
    case "$s" in nursery|triton|mlserver|kserve) servers="$servers $s" ;; *) rest="$rest $s" ;; esac
  done
  case " $rest " in *" models "*) bash "$SHARED/run_anchors.sh" models ;; esac
  for r in $(seq "$rounds"); do
    order="$servers"
    [ $((r % 2)) = 0 ] && order="$(echo $servers | tr ' ' '\n' | tac | tr '\n' ' ')"
    if [ -n "${QUIET:-}" ]; then
      (cd "$ROOT" && python3 -c "from bench.ab_perf import wait_quiet; wait_quiet(float('$QUIET'))")
    fi
    echo "== round $r/$rounds:$order"
    # shellcheck disable=SC2086
    bash "$SHARED/run_anchors.sh" $order
  done
  case " $rest " in *" summary "*) bash "$SHARED/run_anchors.sh" summary ;; esac
fi
kill "$sampler" 2>/dev/null || true
python3 "$ROOT/bench/peer_cpu.py" attach "$OUT" || true
echo "summary: $OUT/summary.md; CPU per request: $OUT/cpu.md"
