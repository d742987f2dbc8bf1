"""The pure rules of --model-namespacing: identifiers, how a name is resolved (Triton's
FindModelIdentifier and its dependency graph's fuzzy match), scans, snapshots and the index."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import MappingProxyType

import pytest

from nursery.actors.directory import (
    ModelEntry,
    ModelState,
    ModelTable,
    VersionStatus,
    repository_index,
)
from nursery.config.namespaces import ModelId, by_name, find_identifier, step_model
from nursery.config.repository import diff, scan, snapshot
from nursery.errors import ErrorKind, InvalidArgument

A, B = ModelId("/r/a", "m"), ModelId("/r/b", "m")


def test_an_identifier_is_written_as_triton_writes_it_and_sorts_by_namespace_first() -> None:
    assert str(ModelId("", "m")) == ModelId("", "m").key == "m"
    assert str(A) == "/r/a::m"
    assert sorted([ModelId("/r/b", "a"), ModelId("/r/a", "z"), ModelId("", "q")]) == [
        ModelId("", "q"), ModelId("/r/a", "z"), ModelId("/r/b", "a")]


def test_a_name_is_resolved_only_when_one_model_holds_it() -> None:
    assert find_identifier("m", (A,)) == A
    with pytest.raises(InvalidArgument) as unknown:
        find_identifier("m", ())
    assert unknown.value.message == "Request for unknown model: 'm' is not found"
    with pytest.raises(InvalidArgument) as ambiguous:
        find_identifier("m", (A, B))
    assert ambiguous.value.kind is ErrorKind.INVALID_ARG
    assert ambiguous.value.message == (
        "There are 2 identifiers of model 'm' in global map, model namespace must be provided "
        "to resolve ambiguity.")


def test_a_preferred_namespace_wins_and_else_the_only_model_of_the_name() -> None:
    """An ensemble step's lookup: its own namespace's model first, else the one model of
    that name anywhere; two elsewhere stay ambiguous."""
    assert find_identifier("m", (A, B), preferred="/r/b") == B
    assert find_identifier("m", (A,), preferred="/r/b") == A
    with pytest.raises(InvalidArgument, match="ambiguity"):
        find_identifier("m", (A, B), preferred="/r/c")
    assert step_model("m", "/r/a", ["/r/a", "/r/b"]) == "/r/a"
    assert step_model("m", "/r/c", ["/r/b"]) == "/r/b"
    assert step_model("m", "/r/c", ["/r/a", "/r/b"]) is None
    assert step_model("m", "/r/c", []) is None


def test_the_global_map_groups_identifiers_by_name() -> None:
    other = ModelId("/r/a", "n")
    assert by_name([B, other, A]) == {"m": (A, B), "n": (other,)}


def test_a_table_resolves_names_through_its_global_map_only_with_namespacing() -> None:
    table = ModelTable(MappingProxyType({}), True, MappingProxyType(by_name([A, B])))
    assert table.identify("m", "/r/b") == "/r/b::m"
    with pytest.raises(InvalidArgument, match="ambiguity"):
        table.identify("m")
    assert ModelTable().identify("m") == "m"  # without namespacing: the name is the key


def _repos(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    for repo, names in ((a, ("m", "x")), (b, ("m", "y"))):
        for name in names:
            (repo / name / "1").mkdir(parents=True)
            (repo / name / "config.pbtxt").write_text("")
    return a, b


def test_a_scan_keeps_every_copy_and_identifies_them_by_repository(tmp_path: Path) -> None:
    a, b = _repos(tmp_path)
    found = scan((a, b))
    assert set(found.duplicates) == {"m"} and set(found.models) == {"x", "y"}
    assert [loc.repository for loc in found.copies["m"]] == [a, b]
    assert set(found.identified(True)) == {
        ModelId(str(a), "m"), ModelId(str(a), "x"), ModelId(str(b), "m"), ModelId(str(b), "y")}
    assert set(found.identified(False)) == {ModelId("", "x"), ModelId("", "y")}


def test_snapshots_by_identifier_tell_which_repository_changed(tmp_path: Path) -> None:
    a, b = _repos(tmp_path)
    before = snapshot(scan((a, b)), namespacing=True)
    (b / "m" / "1" / "model.py").write_text("changed")
    shutil.rmtree(a / "m")
    changes = diff(before, snapshot(scan((a, b)), namespacing=True))
    assert changes.removed == (ModelId(str(a), "m"),)
    assert changes.changed == (ModelId(str(b), "m"),)
    assert changes.added == ()
    plain = snapshot(scan((a, b)))  # without namespacing: names (m is in b alone now)
    assert set(plain) == {ModelId("", "m"), ModelId("", "x"), ModelId("", "y")}
    shutil.copytree(b / "m", a / "m")  # a duplicate again: left out
    assert set(snapshot(scan((a, b)))) == {ModelId("", "x"), ModelId("", "y")}


def test_the_index_lists_each_repositorys_model_with_its_own_state(tmp_path: Path) -> None:
    a, b = _repos(tmp_path)
    ready = VersionStatus(1, ModelState.READY)
    failed = ModelEntry("m", MappingProxyType({}), "Internal: broken", namespace=str(b))
    entries = {ModelId(str(a), "m"): ModelEntry("m", MappingProxyType({1: ready}),
                                                 namespace=str(a)),
               ModelId(str(b), "m"): failed}
    rows = [row.as_json() for row in repository_index(scan((a, b)), entries, False, True)]
    assert rows == [
        {"name": "m", "version": "1", "state": "READY"}, {"name": "x"},
        {"name": "m", "state": "UNAVAILABLE", "reason": "Internal: broken"}, {"name": "y"}]
    ready_only = repository_index(scan((a, b)), entries, True, True)
    assert [(row.name, row.version) for row in ready_only] == [("m", 1)]
    plain = [row.as_json() for row in repository_index(scan((a, b)), {}, False)]
    assert plain[0] == {"name": "m", "state": "UNAVAILABLE",
                        "reason": "model appears in two or more repositories"}


def test_metrics_label_a_model_of_a_namespace_by_name_and_namespace() -> None:
    """Two models named m, one series each: model="m" with namespace="<repository>" (Triton's
    labels for a model of a namespace), not two series with the same labels."""
    from nursery.observability import metrics
    from nursery.observability.stats import StatsSnapshot
    from nursery.observability.system import SystemSample

    scrape = metrics.Scrape(
        [(A.key, "1", StatsSnapshot()), (B.key, "1", StatsSnapshot()), ("n", "1", StatsSnapshot())],
        SystemSample(), load_durations={(A.key, "1"): 0.5},
        namespaces={A.key: (A.namespace, "m"), B.key: (B.namespace, "m")})
    text = metrics.MetricsEndpoint(metrics.MetricsOptions()).render(scrape).decode()
    success = [line for line in text.splitlines()
               if line.startswith("nv_inference_request_success{")]
    assert success == [
        'nv_inference_request_success{model="m",namespace="/r/a",version="1"} 0',
        'nv_inference_request_success{model="m",namespace="/r/b",version="1"} 0',
        'nv_inference_request_success{model="n",version="1"} 0']
    assert 'nv_model_load_duration_secs{model="m",namespace="/r/a",version="1"} 0.5' in text
