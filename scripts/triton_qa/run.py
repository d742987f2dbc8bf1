"""Run groups of Triton's own qa suite (its server repository's `qa/`) against nursery.

    python scripts/triton_qa/run.py --triton-server /tmp/triton-server L0_parameters
    python scripts/triton_qa/run.py --triton-server /tmp/triton-server L0_backend_python/bls ...

`--triton-server` is a local checkout (or `git archive`) of github.com/triton-inference-server/
server; nothing is fetched. For each run the harness builds a tree under `--work`
(/tmp/nursery-qa by default) that looks like Triton's test container:

- `qa/`: a copy of the checkout's qa/ in which `/opt/tritonserver` and `/data/inferenceserver`
  are rewritten to the two folders below (in *.sh, *.py and *.conf files only; the checkout
  itself is never touched). Every other line of Triton's scripts, tests and models runs as written.
- `opt/tritonserver/bin/tritonserver`: the stand-in, which maps the command line onto
  `python -m nursery serve` (standin.py); `opt/tritonserver/backends/` (empty, for scripts that
  put Python-based backends there); `opt/tritonserver/qa` -> `qa/`.
- the models Triton's Dockerfile.QA copies into a few qa folders from the server repository
  (docs/examples, src/test/models), python_backend's examples (container_models) and the
  core repository's python/test (L0_python_api); its C++ test backends are not built.
- `data/inferenceserver/<version>/`: the model repositories Triton's CI generates. `--generate`
  fills the ones Triton's own generators make for ONNX and LibTorch (see GENERATORS); the rest
  stay absent, and a script copying from them fails as it would.
- `shims/` first on PATH, then `opt/tritonserver/bin` (as in Triton's container, so a client
  running `tritonserver` gets the stand-in): `pip`/`pip3`/`python -m pip`/`apt`/`apt-get`/
  `conda` do nothing (the scripts install packages into their container; here that would
  change the machine),
  `wget` and `git clone` fail (nothing is fetched at test time) except that `git clone` of a
  repository found under `--checkouts <folder>` (by name: `python_backend`, ...) copies that
  local checkout; `nvidia-smi` reports no GPU; `curl` of the OpenTelemetry Collector's release
  tarball (L0_trace) writes a tarball of the harness's stand-in collector (tools/otelcol.py)
  instead, every other curl runs as it is. `/opt/ml/` (SageMaker's model folder, where
  L0_trace puts a model) is rewritten to `opt/ml/` of the tree, as `/opt/tritonserver` is.

Each group's `test.sh` then runs in its own folder under `bash`, in a private network namespace
when `unshare --net` works (Triton's scripts use the fixed ports 8000-8002 and localhost; the
namespace keeps them from meeting other servers on this machine and from reaching out), and in
a private PID namespace with its own /proc when `unshare --pid --mount-proc` works too (scripts
find processes by name, `pgrep -f triton_python_backend_stub`, and kill what they find: they
must see only their own; whatever a script leaves running ends with it), and then a private
/dev/shm (a tmpfs in its mount namespace: the leak probes of Triton's shm_util.py look there
for Triton's Python-backend pools, which a real Triton elsewhere on the machine may create).
Subtests of L0_backend_python (`L0_backend_python/<sub>`) get the variables their parent
script exports. Every unittest / pytest case a client runs is recorded (hooks/qa_record.py);
`--work`/results/<group>.json holds the cases, the script's exit status and its log.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VERSION = "nursery"

# Triton's generators (qa/common) and the data/inferenceserver folder each fills, as Triton's
# gen_qa_model_repository script calls them, for the backends this machine has.
GENERATORS: list[tuple[str, list[str], str]] = [
    ("gen_qa_models.py", ["--onnx"], "qa_model_repository"),
    ("gen_qa_models.py", ["--libtorch"], "qa_model_repository"),
    ("gen_qa_models.py", ["--openvino"], "qa_model_repository"),
    # AOTInductor packages (torch_aoti), compiled for this machine's CPU (minutes)
    ("gen_qa_models.py", ["--torch-aoti"], "qa_model_repository"),
    ("gen_qa_implicit_models.py", ["--torch-aoti"], "qa_sequence_implicit_model_repository"),
    ("gen_qa_models.py", ["--onnx", "--variable"], "qa_variable_model_repository"),
    ("gen_qa_models.py", ["--libtorch", "--variable"], "qa_variable_model_repository"),
    ("gen_qa_identity_models.py", ["--onnx"], "qa_identity_model_repository"),
    ("gen_qa_identity_models.py", ["--libtorch"], "qa_identity_model_repository"),
    ("gen_qa_sequence_models.py", ["--onnx"], "qa_sequence_model_repository"),
    ("gen_qa_sequence_models.py", ["--libtorch"], "qa_sequence_model_repository"),
    ("gen_qa_sequence_models.py", ["--onnx", "--variable"],
     "qa_variable_sequence_model_repository"),
    ("gen_qa_sequence_models.py", ["--libtorch", "--variable"],
     "qa_variable_sequence_model_repository"),
    ("gen_qa_implicit_models.py", ["--onnx"], "qa_sequence_implicit_model_repository"),
    ("gen_qa_implicit_models.py", ["--libtorch"], "qa_sequence_implicit_model_repository"),
    ("gen_qa_implicit_models.py", ["--onnx", "--variable"],
     "qa_variable_sequence_implicit_model_repository"),
    ("gen_qa_implicit_models.py", ["--libtorch", "--variable"],
     "qa_variable_sequence_implicit_model_repository"),
    ("gen_qa_dyna_sequence_models.py", ["--onnx"], "qa_dyna_sequence_model_repository"),
    ("gen_qa_dyna_sequence_models.py", ["--libtorch"], "qa_dyna_sequence_model_repository"),
    ("gen_qa_dyna_sequence_implicit_models.py", ["--onnx"],
     "qa_dyna_sequence_implicit_model_repository"),
    ("gen_qa_dyna_sequence_implicit_models.py", ["--libtorch"],
     "qa_dyna_sequence_implicit_model_repository"),
    ("gen_qa_ort_scalar_models.py", [], "qa_scalar_models"),
    ("gen_qa_ragged_models.py", ["--onnx"], "qa_ragged_model_repository"),
    ("gen_qa_ragged_models.py", ["--libtorch"], "qa_ragged_model_repository"),
    ("gen_qa_reshape_models.py", ["--onnx", "--variable"], "qa_reshape_model_repository"),
    ("gen_qa_reshape_models.py", ["--libtorch", "--variable"], "qa_reshape_model_repository"),
    # the ensembles over those models (configurations only; the generator writes them for
    # every platform, TensorRT's included, whose steps' models are then absent)
    ("gen_qa_models.py", ["--ensemble"], "qa_ensemble_model_repository/qa_model_repository"),
    ("gen_qa_models.py", ["--ensemble", "--variable"],
     "qa_ensemble_model_repository/qa_variable_model_repository"),
    ("gen_qa_identity_models.py", ["--ensemble"],
     "qa_ensemble_model_repository/qa_identity_model_repository"),
    ("gen_qa_sequence_models.py", ["--ensemble"],
     "qa_ensemble_model_repository/qa_sequence_model_repository"),
    ("gen_qa_sequence_models.py", ["--ensemble", "--variable"],
     "qa_ensemble_model_repository/qa_variable_sequence_model_repository"),
    ("gen_qa_reshape_models.py", ["--ensemble"],
     "qa_ensemble_model_repository/qa_reshape_model_repository"),
]

# Variables a group's test.sh reads to pick the backends it loops over (each defaults to all
# of Triton's, TensorRT's and OpenVINO's and Triton's C++ `custom` test backends included): the
# harness sets them to those this machine runs
GROUP_ENV = {
    "L0_infer": {"BACKENDS": "onnx libtorch python python_dlpack"},
    # (`custom` is the harness's `sequence` stand-in: `BACKENDS=custom` runs its trials)
    "L0_sequence_batcher": {"BACKENDS": "onnx libtorch python"},
    "L0_batcher": {"BACKENDS": "onnx libtorch python"},
    # `custom` and `custom_string` are the harness's dyna_sequence stand-in
    "L0_dyna_sequence_batcher": {"BACKENDS": "libtorch onnx custom custom_string"},
    # L0_dyna_sequence_batcher with implicit state (the default adds `plan`; Triton's
    # generator makes no LibTorch model of it)
    "L0_dyna_implicit_state": {"BACKENDS": "onnx"},
    # its large-offset case loads an add_sub model per backend (default adds plan, openvino)
    "L0_shared_memory": {"BACKENDS": "python onnx libtorch"},
    # (the default adds `plan`; its later sections set BACKENDS themselves)
    "L0_storage_S3_local": {"BACKENDS": "onnx libtorch"},
    # (the default adds `plan`), run with parts/L0_storage_azure.sh against Azurite
    "L0_storage_azure": {"BACKENDS": "onnx libtorch"},
    # (the default adds `plan`), run with parts/L0_storage_S3.sh against moto's S3
    "L0_storage_S3": {"BACKENDS": "onnx libtorch"},
    # batch inputs of ragged models (the default adds `plan`)
    "L0_batch_input": {"BACKENDS": "onnx libtorch"},
    # its per-backend warm-up checks (the default adds `plan`)
    "L0_warmup": {"BACKENDS": "onnx libtorch"},
}

# Dockerfile.QA copies a few groups under a second name whose runs exchange tensors through
# system shared memory (the scripts read TEST_SYSTEM_SHARED_MEMORY); the harness makes the
# same copies and sets that variable for them, beside the group's own variables
SHM_VARIANTS = {"L0_infer_shm": "L0_infer", "L0_batcher_shm": "L0_batcher",
                "L0_sequence_batcher_shm": "L0_sequence_batcher"}
GROUP_ENV.update({variant: {**GROUP_ENV.get(base, {}), "TEST_SYSTEM_SHARED_MEMORY": "1"}
                  for variant, base in SHM_VARIANTS.items()})

# Dockerfile.QA's copies of docs/examples/model_repository into qa folders, by group
EXAMPLE_MODELS = {
    "L0_grpc": ("simple", "simple_dyna_sequence", "simple_int8", "simple_identity",
                "simple_sequence", "simple_string", "densenet_onnx"),
    "L0_http": ("simple", "simple_dyna_sequence", "simple_identity", "simple_sequence",
                "simple_string", "densenet_onnx"),
}

SHIMS = {
    "pip": 'echo "nursery-qa: skipped: pip $*" >&2; exit 0',
    "pip3": 'echo "nursery-qa: skipped: pip3 $*" >&2; exit 0',
    "apt": 'echo "nursery-qa: skipped: apt $*" >&2; exit 0',
    "apt-get": 'echo "nursery-qa: skipped: apt-get $*" >&2; exit 0',
    "conda": 'echo "nursery-qa: skipped: conda $*" >&2; exit 0',
    "wget": 'echo "nursery-qa: refused: wget $* (nothing is fetched at test time)" >&2; exit 1',
    "nvidia-smi": 'echo "nursery-qa: no GPU on this machine" >&2; exit 1',
    # `git clone <url> [dir]` copies --checkouts/<repo name> when it is there, else fails
    "git": ('if [ "$1" = clone ]; then shift; url=; dir=; while [ $# -gt 0 ]; do case "$1" in '
            '-b|--branch|--depth|-c|--config|-o|--origin) shift; [ $# -gt 0 ] && shift;; '
            '-*) shift;; *) '
            'if [ -z "$url" ]; then url=$1; else dir=$1; fi; shift;; esac; done; '
            'name=$(basename "$url" .git); src="$NURSERY_QA_CHECKOUTS/$name"; '
            'if [ -n "$NURSERY_QA_CHECKOUTS" ] && [ -d "$src" ]; then cp -r "$src" "${dir:-$name}"'
            ' && echo "nursery-qa: git clone $url: copied $src" >&2; exit $?; fi; '
            'echo "nursery-qa: refused: git clone $url (nothing is fetched at test time; no '
            'checkout of $name under --checkouts)" >&2; exit 1; fi; exec {git} "$@"'),
    "python": ('if [ "$1" = -m ] && [ "$2" = pip ]; then echo "nursery-qa: skipped: python $*" '
               '>&2; exit 0; fi; exec {python} "$@"'),
}
SHIMS["python3"] = SHIMS["python"]
# nginx (L0_http's and L0_grpc's basic-auth proxy, when installed: `apt-get install nginx-light`)
# keeps its pid file in the tree, so that `service nginx stop` stops this run's and no other
SHIMS["nginx"] = ('real=$(PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v nginx) || { echo '
                  '"nursery-qa: nginx is not installed" >&2; exit 127; }; '
                  'exec "$real" -g "pid $NURSERY_QA_WORK/nginx.pid;" "$@"')
# `go install github.com/grpc-ecosystem/grpc-health-probe@...` (L0_grpc) puts the harness's
# Python stand-in for that probe at $GOPATH/bin; any other go command is refused
SHIMS["go"] = ('if [ "$1" = install ] && [[ "$2" == github.com/grpc-ecosystem/grpc-health-probe* ]]; '
               'then mkdir -p "$GOPATH/bin" && printf \'#!/bin/bash\\nexec "%s" "%s" "$@"\\n\' '
               '"$NURSERY_QA_PYTHON" "$NURSERY_QA_TOOLS/grpc_health_probe.py" '
               '> "$GOPATH/bin/grpc-health-probe" && chmod +x "$GOPATH/bin/grpc-health-probe" && '
               'echo "nursery-qa: go install $2: the harness\'s stand-in" >&2; exit $?; fi; '
               'echo "nursery-qa: refused: go $* (nothing is fetched at test time)" >&2; exit 1')
# `cp` of a model that cannot exist here (TensorRT `plan_*`, OpenVINO, TensorFlow: not
# generated on this machine; `simple_plan_*`: an ensemble over one, pruned from data/), from
# data/ or from a script's own copy of it, is skipped with a
# log line, and the rest of the command runs: scripts copy such models under `set -e`
# (L0_input_validation, L0_lifecycle, L0_large_payload) and would stop there; the cases that
# use those models then fail as they should
SHIMS["cp"] = ('real=$(PATH=/usr/bin:/bin command -v cp); args=(); n=0; skipped=; '
               'for a in "$@"; do '
               'if [[ "$a" != -* ]] && [ ! -e "$a" ] && '
               '[[ "$(basename "$a")" =~ ^(simple_)?(plan|openvino|graphdef|savedmodel)_ ]]; then '
               'echo "nursery-qa: skipped: cp $a (a TensorRT, OpenVINO or TensorFlow model, '
               'not generated here)" >&2; skipped=1; continue; fi; '
               'args+=("$a"); [[ "$a" != -* ]] && n=$((n + 1)); done; '
               'if [ -n "$skipped" ] && [ "$n" -lt 2 ]; then exit 0; fi; '
               'exec "$real" "${args[@]}"')
# `sed` over such a model's files (L0_lifecycle edits `plan_*` configs and labels from data/
# under `set -e`): a missing input file inside such a model's folder is skipped with a log
# line, as the `cp` above; with no input left, `sed -i` does nothing and a plain `sed` writes
# nothing. The script (the first operand, unless -e or -f gave it) is never taken for a file
SHIMS["sed"] = ('real=$(PATH=/usr/bin:/bin command -v sed); args=(); script=; want=; files=0; '
                'skipped=; for a in "$@"; do '
                'if [ -n "$want" ]; then args+=("$a"); want=; continue; fi; '
                'case "$a" in -e|-f|--expression|--file) args+=("$a"); want=1; script=1; '
                'continue;; -l) args+=("$a"); want=1; continue;; '
                '-e*|-f*|--expression=*|--file=*) args+=("$a"); script=1; continue;; '
                '-*) args+=("$a"); continue;; esac; '
                'if [ -z "$script" ]; then args+=("$a"); script=1; continue; fi; '
                'if [ ! -e "$a" ] && '
                '[[ "$a" =~ (^|/)(simple_)?(plan|openvino|graphdef|savedmodel)_[^/]*/ ]]; '
                'then echo "nursery-qa: skipped: sed on $a (a TensorRT, OpenVINO or TensorFlow '
                'model, not generated here)" >&2; skipped=1; continue; fi; '
                'args+=("$a"); files=$((files + 1)); done; '
                'if [ -n "$skipped" ] && [ "$files" -eq 0 ]; then exit 0; fi; '
                'exec "$real" "${args[@]}"')
# `curl ... /opentelemetry-collector-releases/.../otelcol_<v>_linux_amd64.tar.gz` (L0_trace, which
# downloads the OpenTelemetry Collector at test time) writes a tarball holding the harness's
# stand-in collector (tools/otelcol.py) under the name curl would give it; the script's `tar -xvf`
# then unpacks `otelcol` as it would. Every other curl runs as it is (localhost only here)
SHIMS["curl"] = ('real=$(PATH=/usr/bin:/bin command -v curl); url=; out=; prev=; unit=; '
                 'for a in "$@"; do case "$a" in '
                 '*opentelemetry-collector-releases*/otelcol_*.tar.gz) url=$a;; '
                 '*/minio-service/*/minio.service) unit=$a;; esac; '
                 '[ "$prev" = -o ] || [ "$prev" = --output ] && out=$a; prev=$a; done; '
                 # MinIO's systemd unit (L0_storage_S3_local's `curl -O`, then moved into
                 # /etc/systemd/system and never started): a unit naming the stand-in
                 'if [ -n "$unit" ]; then printf \'[Service]\\nExecStart=/usr/local/bin/minio '
                 'server $MINIO_OPTS $MINIO_VOLUMES\\n\' > "${out:-minio.service}" && echo '
                 '"nursery-qa: curl $unit: a unit naming the stand-in MinIO" >&2; exit $?; fi; '
                 'if [ -z "$url" ]; then exec "$real" "$@"; fi; '
                 '[ -n "$out" ] || out=$(basename "$url"); tmp=$(mktemp -d) && '
                 'printf \'#!/bin/bash\\nexec "%s" "%s" "$@"\\n\' "$NURSERY_QA_PYTHON" '
                 '"$NURSERY_QA_TOOLS/otelcol.py" > "$tmp/otelcol" && chmod +x "$tmp/otelcol" && '
                 'tar -czf "$out" -C "$tmp" otelcol && rm -r "$tmp" && '
                 'echo "nursery-qa: curl $url: the harness\'s stand-in collector (tools/otelcol.py)"'
                 ' >&2; exit $?')
# `wget` of MinIO's server binary (L0_storage_S3_local) writes the harness's stand-in
# (tools/minio.py: moto's S3 server) under the name wget would give it; every other wget is
# refused (nothing is fetched at test time)
SHIMS["wget"] = ('url=; out=; prev=; for a in "$@"; do '
                 '[ "$prev" = -O ] && out=$a; case "$a" in http*://*) url=$a;; esac; prev=$a; '
                 'done; case "$url" in *dl.min.io/server/minio/*/minio) '
                 'printf \'#!/bin/bash\\nexec "%s" "%s" "$@"\\n\' "$NURSERY_QA_PYTHON" '
                 '"$NURSERY_QA_TOOLS/minio.py" > "${out:-minio}" && echo "nursery-qa: wget $url: '
                 'the harness\'s stand-in MinIO (tools/minio.py)" >&2; exit $?;; esac; '
                 'echo "nursery-qa: refused: wget $* (nothing is fetched at test time)" >&2; exit 1')
# awscli-local's `awslocal` (pip-installed by L0_storage_S3_local; the pip shim skips that):
# the AWS CLI with awslocal's default region, the script giving the endpoint itself
SHIMS["awslocal"] = ('export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}; '
                     'exec "$NURSERY_QA_PYTHON" -m awscli "$@"')
SHIMS["service"] = ('if [ "$1" = nginx ] && [ "$2" = stop ]; then '
                    'kill "$(cat "$NURSERY_QA_WORK/nginx.pid" 2>/dev/null)" 2>/dev/null; exit 0; '
                    'fi; echo "nursery-qa: skipped: service $*" >&2; exit 0')


# Groups whose test.sh checks the server itself (starts it on a model folder and greps its log)
# instead of running Python clients: each writes one "Test <what>" line per check into the
# client log named here, followed by "*** FAILED: ..." when that check failed. Each such check is
# a case (`test.sh::<what>`); the "Not found ..." lines before its verdict are its message.
SHELL_CASE_LOGS = {"L0_model_config": "client.log"}


def shell_cases(text: str) -> list[dict]:
    """The cases of a client log in the "Test <what>" / "*** FAILED" layout (SHELL_CASE_LOGS)."""
    cases: list[dict] = []
    for line in text.splitlines():
        if line.startswith("Test "):
            cases.append({"test": f"test.sh::{line[5:].strip()}", "outcome": "passed",
                          "message": ""})
        elif cases and line.startswith("*** FAILED"):
            cases[-1]["outcome"] = "failed"
            cases[-1]["message"] = (cases[-1]["message"] + "\n" + line).strip()
        elif cases and line.startswith("Not found"):
            cases[-1]["message"] = (cases[-1]["message"] + "\n" + line).strip()
    for case in cases:
        if case["outcome"] == "passed":
            case["message"] = ""
    return cases


# a private PID namespace (and /proc) per group beside the network namespace, where allowed
PIDNS = ("--pid", "--fork", "--mount-proc")

# System folders a group's script writes into as if it owned the container (L0_storage_S3_local
# moves MinIO into /usr/local/bin and makes /usr/local/share/minio and /etc/minio): in the
# group's mount namespace each is an overlay whose writes land under the work folder
# (overlays/<group>/, emptied at each run), so the machine's own folders are never touched
PRIVATE_DIRS = {"L0_storage_S3_local": ("/usr/local/bin", "/usr/local/share", "/etc")}


def overlay_mounts(work: Path, group: str) -> str:
    """The shell commands that mount the group's private overlays (see :data:`PRIVATE_DIRS`),
    each followed by ``&&``; "" for a group without any."""
    commands = []
    root = work / "overlays" / group_file(group)
    if root.exists():
        shutil.rmtree(root)
    for n, target in enumerate(PRIVATE_DIRS.get(group, ())):
        upper, scratch = root / str(n) / "upper", root / str(n) / "work"
        upper.mkdir(parents=True)
        scratch.mkdir(parents=True)
        commands.append(f"mount -t overlay overlay -o lowerdir={target},upperdir={upper},"
                        f"workdir={scratch} {target} && ")
    return "".join(commands)


def group_file(group: str) -> str:
    return group.replace("/", "__")


def prepare(triton: Path, work: Path, checkouts: Path | None = None) -> None:
    """The container-shaped tree under work (qa copy, stand-in, shims, empty data folders)."""
    qa = work / "qa"
    if qa.exists():
        shutil.rmtree(qa)
    shutil.copytree(triton / "qa", qa, symlinks=True)
    opt = work / "opt" / "tritonserver"
    data = work / "data" / "inferenceserver"
    sagemaker = work / "opt" / "ml"  # SageMaker's model folder (L0_trace writes models there)
    for path in qa.rglob("*"):
        if path.suffix in (".sh", ".py", ".conf") and path.is_file() and not path.is_symlink():
            text = path.read_text(errors="surrogateescape")
            new = text.replace("/opt/tritonserver", str(opt)).replace(
                "/data/inferenceserver", str(data)).replace("/opt/ml/", str(sagemaker) + "/")
            if new.startswith("#!/usr/bin/python\n"):  # the container's interpreter path
                new = "#!/usr/bin/env python3\n" + new[len("#!/usr/bin/python\n"):]
            if new != text:
                path.write_text(new, errors="surrogateescape")
    (opt / "bin").mkdir(parents=True, exist_ok=True)
    (opt / "backends" / "python").mkdir(parents=True, exist_ok=True)
    link = opt / "qa"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(qa)
    (data / VERSION).mkdir(parents=True, exist_ok=True)
    # SageMaker's `serve` script, where Triton's image installs it (on PATH), with its
    # /opt/ml/ paths rewritten as the qa scripts' are
    serve = triton / "docker" / "sagemaker" / "serve"
    if serve.is_file():
        write_exec(opt / "bin" / "serve", serve.read_text().replace("/opt/ml/", str(sagemaker) + "/"))
    for what in container_models(triton, work, checkouts):
        print(f"prepare: not available: {what}", file=sys.stderr)
    write_launchers(work)


def write_launchers(work: Path) -> None:
    """The `tritonserver` stand-in's launcher (this checkout's standin.py), the stand-ins for
    C++ test backends and the shims: written by every run, --reuse too, so a kept tree never
    runs another checkout's."""
    # L0_lifecycle copies the identity backend's library (Triton's image puts it in the
    # group's folder) into its identity model's version folders; the harness's identity
    # stand-in is a Python-based backend that reads no library, so an empty placeholder of
    # that name keeps the script's copies (and the version folders they make) as Triton's
    for variant, base in SHM_VARIANTS.items():
        if (work / "qa" / base).is_dir() and not (work / "qa" / variant).exists():
            shutil.copytree(work / "qa" / base, work / "qa" / variant, symlinks=True)
    lifecycle = work / "qa" / "L0_lifecycle"
    if lifecycle.is_dir() and not (lifecycle / "libtriton_identity.so").exists():
        (lifecycle / "libtriton_identity.so").write_bytes(b"")
    opt = work / "opt" / "tritonserver"
    # stand-ins for C++ test backends Triton's image builds, as Python-based backends
    for backend in (HERE / "backends").iterdir():
        shutil.copytree(backend, opt / "backends" / backend.name, dirs_exist_ok=True)
    # Dockerfile.QA puts the C++ dyna_sequence, sequence and iterative_sequence backends'
    # libraries into their models' version folders; the stand-ins need only the folders
    # (and makes the version folders of L0_perf_*'s identity models, which need no file)
    for model in ("custom_models/custom_dyna_sequence_int32",
                  "custom_models/custom_sequence_int32",
                  "L0_iterative_sequence/models/iterative_sequence",
                  "L0_perf_nomodel/custom_models/custom_zero_1_float32",
                  "L0_perf_pyclients/custom_models/custom_zero_1_int32"):
        if (work / "qa" / model).is_dir():
            (work / "qa" / model / "1").mkdir(exist_ok=True)
    (opt / "bin").mkdir(parents=True, exist_ok=True)
    write_exec(opt / "bin" / "tritonserver",
               f'#!/bin/bash\nexec "{sys.executable}" "{HERE / "standin.py"}" "$@"\n')
    # the server runs as a process named tritonserver, as in Triton's container (scripts find
    # it with `ps | grep tritonserver`): the interpreter through a link of that name
    exe = opt / "bin" / ".nursery" / "tritonserver"
    exe.parent.mkdir(exist_ok=True)
    if exe.is_symlink() or exe.exists():
        exe.unlink()
    exe.symlink_to(sys.executable)
    # a fresh container has no SageMaker model folder (L0_sagemaker refuses to start on one)
    shutil.rmtree(work / "opt" / "ml", ignore_errors=True)
    shims = work / "shims"
    shims.mkdir(exist_ok=True)
    git = shutil.which("git") or "/usr/bin/git"
    for name, body in SHIMS.items():
        write_exec(shims / name,
                   "#!/bin/bash\n" + body.replace("{git}", git).replace(
                       "{python}", sys.executable) + "\n")


