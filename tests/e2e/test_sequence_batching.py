"""The sequence batcher end to end with tritonclient (HTTP, gRPC, gRPC stream): interleaved
sequences whose running sums never mix (implicit state kept by the server), the backlog,
control tensors, the idle timeout and Triton's errors."""

from __future__ import annotations

import queue
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess, make_models, running_server

pytestmark = pytest.mark.e2e

OLDEST = ("oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] "
          "max_queue_delay_microseconds: 2000 }")


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    make_models.write_sequence_accumulator(repo, "acc_direct", instance_count=2)
    make_models.write_sequence_accumulator(repo, "acc_oldest", strategy=OLDEST)
    # neither direct nor oldest, as Triton's simple_sequence example: the direct strategy
    make_models.write_sequence_accumulator(repo, "acc_default", strategy="")
    make_models.write_sequence_accumulator(repo, "acc_idle", idle_us=300_000)
    make_models.write_sequence_accumulator(repo, "acc_nobatch", max_batch_size=0,
                                           datatype="FP32", instance_count=2)
    folder = make_models.write_sequence_accumulator(repo, "acc_init",
                                                    initial='data_file: "hundred"')
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "hundred").write_bytes(np.array([100], np.int32).tobytes())
    make_models.write_sequence_controls(repo, "controls_u64")
    make_models.write_sequence_controls(repo, "controls_str", corrid="BYTES")
    make_models.write_sequence_controls(repo, "controls_i32", corrid="INT32")
    _write_ensemble(repo, "ens_controls", "controls_u64")
    make_models.write_sequence_accumulator(repo, "acc_pad", max_batch_size=4)
    # TYPE_STRING states (Triton's L0_sequence_batcher `object` models with IMPLICIT_STATE=1)
    make_models.write_sequence_accumulator(repo, "acc_str", datatype="BYTES", max_batch_size=4)
    greeted = make_models.write_sequence_accumulator(repo, "acc_str_init", datatype="BYTES",
                                                     initial='data_file: "greeting"')
    (greeted / "initial_state").mkdir()
    (greeted / "initial_state" / "greeting").write_bytes(len(b"hi:").to_bytes(4, "little")
                                                         + b"hi:")
    # a variable-size state with no initial_state: zeros, its -1 dims 1 (Triton's core)
    var = make_models.write_sequence_accumulator(repo, "acc_var")
    text = (var / "config.pbtxt").read_text()
    text = text.replace("dims: [ 1 ] initial_state: { data_type: TYPE_INT32 dims: [ 1 ] "
                        'name: "init" zero_data: true }', "dims: [ -1 ]")
    (var / "config.pbtxt").write_text(text)
    # the state listed as an output as well (as Triton's L0_implicit_state `_output` models):
    # a client may ask for it
    listed = make_models.write_sequence_accumulator(repo, "acc_state_out")
    with open(listed / "config.pbtxt", "a") as f:
        f.write('output [{ name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }]\n')
    with running_server(repo, tmp_path_factory=tmp_path_factory) as proc:
        yield proc


def _write_ensemble(repo: Path, name: str, step: str) -> None:
    """A one-step ensemble over the control-echo model ``step``."""
    names = ("OUTPUT", "START_OUT", "END_OUT", "READY_OUT", "CORRID_OUT")
    types = ("TYPE_INT32",) * 4 + ("TYPE_UINT64",)
    maps = "".join(f'  output_map {{ key: "{o}" value: "{o}" }}\n' for o in names)
    decl = ",\n".join(f'  {{ name: "{o}" data_type: {t} dims: [ 1 ] }}'
                       for o, t in zip(names, types, strict=True))
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        f"output [\n{decl}\n]\n"
        f'ensemble_scheduling {{ step [ {{\n  model_name: "{step}" model_version: -1\n'
        f'  input_map {{ key: "INPUT" value: "INPUT" }}\n{maps}}} ] }}\n')


