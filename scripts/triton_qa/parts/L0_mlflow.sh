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
# - for its S3 half, an S3 bucket service: moto's server on a loopback port (AWS_ENDPOINT_URL,
#   which boto3 reads: the plugin's client and nursery's S3 repository alike), and the four
#   `aws` commands the script uses (configure set, s3 mb, s3 rm --recursive, s3 rb) done by
#   boto3 in an exported shell function, since the AWS CLI is not installed here.
# Run with `run.py --script scripts/triton_qa/parts/L0_mlflow.sh L0_mlflow`.
MLFLOW_VENV="${MLFLOW_VENV:-/tmp/nursery-qa-mlflow-venv}"
if [ ! -x "$MLFLOW_VENV/bin/mlflow" ]; then
  echo "nursery-qa: no mlflow in $MLFLOW_VENV (see the head of this script)" >&2
  exit 1
fi
export MLFLOW_VENV
rm -rf mlflow-triton-plugin
cp -r "$NURSERY_QA_TRITON_SERVER/deploy/mlflow-triton-plugin" .

port=$("$NURSERY_QA_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
moto_server -H 127.0.0.1 -p "$port" > moto.log 2>&1 &
moto=$!
trap 'kill $moto 2>/dev/null; wait $moto 2>/dev/null' EXIT
for _ in $(seq 50); do
  "$NURSERY_QA_PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')" 2>/dev/null && break
  sleep 0.2
done
export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ACCESS_KEY_ID=nursery-qa \
  AWS_SECRET_ACCESS_KEY=nursery-qa AWS_DEFAULT_REGION=us-east-1 CI_JOB_ID="${CI_JOB_ID:-nursery}"

aws() {
  "$NURSERY_QA_PYTHON" - "$@" <<'EOF'
import sys

import boto3

args = sys.argv[1:]
if args[:2] == ["configure", "set"]:
    sys.exit(0)  # the credentials and region come from the environment
if args[0] != "s3" or len(args) < 3 or not args[2].startswith("s3://"):
    sys.exit(f"aws (nursery-qa's stand-in): not supported: {' '.join(args)}")
bucket, _, prefix = args[2][len("s3://"):].partition("/")
s3 = boto3.resource("s3")
if args[1] == "mb":
    s3.create_bucket(Bucket=bucket)
elif args[1] == "rb":
    s3.Bucket(bucket).delete()
elif args[1] == "rm" and "--recursive" in args:
    s3.Bucket(bucket).objects.filter(Prefix=prefix).delete()
else:
    sys.exit(f"aws (nursery-qa's stand-in): not supported: {' '.join(args)}")
EOF
}
export -f aws

sed -e 's|^python3 -m venv \.venv$|: nursery-qa: the environment is $MLFLOW_VENV|' \
    -e 's|^source \.venv/bin/activate$|source "$MLFLOW_VENV/bin/activate"|' \
    test.sh > test.nursery.sh
bash test.nursery.sh
