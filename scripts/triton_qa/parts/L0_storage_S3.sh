# Triton's qa/L0_storage_S3/test.sh, unchanged in what it checks, against an S3 bucket
# service on loopback: the harness's MinIO stand-in (moto, checking signatures), the AWS CLI
# pointed at it (parts/lib/s3_server.sh; its `aws configure set` then writes the group
# folder's own ~/.aws, which the script's "config" runs read). BACKENDS is the harness's for this group (onnx libtorch: `plan` is
# TensorRT). Run with `run.py --script scripts/triton_qa/parts/L0_storage_S3.sh L0_storage_S3`.
source "$NURSERY_QA_ROOT/scripts/triton_qa/parts/lib/s3_server.sh"
bash test.sh
