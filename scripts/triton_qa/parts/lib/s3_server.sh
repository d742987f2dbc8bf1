# Sourced by the part scripts of groups that use an S3 bucket (L0_mlflow, L0_storage_S3):
# an S3 server on a free loopback port, stopped when the script exits (the harness's MinIO
# stand-in, tools/minio.py: moto's S3 and STS, serving only requests signed with these
# credentials or with temporary ones its STS issued, as AWS refuses a wrong key), and the AWS
# CLI pointed at it. AWS_ENDPOINT_URL is read by boto3 and botocore everywhere: the AWS CLI
# (the `awscli` package, run as `aws` by an exported shell function, since only the package
# is installed here), Triton's clients and nursery's S3 repository alike. HOME is the group
# folder's own, so that `aws configure set` writes ~/.aws there, not in this machine's home.
source "$NURSERY_QA_ROOT/scripts/triton_qa/parts/lib/loopback.sh"
port=$(free_port)
MINIO_ACCESS_KEY=nursery-qa MINIO_SECRET_KEY=nursery-qa "$NURSERY_QA_PYTHON" \
  "$NURSERY_QA_TOOLS/minio.py" server --address "127.0.0.1:$port" \
  > "$PWD/../${PWD##*/}.s3.log" 2>&1 &
NURSERY_QA_S3=$!
trap 'kill $NURSERY_QA_S3 2>/dev/null; wait $NURSERY_QA_S3 2>/dev/null' EXIT
wait_port "$port"
mkdir -p "$PWD/home"
export HOME="$PWD/home" AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ACCESS_KEY_ID=nursery-qa \
  AWS_SECRET_ACCESS_KEY=nursery-qa AWS_DEFAULT_REGION=us-east-1 CI_JOB_ID="${CI_JOB_ID:-nursery}"
aws() { "$NURSERY_QA_PYTHON" -m awscli "$@"; }
export -f aws