def container_models(triton: Path, work: Path, checkouts: Path | None) -> list[str]:
    """The few steps of Triton's Dockerfile.QA that put models into qa/ folders from the server
    repository itself (docs/examples, src/test/models) and python_backend's examples; the C++
    test backends it also copies there (libtriton_repeat.so, ...) are not built here. Returns
    what it could not do."""
    qa = work / "qa"
    missing = []
    simple = triton / "docs" / "examples" / "model_repository" / "simple"
    if simple.is_dir():
        for group in ("L0_simple_example", "L0_shared_memory"):
            target = qa / group / "models"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copytree(simple, target / "simple", dirs_exist_ok=True)
        for group, version in (("L0_simple_ensemble", "1"), ("L0_simple_ensemble", "2"),
                               ("L0_socket", "1")):
            folder = qa / group / "models" / "simple" / version
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(simple / "1" / "model.onnx", folder)
    else:
        missing.append(f"{simple} (docs/examples of the server repository)")
    # L0_http and L0_grpc serve docs/examples' models from a models/ folder of their own
    # (densenet_onnx's model file is downloaded there; not here: its clients fail)
    doc_models = triton / "docs" / "examples" / "model_repository"
    for group, names in EXAMPLE_MODELS.items():
        for name in names:
            if (doc_models / name).is_dir():
                shutil.copytree(doc_models / name, qa / group / "models" / name, dirs_exist_ok=True)
    # densenet_onnx's model file is downloaded when Triton's image is built: a stand-in with
    # its inputs and outputs (untrained, so the image clients' VULTURE checks fail) lets the
    # servers of L0_http and L0_grpc start
    for group in ("L0_http", "L0_grpc"):
        model = qa / group / "models" / "densenet_onnx" / "1" / "model.onnx"
        if model.parent.parent.is_dir() and not model.exists():
            model.parent.mkdir(exist_ok=True)
            standin_densenet(model)
    # qa/clients: the client repository's Python examples (Triton's SDK image installs them
    # there); its C++ example programs are not built here
    client = (checkouts / "client" / "src" / "python" / "examples") if checkouts else None
    if client and client.is_dir():
        (qa / "clients").mkdir(exist_ok=True)
        for script in client.glob("*.py"):
            shutil.copy(script, qa / "clients" / script.name)
        # the C++ simple_{http,grpc}_infer_client programs (L0_trace, L0_logging and others run
        # them to send traffic), stood in for by the Python examples of the same name: the same
        # request to the `simple` model, the same check, the same -v / -u flags
        for name in ("simple_http_infer_client", "simple_grpc_infer_client"):
            write_exec(qa / "clients" / name,
                       f'#!/bin/bash\n# nursery-qa: stand-in for the C++ {name}\n'
                       f'exec python3 "$(dirname "$0")/{name}.py" "$@"\n')
    else:
        missing.append("client/src/python/examples (--checkouts): qa/clients")
    # L0_python_api's clients: the core repository's python/test (Dockerfile.QA copies it
    # into the group's folder), run against nursery's `tritonserver` / `tritonfrontend`
    api_tests = (checkouts / "core" / "python" / "test") if checkouts else None
    if api_tests and api_tests.is_dir() and (qa / "L0_python_api").is_dir():
        shutil.copytree(api_tests, qa / "L0_python_api", dirs_exist_ok=True)
    elif (qa / "L0_python_api").is_dir():
        missing.append("core/python/test (--checkouts): L0_python_api's test_api.py")
    test_models = triton / "src" / "test" / "models"
    decoupled = qa / "L0_decoupled" / "models"
    if test_models.is_dir():
        for name in ("repeat_int32", "square_int32"):
            shutil.copytree(test_models / name, decoupled / name, dirs_exist_ok=True)
        for name in ("repeat_int32", "square_int32", "identity_int32", "simple_repeat",
                     "fan_repeat", "sequence_repeat", "repeat_square", "nested_square"):
            (decoupled / name / "1").mkdir(parents=True, exist_ok=True)
        # L0_grpc_state_cleanup serves the C++ `repeat` backend's model (the stand-in here)
        cleanup = qa / "L0_grpc_state_cleanup" / "models" / "repeat_int32"
        if (qa / "L0_grpc_state_cleanup").is_dir():
            shutil.copytree(test_models / "repeat_int32", cleanup, dirs_exist_ok=True)
            (cleanup / "1").mkdir(exist_ok=True)
        python_models = qa / "L0_decoupled" / "python_models"
        shutil.copytree(decoupled, python_models, dirs_exist_ok=True)
        examples = (checkouts / "python_backend" / "examples" / "decoupled") if checkouts else None
        if examples and examples.is_dir():
            # the python trial's models, as Triton's Dockerfile.QA makes them
            for name in ("repeat", "square"):
                shutil.copy(examples / f"{name}_model.py",
                            python_models / f"{name}_int32" / "1" / "model.py")
                shutil.copy(examples / f"{name}_config.pbtxt",
                            python_models / f"{name}_int32" / "config.pbtxt")
        else:
            missing.append("python_backend/examples/decoupled (--checkouts)")
    else:
        missing.append(f"{test_models} (src/test/models of the server repository)")
    return missing


