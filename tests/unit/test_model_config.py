"""Reading, completing, normalizing and validating model configurations."""

from __future__ import annotations

from pathlib import Path

import pytest

from nursery.backends.base import get_factory
from nursery.config.json_form import ConfigJsonError, config_from_json, config_to_json
from nursery.config.model import read_model_config
from nursery.config.versions import available_versions
from nursery.errors import ConfigError
from nursery.schema import inference as pb
from tests.conftest import make_models


def _write(repo: Path, name: str, config: str | None, model: bool = True,
           versions: tuple[int, ...] = (1,)) -> Path:
    folder = repo / name
    for v in versions:
        (folder / str(v)).mkdir(parents=True, exist_ok=True)
        if model:
            import onnx

            onnx.save_model(make_models.build_add_sub(), str(folder / str(v) / "model.onnx"))
    if config is not None:
        (folder / "config.pbtxt").write_text(config)
    return folder


def test_add_sub_normalized_like_triton(tmp_path: Path) -> None:
    folder = make_models.write_add_sub(tmp_path, max_batch_size=8)
    config, versions = read_model_config(folder, "add_sub", backends=get_factory)
    assert versions == [1]
    assert config.backend == "onnxruntime" and config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8
    assert [t.name for t in config.inputs] == ["INPUT0", "INPUT1"]
    assert config.inputs[0].dims == (16,)
    assert config.scheduler == "default"
    js = config_to_json(config.proto)
    assert js["version_policy"] == {"latest": {"num_versions": 1}}
    assert js["instance_group"][0]["name"] == "add_sub_0"
    assert js["optimization"] == {
        "priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True},
        "output_pinned_memory": {"enable": True}, "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    }
    assert "model_transaction_policy" not in js  # Triton prints it only when configured


def test_missing_config_is_auto_completed(tmp_path: Path) -> None:
    folder = _write(tmp_path, "m", None)
    config, _ = read_model_config(folder, "m", backends=get_factory)
    assert config.name == "m"
    assert config.max_batch_size == 4
    assert config.scheduler == "dynamic"
    assert [(t.name, t.datatype.value, t.dims) for t in config.inputs] == [
        ("INPUT0", "FP32", (16,)), ("INPUT1", "FP32", (16,))]
    js = config_to_json(config.proto)
    assert js["dynamic_batching"]["preferred_batch_size"] == [4]
    assert js["instance_group"] == [{
        "name": "m", "kind": "KIND_CPU", "count": 2, "gpus": [], "secondary_devices": [],
        "profile": [], "passive": False, "host_policy": ""}]


def test_partial_config_completed(tmp_path: Path) -> None:
    folder = _write(tmp_path, "m", 'backend: "onnxruntime"\nmax_batch_size: 2\n')
    config, _ = read_model_config(folder, "m", backends=get_factory)
    assert config.max_batch_size == 2
    assert len(config.outputs) == 2


def test_auto_complete_disabled_requires_config(tmp_path: Path) -> None:
    folder = _write(tmp_path, "m", None)
    with pytest.raises(ConfigError, match="config.pbtxt is missing and auto-complete is disabled"
                       ) as caught:
        read_model_config(folder, "m", backends=get_factory, auto_complete=False)
    # Triton's words first (L0_lifecycle greps them)
    assert str(caught.value).startswith(
        f"failed to open text file for read {folder / 'config.pbtxt'}: No such file or directory")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('name: "other"', "'name' is 'other' but the model folder is 'm'"),
        ("max_batch_size: -1\ninput [{name: 'INPUT0' data_type: TYPE_FP32 dims: [16]}]",
         "'max_batch_size' must be non-negative value for m"),
        ("max_batch_size: 8\ninput [{name: 'INPUT0' dims: [16]}, {name: 'INPUT1' "
         "data_type: TYPE_FP32 dims: [16]}]\noutput [{name: 'OUTPUT0' data_type: TYPE_FP32 "
         "dims: [16]}]", "model input 'INPUT0' must specify 'data_type' for m"),
        ("max_batch_size: 8\ninput [{name: 'INPUT0' data_type: TYPE_FP32}, {name: 'INPUT1' "
         "data_type: TYPE_FP32 dims: [16]}]\noutput [{name: 'OUTPUT0' data_type: TYPE_FP32 "
         "dims: [16]}]", "model input 'INPUT0' must specify 'dims' for m"),
        ("max_batch_size: 8\ninput [{name: 'INPUT0' data_type: TYPE_FP32 dims: [0]}, "
         "{name: 'INPUT1' data_type: TYPE_FP32 dims: [16]}]\noutput [{name: 'OUTPUT0' "
         "data_type: TYPE_FP32 dims: [16]}]", "model input 'INPUT0' dimension must be integer >= 1, "
         "or -1 to indicate a variable-size dimension for m"),
        ("max_batch_size: 8 maxbatch: 3", "config.pbtxt:1:19: unknown field 'maxbatch'"),
        # Triton still finds the backend from the model file, then refuses the pair
        ('platform: "caffe2_netdef"',
         "unexpected 'platform' and 'backend' pair, got:caffe2_netdef, onnxruntime"),
        ('backend: "nope"', "backend 'nope' is not available"),
        ("version_policy { specific { versions: [7] } }", "no version to serve"),
        ("max_batch_size: 8\ninstance_group [{ kind: KIND_CPU gpus: [0] }]",
         "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
        ("max_batch_size: 4\ndynamic_batching { preferred_batch_size: [8] }",
         "dynamic batching preferred size must be <= max batch size for m"),
        ("max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 3 }",
         "default priority level must be in range [1, 2] for m"),
        ("max_batch_size: 4\ndynamic_batching { priority_levels: 2 default_priority_level: 1 "
         "priority_queue_policy { key: 5 value: { max_queue_size: 1 } } }",
         "priority queue policy must have priority level in range [1, 2] for m"),
        ("max_batch_size: 4\ndynamic_batching { preserve_ordering: true priority_levels: 2 "
         "default_priority_level: 1 }",
         "Only one priority level is allowed when 'preserve_ordering' is true for m"),
        ("max_batch_size: 4\ndynamic_batching { preserve_ordering: true default_queue_policy { "
         "timeout_action: DELAY default_timeout_microseconds: 10 } }",
         "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true"),
        ("max_batch_size: 4\nsequence_batching { control_input [{name: 'S' control [{kind: "
         "CONTROL_SEQUENCE_START}]}] }",
         "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
         "'bool_false_true' for CONTROL_SEQUENCE_START for m"),
        ("max_batch_size: 4\nsequence_batching { control_input [{name: 'S' control [{kind: "
         "CONTROL_SEQUENCE_END int32_false_true: [0, 1] fp32_false_true: [0, 1]}]}] }",
         "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
         "and 'bool_false_true' for CONTROL_SEQUENCE_END for m"),
        ("max_batch_size: 4\nsequence_batching { control_input [{name: 'S' control [{kind: "
         "CONTROL_SEQUENCE_READY int32_false_true: [1]}]}] }",
         "sequence batching control 'int32_false_true' must have exactly 2 entries for "
         "CONTROL_SEQUENCE_READY for m"),
        ("max_batch_size: 4\nsequence_batching { control_input [{name: 'S' control [{kind: "
         "CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]}, {name: 'T' control [{kind: "
         "CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]}] }",
         "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
        ("max_batch_size: 4\nsequence_batching { control_input [{name: 'S' control [{kind: "
         "CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]}, {name: 'S' control [{kind: "
         "CONTROL_SEQUENCE_END int32_false_true: [0, 1]}]}] }",
         "sequence batching control tensor 'S' is specified for multiple control kinds for m"),
        ("max_batch_size: 4\nsequence_batching { control_input [{name: 'C' control [{kind: "
         "CONTROL_SEQUENCE_CORRID int32_false_true: [0, 1]}]}] }",
         "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
         "'bool_false_true' for CONTROL_SEQUENCE_CORRID for m"),
        ("max_batch_size: 4\nsequence_batching { control_input [{name: 'C' control [{kind: "
         "CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32}]}] }",
         "unexpected control data type, expected TYPE_UINT64, TYPE_INT64, TYPE_UINT32, "
         "TYPE_INT32, or TYPE_STRING for CONTROL_SEQUENCE_CORRID for m"),
        ("max_batch_size: 4\nsequence_batching { state [{input_name: 'IS' output_name: 'OS' "
         "data_type: TYPE_FP32}] }",
         "sequence batching state 'IS' must specify 'dims'"),
        ("max_batch_size: 4\nsequence_batching { state [{input_name: 'IS' output_name: 'OS' "
         "data_type: TYPE_FP32 dims: [2] initial_state [{data_type: TYPE_FP32 dims: [2] "
         "data_file: 'missing'}]}] }",
         "failed to read initial state data file"),
        ("input [{name: 'X' data_type: TYPE_FP32 dims: [16]}, {name: 'X' data_type: "
         "TYPE_FP32 dims: [16]}]\noutput [{name: 'OUTPUT0' data_type: TYPE_FP32 dims: [16]}]",
         "input 'X' is specified more than once"),
    ],
)
def test_bad_configs_name_model_file_and_field(tmp_path: Path, config: str, message: str) -> None:
    folder = _write(tmp_path, "m", config)
    with pytest.raises(ConfigError) as err:
        read_model_config(folder, "m", backends=get_factory)
    assert "model 'm'" in str(err.value)
    assert message in str(err.value)


def test_string_states_start_empty_or_from_length_prefixed_data(tmp_path: Path) -> None:
    state = ("max_batch_size: 4\nsequence_batching {{ state [{{input_name: 'IS' "
             "output_name: 'OS' data_type: TYPE_STRING dims: [2] {init}}}] }}")
    config, _ = read_model_config(_write(tmp_path, "m", state.format(init="")), "m",
                                  backends=get_factory)
    assert config.sequence is not None
    assert config.sequence.states[0].initial.tolist() == [b"", b""]  # Triton's zero
    folder = _write(tmp_path, "n", state.format(
        init="initial_state [{data_type: TYPE_STRING dims: [2] data_file: 'words'}]"))
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "words").write_bytes(b"\x02\0\0\0hi\x00\0\0\0")
    config, _ = read_model_config(folder, "n", backends=get_factory)
    assert config.sequence is not None
    assert config.sequence.states[0].initial.tolist() == [b"hi", b""]
    (folder / "initial_state" / "words").write_bytes(b"\x09\0\0\0hi\0\0\0\0")  # past its end
    with pytest.raises(ConfigError, match="element 0 declares 9 bytes but only 6 remain"):
        read_model_config(folder, "n", backends=get_factory)


