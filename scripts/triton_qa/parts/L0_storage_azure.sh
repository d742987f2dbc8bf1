# Triton's qa/L0_storage_azure/test.sh, unchanged in what it checks, against an Azure blob
# service on loopback: Azurite (installed by scripts/install_azurite.sh), its public
# development account as AZURE_STORAGE_ACCOUNT / AZURE_STORAGE_KEY, and for nursery
# AZURE_STORAGE_CONNECTION_STRING naming Azurite's endpoint (Triton's Azure file system always
# reaches <account>.blob.core.windows.net; nursery's reads the connection string, see
# nursery/config/storage/azure.py). The Azure CLI is not installed here: the three `az`
# commands the script uses (storage container create, storage container delete, storage blob
# upload --file --name) are done by the azure-storage-blob SDK in an exported shell function.
# BACKENDS is the harness's for this group (onnx libtorch: `plan` is TensorRT).
# Run with `run.py --script scripts/triton_qa/parts/L0_storage_azure.sh L0_storage_azure`.
AZURITE="$NURSERY_QA_ROOT/.tools/azurite/node_modules/.bin/azurite-blob"
if [ ! -x "$AZURITE" ]; then
  echo "nursery-qa: Azurite is not installed (bash scripts/install_azurite.sh)" >&2
  exit 1
fi
source "$NURSERY_QA_ROOT/scripts/triton_qa/parts/lib/loopback.sh"
port=$(free_port)
rm -rf azurite-data && mkdir azurite-data
"$AZURITE" --blobHost 127.0.0.1 --blobPort "$port" --location azurite-data --silent \
  --skipApiVersionCheck --loose > azurite-data/azurite.log 2>&1 &
azurite=$!
trap 'kill $azurite 2>/dev/null; wait $azurite 2>/dev/null' EXIT
wait_port "$port"
export AZURE_STORAGE_CONNECTION_STRING="$(PYTHONPATH="$NURSERY_QA_ROOT" "$NURSERY_QA_PYTHON" -c \
  "from tests.cloud_servers import azurite_connection; print(azurite_connection($port))")"
export AZURE_STORAGE_ACCOUNT=devstoreaccount1
export AZURE_STORAGE_KEY="$(PYTHONPATH="$NURSERY_QA_ROOT" "$NURSERY_QA_PYTHON" -c \
  "from tests.cloud_servers import AZURITE_KEY; print(AZURITE_KEY)")"

az() {
  "$NURSERY_QA_PYTHON" - "$@" <<'PY'
import os
import sys

from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient

args = sys.argv[1:]
opts = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
what = args[:3]
if what == ["storage", "container", "create"]:
    try:
        service.create_container(opts["--name"])
    except ResourceExistsError:
        pass
    print('{"created": true}')
elif what == ["storage", "container", "delete"]:
    service.delete_container(opts["--name"])
    print('{"deleted": true}')
elif what == ["storage", "blob", "upload"]:
    blob = service.get_blob_client(opts["--container-name"], opts["--name"])
    with open(opts["--file"], "rb") as f:
        blob.upload_blob(f, overwrite=True)
else:
    sys.exit(f"az (nursery-qa's stand-in): not supported: {' '.join(args)}")
PY
}
export -f az
bash test.sh
