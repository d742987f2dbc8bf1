# Triton's qa/L0_metrics/test.sh without its sections that need Triton's C++ unit test, a
# pinned host-memory pool or a GPU (its "### UNIT TESTS" section up to "### Metric Config
# CLI"): its set-up, then every section from the metric configuration flags on (metric types,
# the pending-request gauge, histograms in ensembles, model_metrics), unchanged. The sections
# are cut out of the checkout's own test.sh by their headings, so its lines run as written.
# Run with `run.py --script scripts/triton_qa/parts/L0_metrics_cpu.sh L0_metrics`.
awk '/^### UNIT TESTS/ {skip=1} /^### Metric Config CLI/ {skip=0} !skip' test.sh > test.cpu.sh
bash test.cpu.sh
