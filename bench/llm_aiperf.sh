#!/usr/bin/env bash
# NVIDIA's aiperf against nursery's OpenAI-compatible port (issue 27): time to first token,
# inter-token latency and output tokens/s at concurrency 1, 8 and 32, streaming chat
# completions with mixed output lengths (normally distributed max_tokens).
#
#   bash bench/llm_aiperf.sh --model tiny_llm --serve model_repository
#   bash bench/llm_aiperf.sh --model tiny_llm --url http://127.0.0.1:9000    # a running server
#
# options (defaults in brackets):
#   --model NAME            the model to ask [tiny_llm]
#   --url URL               the OpenAI port of a running server [http://127.0.0.1:9000]
#   --serve REPO            start `python -m nursery serve --model-repository REPO --openai-port`
#                           on free ports for the run, and stop it afterwards
#   --serve-flag FLAG       one more flag for that server (repeatable), e.g. --serve-flag=--tokenizer=DIR
#   --tokenizer DIR         aiperf's tokenizer for prompts and counts [REPO/MODEL/tokenizer when
#                           it exists, else aiperf's "builtin"]
#   --concurrency "LIST"    the concurrency levels ["1 8 32"]
#   --requests N            requests per level [100]
#   --input-mean N          synthetic prompt tokens [64]
#   --output-mean N         mean output tokens [96]; --output-stddev N [48]
#   --endpoint chat|completions  [chat]
#   --extra-inputs K:V      passed to aiperf's --extra-inputs (repeatable), e.g. ignore_eos:true
#                           for a vLLM-form model (a TRT-LLM-form model gets max_tokens only)
#   --out DIR               where aiperf's artifacts go [bench/results/llm_aiperf/<UTC stamp>]
#
# aiperf pins many packages (and brings transformers), so it lives in a virtual environment of
# its own: .tools/aiperf-venv (AIPERF_VENV to move it), installed on first use from PyPI
# (`pip install aiperf`, the llm-bench extra's pin). nursery itself never imports it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL=tiny_llm
URL=http://127.0.0.1:9000
SERVE=""
SERVE_FLAGS=()
TOKENIZER=""
CONCURRENCY="1 8 32"
REQUESTS=100
INPUT_MEAN=64
OUTPUT_MEAN=96
OUTPUT_STDDEV=48
ENDPOINT=chat
EXTRA=()
OUT=""
VENV="${AIPERF_VENV:-$ROOT/.tools/aiperf-venv}"

while [ $# -gt 0 ]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --url) URL="$2"; shift 2 ;;
    --serve) SERVE="$2"; shift 2 ;;
    --serve-flag=*) SERVE_FLAGS+=("${1#--serve-flag=}"); shift ;;
    --serve-flag) SERVE_FLAGS+=("$2"); shift 2 ;;
    --tokenizer) TOKENIZER="$2"; shift 2 ;;
    --concurrency) CONCURRENCY="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --input-mean) INPUT_MEAN="$2"; shift 2 ;;
    --output-mean) OUTPUT_MEAN="$2"; shift 2 ;;
    --output-stddev) OUTPUT_STDDEV="$2"; shift 2 ;;
    --endpoint) ENDPOINT="$2"; shift 2 ;;
    --extra-inputs) EXTRA+=(--extra-inputs "$2"); shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "llm_aiperf.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-$ROOT/bench/results/llm_aiperf/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"

if [ ! -x "$VENV/bin/aiperf" ]; then
  echo "installing aiperf into $VENV (once)" >&2
  python -m venv "$VENV"
  "$VENV/bin/pip" install -q "aiperf>=0.13"
fi

SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true
  fi
}
trap cleanup EXIT

if [ -n "$SERVE" ]; then
  free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  OPENAI_PORT=$(free_port)
  URL="http://127.0.0.1:$OPENAI_PORT"
  (cd "$ROOT" && exec python -m nursery serve --model-repository "$SERVE" \
      --http-address 127.0.0.1 --http-port "$(free_port)" --grpc-address 127.0.0.1 \
      --grpc-port "$(free_port)" --metrics-address 127.0.0.1 --metrics-port "$(free_port)" \
      --openai-port "$OPENAI_PORT" ${SERVE_FLAGS[@]+"${SERVE_FLAGS[@]}"} > "$OUT/server.log" 2>&1) &
  SERVER_PID=$!
  for _ in $(seq 1 600); do
    if curl -sf "$URL/v1/models" > /dev/null 2>&1; then break; fi
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "the server exited:" >&2; cat "$OUT/server.log" >&2; exit 1; }
    sleep 0.2
  done
  if [ -z "$TOKENIZER" ] && [ -f "$SERVE/$MODEL/tokenizer/tokenizer.json" ]; then
    TOKENIZER="$SERVE/$MODEL/tokenizer"
  fi
fi
curl -sf "$URL/v1/models/$MODEL" > /dev/null || { echo "no model '$MODEL' at $URL" >&2; exit 1; }
TOKENIZER="${TOKENIZER:-builtin}"

for c in $CONCURRENCY; do
  echo "== concurrency $c: $REQUESTS requests, output tokens ~N($OUTPUT_MEAN, $OUTPUT_STDDEV)" >&2
  "$VENV/bin/aiperf" profile \
    --model "$MODEL" --url "$URL" --endpoint-type "$ENDPOINT" --streaming \
    --concurrency "$c" --request-count "$REQUESTS" --warmup-request-count "$((c < 4 ? 2 : c))" \
    --synthetic-input-tokens-mean "$INPUT_MEAN" --synthetic-input-tokens-stddev 0 \
    --output-tokens-mean "$OUTPUT_MEAN" --output-tokens-stddev "$OUTPUT_STDDEV" \
    --tokenizer "$TOKENIZER" --random-seed 0 --ui-type none ${EXTRA[@]+"${EXTRA[@]}"} \
    --artifact-dir "$OUT/c$c" > "$OUT/c$c.log" 2>&1 \
    || { echo "aiperf failed at concurrency $c:" >&2; tail -30 "$OUT/c$c.log" >&2; exit 1; }
done

python - "$OUT" $CONCURRENCY <<'EOF'
"""The table: one row per concurrency, from each run's profile_export_aiperf.json."""
import json
import sys
from pathlib import Path

out, levels = Path(sys.argv[1]), sys.argv[2:]


def metric(data, *names):
    for name in names:
        for key in (name, f"{name}_ms"):
            found = data.get(key) or data.get("records", {}).get(key)
            if isinstance(found, dict):
                return found
    return {}


rows = []
for c in levels:
    exports = sorted((out / f"c{c}").rglob("profile_export_aiperf.json"))
    if not exports:
        rows.append(f"| {c} | (no export: see c{c}.log) | | | | |")
        continue
    data = json.loads(exports[-1].read_text())
    ttft = metric(data, "time_to_first_token", "ttft")
    itl = metric(data, "inter_token_latency", "itl")
    tput = metric(data, "output_token_throughput")
    reqs = metric(data, "request_throughput")

    def f(d, k):
        v = d.get(k)
        return f"{v:,.1f}" if isinstance(v, int | float) else "-"

    rows.append(f"| {c} | {f(ttft, 'avg')} / {f(ttft, 'p99')} | {f(itl, 'avg')} / "
                f"{f(itl, 'p99')} | {f(tput, 'avg')} | {f(reqs, 'avg')} |")
print("| concurrency | TTFT ms avg / p99 | ITL ms avg / p99 | output tokens/s | requests/s |")
print("|---|---|---|---|---|")
print("\n".join(rows))
print(f"\nartifacts: {out}")
EOF
