# Triton's qa/L0_response_cache/test.sh without its two parts that run Triton's C++ programs:
# the response cache's C++ unit test (`./response_cache_test`, the lines from its
# LD_LIBRARY_PATH call to their `fi`) and the memory-growth section (tritonserver under
# valgrind's massif, "Response Cache Memory Growth Test" up to the final verdict). Everything
# else runs as written: the Redis server it installs and starts, the cache flags and their
# failures, Redis authentication, the decoupled refusals and the ensemble cache clients.
# Run with `run.py --script scripts/triton_qa/parts/L0_response_cache_cpu.sh L0_response_cache`.
awk '
  /^LD_LIBRARY_PATH=.*\$UNIT_TEST/ { unit = 1 }
  unit { if ($0 ~ /^fi$/) unit = 0; next }
  /Response Cache Memory Growth Test/ { growth = 1 }
  growth && /^if \[ \$RET -eq 0 \]/ { growth = 0 }
  growth { next }
  { print }' test.sh > test.cpu.sh
bash test.cpu.sh