def standin_densenet(path: Path) -> None:
    """An ONNX model shaped like the densenet_onnx example (data_0 [1,3,224,224] -> fc6_1
    [1,1000,1,1]): a global average pool and a fixed 1x1 convolution."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = np.linspace(-1, 1, 3000, dtype=np.float32).reshape(1000, 3, 1, 1)
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["data_0"], ["pooled"]),
         helper.make_node("Conv", ["pooled", "w"], ["fc6_1"])],
        "densenet_standin",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, [1, 1000, 1, 1])],
        [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save_model(model, str(path))


def write_exec(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def generate(work: Path, env: dict[str, str], log) -> None:
    """Triton's own model generators for what this machine can build (ONNX, LibTorch)."""
    common = work / "qa" / "common"
    data = work / "data" / "inferenceserver" / VERSION
    for script, flags, folder in GENERATORS:
        target = data / folder
        target.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, str(common / script), *flags, f"--models_dir={target}"]
        print(f"generate: {' '.join(cmd)}", file=log, flush=True)
        rc = subprocess.run(cmd, cwd=common, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"generate: exit {rc}", file=log, flush=True)
    for path in prune_ensembles(data):
        print(f"generate: removed {path} (its steps are models not generated here)", file=log,
              flush=True)


# An ensemble the generators write for a platform this machine does not generate models for
# (TensorRT `plan`, OpenVINO, TensorFlow): its steps do not exist here
FOREIGN_ENSEMBLE = re.compile(r"(^|_)(plan|openvino|graphdef|savedmodel)(_|$)")


