"""A server shared by the e2e tests of a module, on a repository with every kind of model."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, make_models, running_server

# A tritonclient HTTP client left to the garbage collector leaks its pooled socket whenever it
# ends up in a reference cycle (an InferenceServerException's traceback holds the client's
# frames, and tritonclient's own frame holds the exception): the cycle's finalizers run in no
# set order, the socket's may come before the client's close(), and the ResourceWarning
# (an error in this suite) then fails whichever test the collector happens to run in. So the
# clients a test's body makes on the main thread are closed when it ends (a collection per
# test would find them too, at about 0.14 s each with torch imported: 90 s of the suite); a
# client made in another thread is closed in that thread (tests/unit/test_lint.py checks
# it), as gevent cannot close another thread's socket.
_MADE: weakref.WeakSet[Any] = weakref.WeakSet()
_BODY_CLIENTS = pytest.StashKey[list[Any]]()
_init = httpclient.InferenceServerClient.__init__


def _tracked_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    if threading.current_thread() is threading.main_thread():
        _MADE.add(self)


httpclient.InferenceServerClient.__init__ = _tracked_init  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    before = weakref.WeakSet(_MADE)
    yield
    item.stash[_BODY_CLIENTS] = [c for c in list(_MADE) if c not in before]


@pytest.fixture(autouse=True)
def _close_body_clients(request: pytest.FixtureRequest) -> Iterator[None]:
    """The clients the test's body made are closed when it ends (those of fixtures stay
    theirs): see ``_MADE``."""
    yield
    for client in request.node.stash.get(_BODY_CLIENTS, []):
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closed already, or its pool gone: nothing to leak
            pass
    request.node.stash[_BODY_CLIENTS] = []


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
