# Triton's qa/L0_mlflow/test.sh, unchanged in what it checks, with what Triton's CI gives it
# made here first:
# - MLflow and Triton's MLflow plugin, which test.sh pip-installs into a virtual environment
#   of its own (the harness installs nothing): made once, outside the run, with
#     python -m venv --system-site-packages "$MLFLOW_VENV"
#     "$MLFLOW_VENV/bin/pip" install mlflow <server checkout>/deploy/mlflow-triton-plugin
#   (MLFLOW_VENV defaults to /tmp/nursery-qa-mlflow-venv); test.sh's own `python3 -m venv
#   .venv` and its activation are pointed at it;
# - the plugin's folder beside test.sh (its examples are read from ./mlflow-triton-plugin), as
#   Triton's CI copies it from the server repository's deploy/;
# - for its S3 half, an S3 bucket service: moto's server on a loopback port, with the AWS CLI
#   pointed at it (parts/lib/s3_server.sh).
# Run with `run.py --script scripts/triton_qa/parts/L0_mlflow.sh L0_mlflow`.
MLFLOW_VENV="${MLFLOW_VENV:-/tmp/nursery-qa-mlflow-venv}"
if [ ! -x "$MLFLOW_VENV/bin/mlflow" ]; then
  echo "nursery-qa: no mlflow in $MLFLOW_VENV (see the head of this script)" >&2
  exit 1
fi
export MLFLOW_VENV
rm -rf mlflow-triton-plugin
cp -r "$NURSERY_QA_TRITON_SERVER/deploy/mlflow-triton-plugin" .

source "$NURSERY_QA_ROOT/scripts/triton_qa/parts/lib/s3_server.sh"

sed -e 's|^python3 -m venv \.venv$|: nursery-qa: the environment is $MLFLOW_VENV|' \
    -e 's|^source \.venv/bin/activate$|source "$MLFLOW_VENV/bin/activate"|' \
    test.sh > test.nursery.sh
bash test.nursery.sh