def prune_ensembles(data: Path) -> list[Path]:
    """Remove the generated ensembles over models that are not generated here: a script that
    copies a whole ensemble repository (L0_infer_variable, L0_infer_reshape) would otherwise
    give its server ensembles that cannot load, and the server would not start. Returns what
    it removed."""
    removed = []
    root = data / "qa_ensemble_model_repository"
    for folder in sorted(root.glob("*/*")) if root.is_dir() else ():
        if folder.is_dir() and FOREIGN_ENSEMBLE.search(folder.name):
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


CLIENT_PACKAGES = (("sseclient-py", "sseclient"), ("psutil", "psutil"))


def _pip_into(target: Path, requirement: str) -> bool:
    """``requirement`` installed into the folder ``target`` (no dependencies); whether pip
    succeeded."""
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--target", str(target), requirement]).returncode == 0


def client_site(work: Path, version: str) -> Path:
    """A folder holding tritonclient ``version`` (installed there once with pip, without its
    dependencies: the machine's grpcio, numpy, ... serve), for the clients' PYTHONPATH."""
    target = work / "clients" / version
    if not (target / "tritonclient").is_dir():
        if not _pip_into(target, f"tritonclient=={version}") \
                or not (target / "tritonclient").is_dir():
            sys.exit(f"--tritonclient {version}: pip could not install tritonclient=={version} "
                     f"into {target}")
    # what Triton's client scripts pip-install in their container (L0_sagemaker's
    # `pip install sseclient-py psutil`): the pip shim skips it, so it goes here, not onto
    # the machine
    for package, module in CLIENT_PACKAGES:
        if not any((target / name).exists() for name in (module, module + ".py")):
            if not _pip_into(target, package):
                print(f"clients: pip could not install {package}", file=sys.stderr)
    return target