def _http_input(value: int) -> httpclient.InferInput:
    i = httpclient.InferInput("INPUT", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return i


def _grpc_input(value: int) -> grpcclient.InferInput:
    i = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return i


def _values(seq: int, steps: int) -> list[int]:
    return [seq * 1000 + k for k in range(steps)]


def _run_sequences(url: str, model: str, ids: list[int | str], steps: int) -> dict:
    """One thread per sequence, each sending its requests in order, the sequences' first
    requests at once (a barrier: starts of several sequences queue together however fast the
    server answers; only the first, since a sequence in a model's backlog waits for others to
    end); the running sums seen."""
    seen: dict = {}
    errors: list[BaseException] = []
    together = threading.Barrier(len(ids))

    def one(n: int, sid: int | str) -> None:
        client = httpclient.InferenceServerClient(url)
        try:
            out = []
            for k, v in enumerate(_values(n, steps)):
                if k == 0:
                    together.wait(timeout=30)
                r = client.infer(model, [_http_input(v)], sequence_id=sid,
                                 sequence_start=k == 0, sequence_end=k == steps - 1)
                out.append(int(r.as_numpy("OUTPUT")[0, 0]))
            seen[sid] = out
        except BaseException as exc:  # reported below
            together.abort()  # the others stop waiting for this one
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=one, args=(n, sid)) for n, sid in enumerate(ids, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return seen


@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest", "acc_default"])
def test_interleaved_sequences_never_mix(seq_server: ServerProcess, model: str) -> None:
    """12 sequences at once (acc_oldest has 4 slots: 8 wait in the backlog, then take the
    slots as sequences end), uint64 and string IDs: each sees exactly its own running sum,
    and requests of different sequences shared executions."""
    client = httpclient.InferenceServerClient(seq_server.url)
    before = client.get_inference_statistics(model)["model_stats"][0]
    ids: list[int | str] = [*range(101, 107), *(f"session-{i}" for i in range(6))]
    steps = 6
    seen = _run_sequences(seq_server.url, model, ids, steps)
    for n, sid in enumerate(ids, 1):
        assert seen[sid] == list(np.cumsum(_values(n, steps))), sid
    after = client.get_inference_statistics(model)["model_stats"][0]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == len(ids) * steps
    assert executions < inferences  # rows of several sequences ran together
    client.close()


def test_grpc_unary_and_stream(seq_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{seq_server.grpc_port}")
    for k in range(3):  # unary, two interleaved sequences
        for sid, base in ((7, 1), (8, 10)):
            r = client.infer("acc_direct", [_grpc_input(base)], sequence_id=sid,
                             sequence_start=k == 0, sequence_end=k == 2)
            assert int(r.as_numpy("OUTPUT")[0, 0]) == base * (k + 1)
    # a stream carrying five sequences interleaved, sent without waiting for answers: the
    # server queues them in the order the stream carries them
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    steps = 4
    sids: list[int | str] = [21, 22, "s-23", 24, "s-25"]
    for k in range(steps):
        for n, sid in enumerate(sids, 1):
            client.async_stream_infer("acc_oldest", [_grpc_input(n)], sequence_id=sid,
                                      sequence_start=k == 0, sequence_end=k == steps - 1,
                                      request_id=f"{n}:{k}")
    answers = {}
    for _ in range(steps * len(sids)):
        result, error = results.get(timeout=30)
        assert error is None, error
        answers[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
    client.stop_stream()
    for n in range(1, len(sids) + 1):
        assert [answers[f"{n}:{k}"] for k in range(steps)] == [n * (k + 1) for k in range(steps)]
    client.close()


def test_non_batching_model_and_config(seq_server: ServerProcess) -> None:
    """max_batch_size 0: no batch dimension on inputs, controls or state; two instances."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{seq_server.grpc_port}")
    for k in range(3):
        for sid, value in ((1, 0.5), (2, 2.0)):
            i = grpcclient.InferInput("INPUT", [1], "FP32")
            i.set_data_from_numpy(np.array([value], dtype=np.float32))
            r = client.infer("acc_nobatch", [i], sequence_id=sid, sequence_start=k == 0,
                             sequence_end=k == 2)
            assert r.as_numpy("OUTPUT").tolist() == [value * (k + 1)]
    config = client.get_model_config("acc_nobatch", as_json=True)["config"]
    seq = config["sequence_batching"]
    assert seq["max_sequence_idle_microseconds"] == "5000000"
    assert seq["state"][0]["input_name"] == "INPUT_STATE"
    assert seq["state"][0]["initial_state"][0]["zero_data"] is True
    client.close()


def test_initial_state_from_data_file(seq_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    out = [int(client.infer("acc_init", [_http_input(1)], sequence_id=5, sequence_start=k == 0,
                            sequence_end=k == 2).as_numpy("OUTPUT")[0, 0]) for k in range(3)]
    assert out == [101, 102, 103]
    # START again: fresh state, not what the last sequence left
    r = client.infer("acc_init", [_http_input(1)], sequence_id=5, sequence_start=True,
                     sequence_end=True)
    assert int(r.as_numpy("OUTPUT")[0, 0]) == 101
    client.close()


def test_a_variable_size_state_starts_at_zero(seq_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    config = client.get_model_config("acc_var")["sequence_batching"]["state"][0]
    assert config["dims"] == [-1] and not config.get("initial_state")
    out = [int(client.infer("acc_var", [_http_input(4)], sequence_id=11,
                            sequence_start=k == 0, sequence_end=k == 2).as_numpy("OUTPUT")[0, 0])
           for k in range(3)]
    assert out == [4, 8, 12]
    client.close()


def _text(value: str) -> httpclient.InferInput:
    i = httpclient.InferInput("INPUT", [1, 1], "BYTES")
    i.set_data_from_numpy(np.array([[value.encode()]], dtype=object))
    return i


def test_string_states_join_each_sequence_apart(seq_server: ServerProcess) -> None:
    """A TYPE_STRING state starts as empty strings (Triton's zero for strings) or from a data
    file of length-prefixed strings, and two interleaved sequences keep their own."""
    client = httpclient.InferenceServerClient(seq_server.url, concurrency=2)
    seen: dict[int, list[bytes]] = {1: [], 2: []}
    for k, letters in enumerate(("ax", "by", "cz")):
        for sid, letter in zip((1, 2), letters, strict=True):
            r = client.infer("acc_str", [_text(letter)], sequence_id=sid,
                             sequence_start=k == 0, sequence_end=k == 2)
            seen[sid].append(r.as_numpy("OUTPUT")[0, 0])
    assert seen == {1: [b"a", b"ab", b"abc"], 2: [b"x", b"xy", b"xyz"]}
    out = [client.infer("acc_str_init", [_text(c)], sequence_id=3, sequence_start=k == 0,
                        sequence_end=k == 1).as_numpy("OUTPUT")[0, 0]
           for k, c in enumerate("ok")]
    assert out == [b"hi:o", b"hi:ok"]
    client.close()


def test_a_state_listed_as_an_output_can_be_asked_for(seq_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    wanted = [httpclient.InferRequestedOutput("OUTPUT_STATE"),
              httpclient.InferRequestedOutput("OUTPUT")]
    for k in range(3):
        r = client.infer("acc_state_out", [_http_input(2)], outputs=wanted, sequence_id=8,
                         sequence_start=k == 0, sequence_end=k == 2)
        assert r.as_numpy("OUTPUT_STATE").tolist() == [[2 * (k + 1)]]
        assert r.as_numpy("OUTPUT").tolist() == [[2 * (k + 1)]]
    r = client.infer("acc_state_out", [_http_input(5)], sequence_id=8, sequence_start=True,
                     sequence_end=True)  # nothing asked for: every output, the state's too
    assert r.as_numpy("OUTPUT_STATE").tolist() == [[5]]
    with pytest.raises(InferenceServerException,
                       match="unexpected inference output 'OUTPUT_STATE' for model 'acc_direct'"):
        client.infer("acc_direct", [_http_input(1)], sequence_id=9, sequence_start=True,
                     sequence_end=True, outputs=[httpclient.InferRequestedOutput("OUTPUT_STATE")])
    client.close()


def _controls(r: httpclient.InferResult) -> tuple:
    return tuple(r.as_numpy(n)[0, 0] for n in ("START_OUT", "END_OUT", "READY_OUT", "CORRID_OUT"))


def test_control_tensors(seq_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    big = 2**63 + 5
    assert _controls(client.infer("controls_u64", [_http_input(1)], sequence_id=big,
                                  sequence_start=True)) == (1, 0, 1, big)
    assert _controls(client.infer("controls_u64", [_http_input(1)],
                                  sequence_id=big)) == (0, 0, 1, big)
    assert _controls(client.infer("controls_u64", [_http_input(1)], sequence_id=big,
                                  sequence_end=True)) == (0, 1, 1, big)
    assert _controls(client.infer("controls_str", [_http_input(1)], sequence_id="abc",
                                  sequence_start=True, sequence_end=True)) == (1, 1, 1, b"abc")
    # a 32-bit CORRID carries the low-order 32 bits, as in Triton
    low = _controls(client.infer("controls_i32", [_http_input(1)], sequence_id=2**32 + 9,
                                 sequence_start=True, sequence_end=True))
    assert low == (1, 1, 1, 9)
    client.close()


def test_ensemble_step_carries_the_sequence(seq_server: ServerProcess) -> None:
    """An ensemble request's correlation ID and START/END flags reach its sequence step (as
    Triton's ensemble scheduler gives them to every step request), over HTTP and gRPC."""
    client = httpclient.InferenceServerClient(seq_server.url)
    sid = 2**40 + 3
    assert _controls(client.infer("ens_controls", [_http_input(1)], sequence_id=sid,
                                  sequence_start=True)) == (1, 0, 1, sid)
    assert _controls(client.infer("ens_controls", [_http_input(1)],
                                  sequence_id=sid)) == (0, 0, 1, sid)
    gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{seq_server.grpc_port}")
    r = gclient.infer("ens_controls", [_grpc_input(1)], sequence_id=sid, sequence_end=True)
    assert tuple(r.as_numpy(n)[0, 0] for n in ("START_OUT", "END_OUT", "READY_OUT",
                                               "CORRID_OUT")) == (0, 1, 1, sid)
    # without a correlation ID the step refuses it, in the ensemble's words; the ensemble
    # counts a failure, not an execution (Triton counts executions on success only), and
    # counts it twice, as Triton's ensemble does (its error answer, then its tracker's end)
    before = client.get_inference_statistics("ens_controls")["model_stats"][0]
    assert before["execution_count"] == 3
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        client.infer("ens_controls", [_http_input(1)])
    after = client.get_inference_statistics("ens_controls")["model_stats"][0]
    assert after["execution_count"] == 3
    assert after["inference_count"] == 3
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"][
        "count"] + 2
    with urllib.request.urlopen(f"http://127.0.0.1:{seq_server.metrics_port}/metrics") as r:
        metrics = r.read().decode()
    assert ('nv_inference_request_failure{model="ens_controls",reason="OTHER",version="1"} '
            f'{after["inference_stats"]["fail"]["count"]}') in metrics
    assert after["inference_stats"]["success"]["count"] == 3
    client.close()
    gclient.close()


def test_padding_rows_count_in_batch_statistics(seq_server: ServerProcess) -> None:
    """A direct batch runs one row per slot up to the highest slot with a request; the empty
    slots below it are padding rows (Triton's null requests). Triton's batch statistics
    count them (the executed batch size), its inference count does not."""
    client = httpclient.InferenceServerClient(seq_server.url)

    def step(sid: int, value: int, **flags: bool) -> int:
        r = client.infer("acc_pad", [_http_input(value)], sequence_id=sid, **flags)
        return int(r.as_numpy("OUTPUT")[0, 0])

    assert step(51, 1, sequence_start=True) == 1  # slot 0, alone: one row
    assert step(52, 10, sequence_start=True) == 10  # slot 1: rows [padding, 52]
    assert step(52, 10) == 20  # again
    assert step(51, 1, sequence_end=True) == 2  # slot 0: one row
    assert step(52, 10, sequence_end=True) == 30  # rows [padding, 52]
    stats = client.get_inference_statistics("acc_pad")["model_stats"][0]
    assert stats["execution_count"] == 5
    assert stats["inference_count"] == 5
    assert sorted((b["batch_size"], b["compute_infer"]["count"])
                  for b in stats["batch_stats"]) == [(1, 2), (2, 3)]
    client.close()


def test_idle_sequence_is_released(seq_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    assert int(client.infer("acc_idle", [_http_input(4)], sequence_id=31,
                            sequence_start=True).as_numpy("OUTPUT")[0, 0]) == 4
    time.sleep(0.8)  # max_sequence_idle_microseconds is 300000
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc_idle", [_http_input(4)], sequence_id=31)
    assert "must specify the START flag on the first request of the sequence" in str(info.value)
    r = client.infer("acc_idle", [_http_input(4)], sequence_id=31, sequence_start=True)
    assert int(r.as_numpy("OUTPUT")[0, 0]) == 4  # a new sequence starts from fresh state
    client.close()


def test_errors_are_tritons(seq_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(seq_server.url)
    gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{seq_server.grpc_port}")
    cases = [
        ({}, "inference request to model 'acc_direct' must specify a non-zero or non-empty "
             "correlation ID"),
        ({"sequence_id": 404}, "inference request for sequence 404 to model 'acc_direct' must "
                               "specify the START flag on the first request of the sequence"),
        ({"sequence_id": "nope"}, "inference request for sequence nope to model 'acc_direct' "
                                  "must specify the START flag on the first request of the "
                                  "sequence"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InferenceServerException) as info:
            client.infer("acc_direct", [_http_input(1)], **kwargs)
        assert info.value.message() == message
        assert info.value.status() == "400"
        with pytest.raises(InferenceServerException) as ginfo:
            gclient.infer("acc_direct", [_grpc_input(1)], **kwargs)
        assert ginfo.value.message() == message
        assert ginfo.value.status() == "StatusCode.INVALID_ARGUMENT"
    # after END the ID is free: continuing it is an error, starting it again works
    client.infer("acc_direct", [_http_input(1)], sequence_id=405, sequence_start=True,
                 sequence_end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("acc_direct", [_http_input(1)], sequence_id=405)
    # a correlation ID whose type the CORRID control does not take (Triton's request check,
    # before the sequence batcher's: a request without an ID has the integer ID 0)
    for model, kwargs, given, expected in (
            ("controls_u64", {"sequence_id": "x", "sequence_start": True}, "BYTES", "UINT64"),
            ("controls_i32", {"sequence_id": "x"}, "BYTES", "INT32"),
            ("controls_str", {"sequence_id": 7, "sequence_start": True}, "UINT64", "BYTES"),
            ("controls_str", {}, "UINT64", "BYTES")):
        message = (f"[request id: <id_unknown>] sequence batching control 'CORRID' data-type "
                   f"is '{given}', but model '{model}' expects '{expected}'")
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [_http_input(1)], **kwargs)
        assert (info.value.message(), info.value.status()) == (message, "400")
        with pytest.raises(InferenceServerException) as ginfo:
            gclient.infer(model, [_grpc_input(1)], **kwargs)
        assert ginfo.value.message() == message
    # an integer ID suits any integer control, a string ID a string one
    for model, sid in (("controls_i32", 5), ("controls_str", "five")):
        client.infer(model, [_http_input(1)], sequence_id=sid, sequence_start=True,
                     sequence_end=True)
    # more than one row per request
    two = httpclient.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc_direct", [two], sequence_id=9, sequence_start=True)
    assert info.value.message() == ("inference request to model 'acc_direct' must specify "
                                    "batch-size 1 due to requirements of sequence batcher")
    # malformed parameters
    with pytest.raises(InferenceServerException, match="Unable to parse 'sequence_id'"):
        client.infer("acc_direct", [_http_input(1)], sequence_id=-3)  # type: ignore[arg-type]
    # the server still serves
    r = client.infer("acc_direct", [_http_input(2)], sequence_id=406, sequence_start=True,
                     sequence_end=True)
    assert int(r.as_numpy("OUTPUT")[0, 0]) == 2
    client.close()
    gclient.close()


def test_bad_sequence_config_is_refused(tmp_path: Path) -> None:
    """A model whose sequence_batching is wrong fails to load with Triton's message; the
    server serves its other models."""
    make_models.write_sequence_accumulator(tmp_path, "good")
    folder = make_models.write_sequence_controls(tmp_path, "bad")
    config = (folder / "config.pbtxt").read_text()
    (folder / "config.pbtxt").write_text(config.replace("int32_false_true: [ 0, 1 ] } ] },\n",
                                                        "} ] },\n", 1))
    proc = ServerProcess(tmp_path, "--exit-on-error", "false", "--strict-readiness", "false",
                         log_path=tmp_path / "server.log")
    try:
        proc.wait_ready()
        client = httpclient.InferenceServerClient(proc.url)
        assert client.is_model_ready("good")
        assert not client.is_model_ready("bad")
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert ("sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                "'bool_false_true' for CONTROL_SEQUENCE_START for bad") in index["bad"]["reason"]
        client.close()
    finally:
        proc.stop()
