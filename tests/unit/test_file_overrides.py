"""``file:`` override keys: Triton's JoinPath + weakly_canonical, and the folder fence."""

from __future__ import annotations

from pathlib import Path

import pytest

from nursery.config.repository import (
    check_model_name,
    override_relative_path,
    scan,
    write_override,
)
from nursery.errors import InternalError


@pytest.mark.parametrize(("key", "expected"), [
    ("1/model.onnx", "1/model.onnx"),
    ("/1/model.onnx", "1/model.onnx"),  # JoinPath joins a leading slash, it is not absolute
    ("//1//model.onnx", "1/model.onnx"),
    ("./1/./model.onnx", "1/model.onnx"),
    ("/2/../1/model.onnx", "1/model.onnx"),  # '..' that stays inside is normalised away
    ("/etc/passwd", "etc/passwd"),
    ("a\\b", "a\\b"),  # a backslash is a file name character on Linux, as for Triton
])
def test_keys_inside_the_folder(key: str, expected: str) -> None:
    assert override_relative_path(key) == expected


@pytest.mark.parametrize("key", ["", "/", ".", "..", "/../x", "1/../../x", "a/../../b",
                                 "1/\0/x"])
def test_keys_that_leave_the_folder(key: str) -> None:
    assert override_relative_path(key) is None


def test_write_override_keeps_files_inside(tmp_path: Path) -> None:
    location = write_override(tmp_path, "m", {"/1/model.onnx": b"a", "/etc/x": b"b"})
    assert (location.path / "1" / "model.onnx").read_bytes() == b"a"
    assert (location.path / "etc" / "x").read_bytes() == b"b"
    with pytest.raises(InternalError, match="must stay within model directory"):
        write_override(tmp_path, "m", {"/../escape": b"c"})
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("name", ["model", "model\\test", "model;test", "a b", "TestModel123",
                                  # Triton's L0_mlflow deploys these
                                  "...", "..my_model", "model..1", ".hidden"])
def test_model_names_that_are_one_folder(name: str) -> None:
    assert check_model_name(name) is None


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\0b", "../x"])
def test_model_names_that_are_not(name: str) -> None:
    assert check_model_name(name) is not None


def test_a_hidden_folder_is_a_model_as_in_triton(tmp_path: Path) -> None:
    """Triton's repository lists every folder but ``.`` and ``..``: its L0_mlflow deploys
    models named ``...`` and ``..my_model``; a file at the top is no model."""
    for name in ("...", "..my_model", ".hidden", "plain"):
        (tmp_path / name / "1").mkdir(parents=True)
    (tmp_path / ".file").write_text("not a folder")
    assert set(scan([tmp_path]).models) == {"...", "..my_model", ".hidden", "plain"}