# what L0_python_api's script pip-installs (pytest-asyncio 0.23.8 there; a release that
# runs on this machine's pytest here), into a folder of its own that only that group sees
ASYNCIO_PLUGIN = "pytest-asyncio>=1.1,<2"


def asyncio_site(work: Path) -> Path:
    target = work / "clients" / "pytest-asyncio"
    if not (target / "pytest_asyncio").is_dir():
        if not _pip_into(target, ASYNCIO_PLUGIN):
            print(f"clients: pip could not install {ASYNCIO_PLUGIN}", file=sys.stderr)
    return target


def environment(work: Path, record: Path, python_mode: str,
                checkouts: Path | None = None, clients: Path | None = None) -> dict[str, str]:
    opt = work / "opt" / "tritonserver"
    env = dict(os.environ)
    env.update({
        "NVIDIA_TRITON_SERVER_VERSION": VERSION,
        "REPO_VERSION": VERSION,
        "TRITON_DIR": str(opt),
        "SERVER": str(opt / "bin" / "tritonserver"),
        "BACKEND_DIR": str(opt / "backends"),
        "DATADIR": str(work / "data" / "inferenceserver" / VERSION),
        "TEST_WINDOWS": "0",
        "TEST_JETSON": "0",
        "TRITON_SERVER_CPU_ONLY": "1",
        "CUDA_VISIBLE_DEVICES": "",
        # Triton's container has its bin/ on PATH (log_format_test.py runs `tritonserver`)
        "PATH": os.pathsep.join([str(work / "shims"), str(opt / "bin"), env.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(
            [str(HERE / "hooks"), *([str(clients)] if clients else []),
             str(work / "qa" / "common"), env.get("PYTHONPATH", "")]),
        "PYTEST_PLUGINS": "nursery_qa_pytest",
        "PYTEST_ADDOPTS": "-p no:cacheprovider",
        "NURSERY_QA_RECORD": str(record),
        "NURSERY_QA_ROOT": str(ROOT),
        "NURSERY_QA_PYTHON": sys.executable,
        "NURSERY_QA_SERVER_EXE": str(opt / "bin" / ".nursery" / "tritonserver"),
        # the SageMaker multi-model endpoint's /opt/ml/models, in this tree as the scripts'
        "NURSERY_SAGEMAKER_MODELS_ROOT": str(work / "opt" / "ml" / "models"),
        "NURSERY_QA_PYTHON_MODE": python_mode,
        "NURSERY_QA_BACKEND_DIR": str(opt / "backends"),
        "NURSERY_QA_WORK": str(work),
        # Triton's image names its version here; clients compare server metadata with it
        "TRITON_SERVER_VERSION": server_version(),
        "NURSERY_QA_TOOLS": str(HERE / "tools"),
        "GOPATH": str(work / "go"),
        "NURSERY_QA_CHECKOUTS": str(checkouts or ""),
    })
    return env


def server_version() -> str:
    """The version nursery's server metadata reports (nursery/runtime/about.py)."""
    text = (ROOT / "nursery" / "runtime" / "about.py").read_text()
    match = re.search(r'^VERSION = "([^"]+)"', text, re.M)
    return match.group(1) if match else ""


# Groups whose test.sh is a row of self-contained sections (each sets its models up, starts a
# server, runs its cases, stops it) that begin at a top-level marker line, and which stop at
# the first section that cannot run here (a TensorRT model it copies, edits or loads: under
# `set -e`, or by its own `exit 1` when its server cannot start). Such a script runs section
# by section: the text before the first marker once, then each section unchanged in a
# subshell of its own under `set -e`, so that a section that fails ends itself only (a server
# it left running is stopped) and the script's status says that one did. Nothing in a section
# is changed or left out.
SECTIONED = {"L0_lifecycle": "LOG_IDX=$((LOG_IDX+1))"}


def sectioned(script: str, marker: str, only: Sequence[str] = ()) -> str:
    """``script`` run section by section (see :data:`SECTIONED`): a section starts at a line
    that is ``marker`` exactly (top level, not indented) followed by a blank line (a marker
    followed by more of its section's commands, as L0_lifecycle's second server of its
    "No Port Collision Test", is not a split); the text after the last section (a final
    summary) stays in the last one. ``only``: the sections whose text names one of these
    (a case, say) run, the others are left out (``--sections``: a re-run of a few)."""
    lines = script.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == marker
              and i + 1 < len(lines) and not lines[i + 1].strip()]
    if not starts:
        return script
    out = ["".join(lines[:starts[0]]),
           "\n# nursery-qa: each section below runs in a subshell of its own\n",
           "NURSERY_QA_RET=0\n"]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        body = "".join(lines[start:end])
        if only and not any(name in body for name in only):
            out.append(f"{marker}\n")  # left out; its log index still counts
            continue
        # the section's LOG_IDX step is kept in this shell too, so that log names run on
        # a server the section started and did not stop (it failed half way) is stopped
        out += [f"{marker}\nset +e\n(\nset -e\n"
                "trap 'for p in $(jobs -p); do kill $p || true; wait $p || true; done "
                "2>/dev/null' EXIT\n",
                body.replace(marker, "true # (the section's LOG_IDX step, made above)", 1),
                "\nexit ${RET:-0}\n)\n",
                f'if [ $? -ne 0 ]; then NURSERY_QA_RET=1; echo "nursery-qa: section {n + 1} '
                'of the script failed or stopped"; fi\nset -e\n']
    out.append("exit $NURSERY_QA_RET\n")
    return "".join(out)


def run_group(work: Path, group: str, python_mode: str, timeout: float,
              netns: bool | tuple[str, ...], checkouts: Path | None = None,
              clients: Path | None = None, script: Path | None = None,
              sections: Sequence[str] = ()) -> dict:
    """``script``: one of ours (``parts/``) run in the group's folder instead of its test.sh,
    for a group whose test.sh cannot run here as a whole; its results are kept apart
    (``<group>+<script name>``)."""
    if PRIVATE_DIRS.get(group) and not isinstance(netns, tuple):
        sys.exit(f"{group}: writes into {', '.join(PRIVATE_DIRS[group])}, which needs a mount "
                 "namespace of its own (unshare --pid --mount-proc); not run here")
    results = work / "results"
    results.mkdir(exist_ok=True)
    stem = group_file(group) + (f"+{script.stem}" if script is not None else "") + (
        "+sections" if sections else "")
    record = results / f"{stem}.cases.jsonl"
    record.unlink(missing_ok=True)
    folder = work / "qa" / group
    env = environment(work, record, python_mode, checkouts, clients)
    # the scripts run where Triton's image has them, /opt/tritonserver/qa/<group> (here the
    # opt/tritonserver/qa link to qa/): their `pwd` then names the paths their clients expect
    # (rewritten from /opt/tritonserver), as L0_metrics' namespace labels do
    logical = work / "opt" / "tritonserver" / "qa" / group
    cwd = logical if logical.is_dir() else folder
    env["PWD"] = str(cwd)
    if group.startswith("L0_backend_python/"):
        env["MODELDIR"] = str(work / "qa" / "L0_backend_python")
    for name, value in GROUP_ENV.get(group, {}).items():  # one set by the caller wins
        env[name] = os.environ.get(name, value)
    if group == "L0_python_api":
        # Triton's image installs its in-process packages; nursery's `tritonserver` and
        # `tritonfrontend` are at its repository's root
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(asyncio_site(work)),
                                             env["PYTHONPATH"]])
    log_path = results / f"{stem}.log"
    test_sh = "test.sh"
    if script is not None:
        test_sh = "nursery_part.sh"
        shutil.copyfile(script, folder / test_sh)
    elif group in SECTIONED:
        test_sh = "nursery_sections.sh"
        (folder / test_sh).write_text(sectioned((folder / "test.sh").read_text(),
                                                SECTIONED[group], sections))
    command = ["bash", test_sh]
    if netns:  # True, or the unshare flags beside --net (PIDNS)
        extra = netns if isinstance(netns, tuple) else ()
        # with a mount namespace of its own, a /dev/shm of its own too: Triton's shared-memory
        # leak probes (shm_util.py) look there for Triton's Python-backend pools, and a real
        # Triton elsewhere on the machine would otherwise put its pools in their view
        private_shm = "mount -t tmpfs tmpfs /dev/shm && " if extra else ""
        if extra:
            private_shm += overlay_mounts(work, group)
        command = ["unshare", "--net", *extra, "--", "bash", "-c",
                   f"ip link set lo up && {private_shm}exec bash {test_sh}"]
    started = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = -1
        # whatever the script left running (a server it did not stop) goes with it
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(2)
        proc.wait()
    cases = []
    if record.exists():
        cases = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    late = 0
    if timed_out:  # what ran while the script was being stopped (its server killed) is noise
        kept = [c for c in cases if c.get("time", 0) <= started + timeout]
        late, cases = len(cases) - len(kept), kept
    shell_log = folder / SHELL_CASE_LOGS.get(group, "")
    if group in SHELL_CASE_LOGS and shell_log.is_file():
        cases += shell_cases(shell_log.read_text(errors="replace"))
    summary = summarize(cases)
    out = {"group": group, "python_mode": python_mode,
           "tritonclient": clients.name if clients else "the machine's",
           "exit": rc, "timed_out": timed_out, "dropped_after_timeout": late,
           "seconds": round(time.time() - started), "summary": summary, "cases": cases}
    (results / f"{stem}.json").write_text(json.dumps(out, indent=1))
    return out


