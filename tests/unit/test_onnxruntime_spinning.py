"""nursery's ONNX Runtime defaults of its own: no intra-op spinning for a model whose
dynamic batcher waits between batches, spinning intra-op threads at the lowest priority
(``nursery/backends/onnxruntime.py``'s docstring has the measurements), and ONNX Runtime's
defaults everywhere else or where the config says."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from nursery.backends.base import get_factory
from nursery.backends.onnxruntime import SPINNING, _session_options, spinning_default
from nursery.config.model import read_model_config
from tests.conftest import make_models

_BASE = ('name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
         'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [16] }]\n'
         'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] }]\n')
_SPIN_ON = f'parameters {{ key: "{SPINNING}" value: {{ string_value: "1" }} }}\n'


@pytest.mark.parametrize(("extra", "expected"), [
    ("dynamic_batching { max_queue_delay_microseconds: 1000 }\n", {SPINNING: "0"}),
    ("dynamic_batching { }\n", {}),  # no delay: calls come back to back
    ("", {}),
    ("dynamic_batching { max_queue_delay_microseconds: 1000 }\n" + _SPIN_ON, {}),
])
def test_spinning_is_off_only_where_the_batcher_waits(tmp_path: Path, extra: str,
                                                       expected: dict[str, str]) -> None:
    make_models.write_model(tmp_path, "m", make_models.build_identity("FP32", ["batch", 16]),
                            _BASE + extra)
    config, _ = read_model_config(tmp_path / "m", "m", backends=get_factory)
    assert spinning_default(config) == expected
    options = _session_options({**spinning_default(config), **config.parameters}, 0, "m")
    want = expected.get(SPINNING, config.parameters.get(SPINNING))
    try:
        entry: str | None = options.get_session_config_entry(SPINNING)
    except RuntimeError:  # onnxruntime's answer for a key never set
        entry = None
    assert entry == want


def test_memory_options_apply_and_log_in_tritons_words(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Triton's L0_onnx_optimization: its ORT backend's memory parameters and their lines
    import logging

    import numpy as np

    from nursery.backends.onnxruntime import FACTORY
    from nursery.runtime.devices import InstancePlacement

    params = {"enable_mem_arena": "1", "enable_mem_pattern": "1",
              "session.use_device_allocator_for_initializers": "1",
              "memory.enable_memory_arena_shrinkage": "cpu:0"}
    extra = "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
                    for k, v in params.items())
    make_models.write_model(tmp_path, "m", make_models.build_identity("FP32", ["batch", 16]),
                            _BASE + extra)
    config, _ = read_model_config(tmp_path / "m", "m", backends=get_factory)
    with caplog.at_level(logging.DEBUG, logger="nursery.backends.onnxruntime"):
        instance = FACTORY.load(config, tmp_path / "m" / "1",
                                InstancePlacement("m_0", 0, "cpu", 0))
    try:
        x = np.ones((2, 16), np.float32)
        np.testing.assert_array_equal(instance.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x)
    finally:
        instance.close()
    logged = [r.getMessage() for r in caplog.records]
    for line in ("Configuring enable_mem_arena to 1", "Configuring enable_mem_pattern to 1",
                 "Configuring 'session.use_device_allocator_for_initializers' to '1' for 'm'",
                 "Configuring memory.enable_memory_arena_shrinkage to cpu:0"):
        assert line in logged, logged


def _thread_nices() -> dict[int, int]:
    nices = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                nices[int(tid)] = int(f.read().rsplit(")", 1)[1].split()[16])
        except FileNotFoundError:  # ended meanwhile
            pass
    return nices


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
@pytest.mark.parametrize(("extra", "want"), [
    ("", 19),  # spinning (ONNX Runtime's default): its threads yield to every other
    ("dynamic_batching { max_queue_delay_microseconds: 1000 }\n", 0),  # not spinning
    ('parameters { key: "intra_op_thread_nice" value: { string_value: "7" } }\n', 7),
    ('parameters { key: "intra_op_thread_nice" value: { string_value: "0" } }\n', 0),
])
def test_spinning_intra_op_threads_run_at_the_lowest_priority(
        tmp_path: Path, extra: str, want: int) -> None:
    import numpy as np

    from nursery.backends.onnxruntime import FACTORY
    from nursery.runtime.devices import InstancePlacement

    threads = 'parameters { key: "intra_op_thread_count" value: { string_value: "3" } }\n'
    make_models.write_model(tmp_path, "m", make_models.build_identity("FP32", ["batch", 16]),
                            _BASE + threads + extra)
    config, _ = read_model_config(tmp_path / "m", "m", backends=get_factory)
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    before = _thread_nices()
    instance = FACTORY.load(config, tmp_path / "m" / "1", InstancePlacement("m_0", 0, "cpu", 0))
    try:
        pool = {tid: nice for tid, nice in _thread_nices().items() if tid not in before}
        assert len(pool) >= 2, pool  # three intra-op threads: the caller and two of ORT's
        assert set(pool.values()) == {max(want, own)}
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
        x = np.ones((2, 16), np.float32)
        np.testing.assert_array_equal(instance.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"], x)
    finally:
        instance.close()


@pytest.mark.parametrize("value", ["-1", "20", "low"])
def test_intra_op_thread_nice_out_of_range_fails_the_model(value: str) -> None:
    from nursery.backends.onnxruntime import pool_nice
    from nursery.errors import ConfigError

    with pytest.raises(ConfigError, match="'intra_op_thread_nice' must be an integer from 0 to 19"):
        pool_nice({"intra_op_thread_nice": value}, "m")
