"""The repository diff (pure) against random repository snapshots, and the JSON config
override parser against the JSON the server prints."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from nursery.config.json_form import config_from_json, config_to_json
from nursery.config.repository import ModelFingerprint, diff, safe_relative_path
from nursery.schema import inference as pb
from tests.property.strategies import message_bytes

names = st.text(alphabet="abcdefg", min_size=1, max_size=3)
fingerprints = st.builds(
    ModelFingerprint,
    st.lists(st.tuples(st.sampled_from(["config.pbtxt", "1/model.onnx", "2/model.onnx"]),
                       st.integers(0, 3), st.integers(0, 3)), max_size=3).map(
        lambda files: tuple(sorted(set(files)))),
)
snapshots = st.dictionaries(names, fingerprints, max_size=6)


@given(snapshots, snapshots)
def test_diff_partitions_the_models(old: dict, new: dict) -> None:
    changes = diff(old, new)
    assert set(changes.added) == set(new) - set(old)
    assert set(changes.removed) == set(old) - set(new)
    assert set(changes.changed) == {n for n in set(old) & set(new) if old[n] != new[n]}
    assert not (set(changes.added) & set(changes.changed))
    # applying the changes to the old view gives the new one
    applied = {n: f for n, f in old.items() if n not in changes.removed}
    applied.update({n: new[n] for n in (*changes.added, *changes.changed)})
    assert applied == new
    assert not diff(new, new)


@given(st.text(alphabet="ab./\\:\0", max_size=12))
def test_safe_paths_never_leave_the_folder(path: str) -> None:
    rel = safe_relative_path(path)
    if rel is not None:
        parts = rel.split("/")
        assert ".." not in parts and "" not in parts and not rel.startswith("/")
        assert "\0" not in rel


@settings(max_examples=150, deadline=None)
@given(message_bytes(pb.ModelConfig))
def test_config_json_round_trip(raw: bytes) -> None:
    config = pb.ModelConfig().parse(raw)
    text = json.dumps(config_to_json(config))
    back = config_from_json(text)
    assert config_to_json(back) == config_to_json(config)