def summarize(cases: list[dict]) -> dict[str, int]:
    """Counts over distinct cases (test ids): a script that runs a test several times (five
    iterations, two server configurations) has one case that passes only if every run passed.
    `runs` counts every recorded run."""
    worst: dict[str, str] = {}
    rank = {"skipped": 0, "passed": 1, "xfailed": 1, "failed": 2, "error": 2, "xpassed": 2}
    for case in cases:
        outcome = case["outcome"]
        if rank.get(outcome, 2) >= rank.get(worst.get(case["test"], "skipped"), 0):
            worst[case["test"]] = outcome
    counts = {"run": 0, "passed": 0, "failed": 0, "skipped": 0, "runs": len(cases)}
    for outcome in worst.values():
        if outcome == "skipped":
            counts["skipped"] += 1
            continue
        counts["run"] += 1
        counts["passed" if outcome in ("passed", "xfailed") else "failed"] += 1
    return counts


def markdown(results: Path) -> str:
    """A table of every group run into results/, then each failed case (for docs)."""
    rows = ["| group | test.sh | cases run | passed | failed | skipped | runs |",
            "|---|---|---|---|---|---|---|"]
    failures = []
    for path in sorted(results.glob("*.json")):
        out = json.loads(path.read_text())
        s = summarize(out["cases"])
        verdict = "timed out" if out["timed_out"] else ("pass" if out["exit"] == 0 else
                                                        f"exit {out['exit']}")
        rows.append(f"| {out['group']} | {verdict} | {s['run']} | {s['passed']} | "
                    f"{s['failed']} | {s['skipped']} | {s['runs']} |")
        seen = set()
        for case in out["cases"]:
            if case["outcome"] not in ("passed", "skipped", "xfailed") and case["test"] not in seen:
                seen.add(case["test"])
                last = case["message"].splitlines()[-1][:240] if case["message"] else ""
                failures.append(f"- {out['group']}: `{case['test']}`: {last}")
    return "\n".join(rows + [""] + failures) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="*", help="qa folders with a test.sh, e.g. L0_parameters "
                        "or L0_backend_python/bls")
    parser.add_argument("--summary", action="store_true",
                        help="print a markdown table of the results under --work and stop")
    parser.add_argument("--triton-server", type=Path,
                        help="a local checkout of triton-inference-server/server")
    parser.add_argument("--work", type=Path, default=Path("/tmp/nursery-qa"))
    parser.add_argument("--python-mode", choices=("process", "thread", ""), default="process",
                        help="nursery's Python instance mode (process is Triton's way)")
    parser.add_argument("--checkouts", type=Path,
                        help="a folder of local checkouts by repository name (python_backend, "
                        "...): a script's `git clone .../<name>` copies <folder>/<name>")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per group")
    parser.add_argument("--case-limit", type=float, default=300,
                        help="seconds a pytest case may run before it is failed, so that a "
                        "case waiting for an answer that never comes does not take the "
                        "group's time (0: no limit)")
    parser.add_argument("--generate", action="store_true",
                        help="run Triton's ONNX/LibTorch model generators into data/")
    parser.add_argument("--no-netns", action="store_true",
                        help="run on the machine's own network (ports 8000-8002 must be free)")
    parser.add_argument("--tritonclient", metavar="VERSION",
                        help="the tritonclient release the clients import (Triton's qa image "
                        "has its own release's; the machine's may be older): installed once "
                        "with pip, without dependencies, into --work/clients/VERSION")
    parser.add_argument("--script", type=Path,
                        help="run this script (scripts/triton_qa/parts/) in the group's folder "
                        "instead of its test.sh; results under <group>+<script name>")
    parser.add_argument("--sections", default="",
                        help="comma-separated names (cases): run only the sections of a "
                        "sectioned group's script that name one; results under "
                        "<group>+sections")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the prepared tree (and what earlier runs left in it)")
    args = parser.parse_args()
    if args.summary:
        print(markdown(args.work / "results"), end="")
        return
    if args.triton_server is None:
        parser.error("--triton-server is required")
    if not (args.triton_server / "qa" / "common" / "util.sh").is_file():
        parser.error(f"{args.triton_server} does not look like Triton's server repository "
                     "(no qa/common/util.sh)")
    os.environ["NURSERY_QA_CASE_LIMIT"] = str(args.case_limit)  # read by the pytest hook
    # the server repository's other folders (L0_mlflow's part copies deploy/mlflow-triton-plugin)
    os.environ["NURSERY_QA_TRITON_SERVER"] = str(args.triton_server.resolve())
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if not (args.reuse and (work / "qa").exists()):
        prepare(args.triton_server.resolve(), work,
                args.checkouts.resolve() if args.checkouts else None)
    else:
        write_launchers(work)
    if args.generate:
        with open(work / "generate.log", "w") as log:
            generate(work, environment(work, work / "generate.cases.jsonl", ""), log)
    clients = client_site(work, args.tritonclient) if args.tritonclient else None
    netns: bool | tuple[str, ...] = not args.no_netns and subprocess.run(
        ["unshare", "--net", "true"], capture_output=True).returncode == 0
    if netns and subprocess.run(["unshare", "--net", *PIDNS, "true"],
                                capture_output=True).returncode == 0:
        netns = PIDNS  # and a PID namespace of its own
    for group in args.groups:
        if not (work / "qa" / group / "test.sh").is_file():
            print(f"{group}: no test.sh", file=sys.stderr)
            continue
        out = run_group(work, group, args.python_mode, args.timeout, netns,
                        args.checkouts.resolve() if args.checkouts else None, clients,
                        args.script.resolve() if args.script else None,
                        [n for n in args.sections.split(",") if n])
        s = out["summary"]
        print(f"{group}: test.sh exit {out['exit']}{' (timed out)' if out['timed_out'] else ''}"
              f", cases run {s['run']}, passed {s['passed']}, failed {s['failed']}, "
              f"skipped {s['skipped']} ({s['runs']} runs, {out['seconds']} s)", flush=True)
        seen = set()
        for case in out["cases"]:
            if case["outcome"] not in ("passed", "skipped", "xfailed") and case["test"] not in seen:
                seen.add(case["test"])
                print(f"  {case['outcome']}: {case['test']}: {case['message'][-200:]}")


if __name__ == "__main__":
    main()