def test_non_utf8_config(tmp_path: Path) -> None:
    folder = _write(tmp_path, "m", None)
    (folder / "config.pbtxt").write_bytes(b"name: \xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_model_config(folder, "m", backends=get_factory)


def test_no_model_file(tmp_path: Path) -> None:
    folder = _write(tmp_path, "m", "max_batch_size: 2", model=False)
    with pytest.raises(ConfigError, match="no version folder holds a known model file"):
        read_model_config(folder, "m", backends=get_factory)


def test_version_policies(tmp_path: Path) -> None:
    base = "platform: 'onnxruntime_onnx'\nmax_batch_size: 2\n"
    folder = _write(tmp_path, "a", base, versions=(1, 2, 10))
    assert read_model_config(folder, "a", backends=get_factory)[1] == [10]
    (folder / "config.pbtxt").write_text(base + "version_policy { all {} }")
    assert read_model_config(folder, "a", backends=get_factory)[1] == [1, 2, 10]
    (folder / "config.pbtxt").write_text(base + "version_policy { latest { num_versions: 2 } }")
    assert read_model_config(folder, "a", backends=get_factory)[1] == [2, 10]
    (folder / "config.pbtxt").write_text(base + "version_policy { specific { versions: [1, 5] } }")
    assert read_model_config(folder, "a", backends=get_factory)[1] == [1]


def test_model_not_batchable_with_max_batch_size(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    make_models.write_model(tmp_path, "m", make_models.build_identity("FP32", [2, 3]),
                            "max_batch_size: 4")
    with pytest.raises(ConfigError, match="model does not support batching"):
        read_model_config(folder, "m", backends=get_factory)


def test_config_inputs_checked_against_model_at_load(tmp_path: Path) -> None:
    from nursery.backends.onnxruntime import FACTORY
    from nursery.runtime.devices import InstancePlacement

    folder = _write(tmp_path, "m", (
        "max_batch_size: 8\n"
        "input [{name: 'INPUT0' data_type: TYPE_FP32 dims: [16]}, {name: 'WRONG' "
        "data_type: TYPE_FP32 dims: [16]}]\n"
        "output [{name: 'OUTPUT0' data_type: TYPE_FP32 dims: [16]}]"))
    config, _ = read_model_config(folder, "m", backends=get_factory)
    with pytest.raises(ConfigError, match="unexpected inference input 'WRONG', allowed inputs "
                                          "are: INPUT0, INPUT1"):
        FACTORY.load(config, folder / "1", InstancePlacement("m_0", 0, "cpu", 0))


def test_a_config_without_outputs_is_the_backends_business(tmp_path: Path) -> None:
    # Triton's core accepts a model with no outputs (its identity backend loads one); the
    # PyTorch backend refuses it itself (tests/unit/test_pytorch_backend.py)
    folder = tmp_path / "quiet"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (folder / "config.pbtxt").write_text(
        'backend: "python"\ninput [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }]\n')
    config, _ = read_model_config(folder, "quiet", backends=get_factory)
    assert config.outputs == () and [s.name for s in config.inputs] == ["IN"]


@pytest.mark.parametrize(("max_batch_size", "slots"), [(4, 4), (0, 1)])
def test_oldest_without_candidate_count_takes_a_batch_of_them(
        tmp_path: Path, max_batch_size: int, slots: int) -> None:
    # Triton's default for max_candidate_sequences (0 or absent): max_batch_size, at least 1
    # (its L0_config_json sets only oldest's max_queue_delay_microseconds)
    folder = _write(tmp_path, "m", f"max_batch_size: {max_batch_size}\n"
                    'backend: "onnxruntime"\n'
                    'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }]\n'
                    'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }]\n'
                    "sequence_batching { oldest { max_queue_delay_microseconds: 987 } }")
    config, _ = read_model_config(folder, "m", backends=get_factory, auto_complete=False)
    assert config.sequence is not None
    schedule = config.sequence.schedule
    assert (schedule.strategy, schedule.slots_per_instance) == ("oldest", slots)
    assert schedule.max_queue_delay_us == 987


def test_config_json_takes_bare_keys_as_protobufs_parser_does() -> None:
    # Triton's config override goes through protobuf's JSON parser, which takes an unquoted
    # key; its L0_iterative_sequence sends `direct: {...}`. Strings keep their bytes.
    from nursery.config.json_form import ConfigJsonError, config_from_json

    config = config_from_json(
        '{"name": "m", "parameters": {"k": {"string_value": "a, b: {c"}}, '
        'sequence_batching: {"iterative_sequence": true, direct: '
        '{"max_queue_delay_microseconds": 10000000}}}')
    assert config.sequence_batching.iterative_sequence
    assert config.sequence_batching.direct.max_queue_delay_microseconds == 10_000_000
    assert config.parameters["k"].string_value == "a, b: {c"
    for bad in ('{name: }', '{"name": "m",}', "{'name': 'm'}", b'{\xff: 1}'):
        with pytest.raises(ConfigJsonError, match="failed to parse the config JSON"):
            config_from_json(bad)


def test_folders_that_are_not_versions_are_ignored_with_triton_s_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "m"
    for name in ("1", "003", "0", "x1", "warmup", "7"):
        (folder / name).mkdir(parents=True)
    assert available_versions(folder) == [0, 1, 7]
    assert not caplog.records  # a tool's reading says nothing
    assert available_versions(folder, warn=True) == [0, 1, 7]
    assert [r.getMessage() for r in caplog.records] == [
        "ignore version directory '003' which contains leading zeros in its directory name",
        "ignore version directory 'x1' which fails to convert to integral number"]


_AOTI_IO = ('max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')


@pytest.mark.parametrize(("given", "platform", "filename"), [
    ('platform: "torch_aoti"\n', "torch_aoti", "model.pt2"),  # Triton's way to name one
    ('backend: "pytorch"\nplatform: "torch_aoti"\n', "torch_aoti", "model.pt2"),
    ("", "torch_aoti", "model.pt2"),  # a version folder holding model.pt2 alone
    ('platform: "torch_aoti"\ndefault_model_filename: "m.pt2"\n', "torch_aoti", "m.pt2"),
])
def test_an_aoti_package_is_triton_s_torch_aoti_platform(tmp_path: Path, given: str,
                                                          platform: str, filename: str) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / filename).write_bytes(b"PK")
    (folder / "config.pbtxt").write_text(given + _AOTI_IO)
    config, versions = read_model_config(folder, "m", backends=get_factory, auto_complete=False)
    assert (config.backend, config.platform, config.default_model_filename, versions) == (
        "pytorch", platform, filename, [1])


def test_torch_aoti_on_another_backend_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('platform: "torch_aoti"\nbackend: "onnxruntime"\n'
                                         + _AOTI_IO)
    with pytest.raises(ConfigError, match="unexpected 'platform' and 'backend' pair, "
                       "got:torch_aoti, onnxruntime"):
        read_model_config(folder, "m", backends=get_factory, auto_complete=False)


def test_one_value_where_an_array_belongs_is_an_array_of_one() -> None:
    """Triton reads a load request's JSON configuration with protobuf's C++ reader, which
    takes an object (or scalar) for a repeated field as a one-element array
    (L0_lifecycle's instance load cases send `"instance_group": {...}`)."""
    config = config_from_json('{"instance_group": {"kind": "KIND_CPU", "count": 3}, '
                              '"input": {"name": "x", "data_type": "TYPE_FP32", "dims": 4}}')
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (3, pb.ModelInstanceGroupKind.KIND_CPU)]
    assert config.input[0].dims == [4]
    with pytest.raises(ConfigJsonError, match="instance_group.0.: expected an object"):
        config_from_json('{"instance_group": true}')
