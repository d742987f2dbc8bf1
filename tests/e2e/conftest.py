"""A server shared by the e2e tests of a module, on a repository with every kind of model."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ServerProcess, make_models, running_server


@pytest.fixture(autouse=True)
def _collect_on_this_thread() -> Iterator[None]:
    """Each test's cyclic garbage is collected here, on the main thread, when it ends. A
    tritonclient HTTP client caught in a cycle (an error's traceback holds it) and collected
    later by whichever thread happens to allocate is finalised off its gevent hub's thread,
    cannot close its pooled socket, and the ResourceWarning fails an unrelated test."""
    yield
    gc.collect()


ALL_TYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES", "BF16"]


def build_e2e_repo(repo: Path) -> Path:
    """add_sub and mlp as the peer benchmark configures them (max_batch_size 64), plus one
    identity model per datatype, a non-batching model, two versions of one model, a model
    with class labels and one configured by auto-complete."""
    make_models.write_add_sub(repo, max_batch_size=64)
    make_models.write_mlp(repo, max_batch_size=64)
    make_models.write_string_identity(repo)
    make_models.write_model(
        repo, "mlp_batched", make_models.build_mlp(),
        make_models.config_text("mlp_batched", [("INPUT0", "FP32", [784])],
                                [("OUTPUT0", "FP32", [10])], 32,
                                "dynamic_batching { max_queue_delay_microseconds: 20000 }\n"),
    )
    make_models.write_model(
        repo, "identity_priority", make_models.build_identity("INT32", ["batch", 1]),
        make_models.config_text(
            "identity_priority", [("INPUT0", "INT32", [1])], [("OUTPUT0", "INT32", [1])], 8,
            "dynamic_batching { max_queue_delay_microseconds: 300000 priority_levels: 2 "
            "default_priority_level: 2 default_queue_policy { timeout_action: REJECT "
            "default_timeout_microseconds: 5000000 allow_timeout_override: true "
            "max_queue_size: 4 } }\n"),
    )
    for dt in ALL_TYPES:
        name = f"identity_{dt.lower()}"
        make_models.write_model(
            repo, name, make_models.build_identity(dt, ["batch", "n"]),
            make_models.config_text(name, [("INPUT0", dt, [-1])], [("OUTPUT0", dt, [-1])], 8),
        )
    make_models.write_model(
        repo, "add_sub_nobatch", make_models.build_identity("FP32", [2, 16]),
        make_models.config_text("add_sub_nobatch", [("INPUT0", "FP32", [2, 16])],
                                [("OUTPUT0", "FP32", [2, 16])], 0),
    )
    for version in (1, 2, 3):
        make_models.write_model(
            repo, "versioned", make_models.build_identity("INT32", ["batch", 4]),
            make_models.config_text("versioned", [("INPUT0", "INT32", [4])],
                                    [("OUTPUT0", "INT32", [4])], 4,
                                    "version_policy: { specific { versions: [1, 3] } }\n"),
            version=version,
        )
    classifier = make_models.write_model(
        repo, "classifier", make_models.build_identity("FP32", ["batch", 4]),
        make_models.config_text("classifier", [("INPUT0", "FP32", [4])], [], 4).replace(
            "output [\n\n]\n",
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] '
            'label_filename: "labels.txt" } ]\n'),
    )
    (classifier / "labels.txt").write_text("cat\ndog\nbird\nfish\n")
    return repo


@pytest.fixture(scope="module")
def e2e_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_e2e_repo(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def server(e2e_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(e2e_repo, tmp_path_factory=tmp_path_factory) as proc:
        yield proc
