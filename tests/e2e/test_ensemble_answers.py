"""What an ensemble answer holds, as Triton's L0_simple_ensemble checks it. An output its step's
model did not produce is left out of the answer, and at
--log-verbose=1 the server says so in Triton's words (L0_simple_ensemble's
test_ensemble_partial_add_sub reads that line)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
'''

IO = '''input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
'''


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "half" / "1").mkdir(parents=True)
    (repo / "half" / "1" / "model.py").write_text(MODEL)
    (repo / "half" / "config.pbtxt").write_text('name: "half"\nbackend: "python"\n' + IO)
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(
        'name: "ens"\nplatform: "ensemble"\n' + IO
        + 'ensemble_scheduling { step [ { model_name: "half" model_version: -1 '
        'input_map { key: "INPUT0" value: "INPUT0" } '
        'output_map { key: "OUTPUT0" value: "OUTPUT0" } '
        'output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }\n')
    return repo


def test_absent_ensemble_output_is_left_out_and_logged(tmp_path, start_server):
    import tritonclient.grpc as grpcclient

    server = start_server(_repo(tmp_path), "--log-verbose=1")
    message = "Composing models did not output tensor OUTPUT1"
    assert message not in server.log()
    x = np.arange(4, dtype=np.int32)
    inp = grpcclient.InferInput("INPUT0", [4], "INT32")
    inp.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        result = client.infer("ens", [inp], outputs=[grpcclient.InferRequestedOutput("OUTPUT0"),
                                                   grpcclient.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    assert result.as_numpy("OUTPUT1") is None
    assert message in server.log()


def test_ensemble_answers_of_a_sequence_carry_its_id_and_flags(tmp_path, start_server):
    """L0_simple_ensemble's test_ensemble_sequence_flags: each answer of an ensemble to a
    request of a sequence carries sequence_id, sequence_start and sequence_end."""
    import queue

    import tritonclient.grpc as grpcclient

    server = start_server(_repo(tmp_path))
    answers: queue.Queue = queue.Queue()
    x = np.arange(4, dtype=np.int32)
    inp = grpcclient.InferInput("INPUT0", [4], "INT32")
    inp.set_data_from_numpy(x)
    flags = [(True, False), (False, False), (False, True)]
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(lambda result, error: answers.put((result, error)))
        for n, (start, end) in enumerate(flags):
            client.async_stream_infer("ens", [inp], request_id=str(n), sequence_id=42,
                                      sequence_start=start, sequence_end=end)
        got = {}
        for _ in flags:
            result, error = answers.get(timeout=60)
            assert error is None
            response = result.get_response()
            params = response.parameters
            got[response.id] = (params["sequence_id"].int64_param,
                                params["sequence_start"].bool_param,
                                params["sequence_end"].bool_param)
        client.stop_stream()
    assert got == {str(n): (42, start, end) for n, (start, end) in enumerate(flags)}
    # a request outside any sequence gets no such parameters
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        plain = client.infer("ens", [inp]).get_response()
    assert "sequence_id" not in plain.parameters


BATCHING = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            assert x.shape == (1, 1), x.shape  # the batch dim the ensemble added
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
'''


def test_a_non_batching_ensemble_feeds_a_batching_step(tmp_path, start_server):
    """Triton's ReshapeTensorDims: an ensemble with max_batch_size 0 and dims [1] feeding a
    model with max_batch_size 1 and dims [1] (L0_simple_ensemble's backpressure models): the
    step gets [1, 1], the answer is [1] again; max_inflight_requests is logged as Triton does."""
    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    (repo / "double" / "1").mkdir(parents=True)
    (repo / "double" / "1" / "model.py").write_text(BATCHING)
    (repo / "double" / "config.pbtxt").write_text(
        'name: "double"\nbackend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(
        'name: "ens"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling { max_inflight_requests: 2 step [ { model_name: "double" '
        'model_version: -1 input_map { key: "IN" value: "X" } '
        'output_map { key: "OUT" value: "Y" } } ] }\n')
    server = start_server(repo)
    x = np.array([3.0], dtype=np.float32)
    inp = grpcclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        for _ in range(3):
            result = client.infer("ens", [inp])
            np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
    assert "Ensemble model 'ens' configured with max_inflight_requests: 2" in server.log()


def test_a_streams_ensemble_answers_keep_its_order_through_batched_steps(tmp_path, start_server):
    """Three requests on one gRPC stream through an ensemble whose first step batches them
    (its answers come in one batch) and whose second step runs one request at a time on one
    instance: the second step's requests are queued where the first step's answers are
    delivered (``CallbackFlow``), in the order they came, so the stream's answers keep its
    order trial after trial, however trio orders the tasks those answers would wake."""
    import queue

    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    io = ('input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
          'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    for name, extra in (("batched", "dynamic_batching { max_queue_delay_microseconds: 20000 }\n"),
                        ("single", "")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n' + io + extra)
    (repo / "chain" / "1").mkdir(parents=True)
    steps = ", ".join(
        f'{{ model_name: "{m}" model_version: -1 input_map {{ key: "INPUT0" value: "{a}" }} '
        f'output_map {{ key: "OUTPUT0" value: "{b}" }} }}'
        for m, a, b in (("batched", "X", "T"), ("single", "T", "Y")))
    (repo / "chain" / "config.pbtxt").write_text(
        'name: "chain"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        f'ensemble_scheduling {{ step [ {steps} ] }}\n')
    server = start_server(repo)
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(lambda result, error: answers.put((result, error)))
        for trial in range(12):
            for n in range(4):
                x = np.full((1, 4), 10 * trial + n, dtype=np.int32)
                inp = grpcclient.InferInput("X", [1, 4], "INT32")
                inp.set_data_from_numpy(x)
                client.async_stream_infer("chain", [inp], request_id=f"{trial}-{n}")
            got = []
            for _ in range(4):
                result, error = answers.get(timeout=60)
                assert error is None, error
                got.append(result.get_response().id)
                assert result.as_numpy("Y")[0, 0] == 10 * trial + int(got[-1][-1])
            assert got == [f"{trial}-{n}" for n in range(4)], got
        client.stop_stream()


def test_ensemble_outputs_classify_with_the_labels_triton_finds(tmp_path, start_server):
    """Triton's L0_infer class and label tests: an ensemble's output asked for as classes
    (class_count) comes back as the top classes, labelled by the ensemble's own
    label_filename when it names one, else by the step model that produced it, through
    nested ensembles too."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    repo = _repo(tmp_path)
    (repo / "half" / "labels.txt").write_text("".join(f"step{i}\n" for i in range(4)))
    config = (repo / "half" / "config.pbtxt").read_text()
    (repo / "half" / "config.pbtxt").write_text(config.replace(
        'name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }',
        'name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] label_filename: "labels.txt" }'))

    def ensemble(name: str, step: str, labels: bool) -> None:
        (repo / name / "1").mkdir(parents=True)
        out = 'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ]'
        if labels:
            (repo / name / "own.txt").write_text("".join(f"own{i}\n" for i in range(4)))
            out += ' label_filename: "own.txt"'
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "ensemble"\n'
            'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n' + out + " } ]\n"
            f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
            'input_map { key: "INPUT0" value: "INPUT0" } '
            'output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n')

    ensemble("outer", "ens", labels=False)  # nested: the labels come from half
    ensemble("relabel", "ens", labels=True)  # its own labels win
    server = start_server(repo)
    x = np.array([5, 9, 1, 7], dtype=np.int32)
    expected = {"ens": [b"9:1:step1", b"7:3:step3"], "outer": [b"9:1:step1", b"7:3:step3"],
                "relabel": [b"9:1:own1", b"7:3:own3"]}
    inp = grpcclient.InferInput("INPUT0", [4], "INT32")
    inp.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        for model, classes in expected.items():
            result = client.infer(model, [inp], outputs=[
                grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
            assert result.as_numpy("OUTPUT0").tolist() == classes, model
    hinp = httpclient.InferInput("INPUT0", [4], "INT32")
    hinp.set_data_from_numpy(x)
    with httpclient.InferenceServerClient(server.url) as client:
        result = client.infer("outer", [hinp], outputs=[
            httpclient.InferRequestedOutput("OUTPUT0", class_count=3)])
        assert result.as_numpy("OUTPUT0").tolist() == [b"9:1:step1", b"7:3:step3",
                                                        b"5:0:step0"]


PRODUCER = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().item())
            sender = request.get_response_sender()
            for i in range(n):
                time.sleep(0.02)
                out = pb_utils.Tensor("OUT", np.array([[float(i)]], np.float32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

SLOW = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(DELAY)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
'''


def test_a_full_step_holds_back_only_its_own_requests(tmp_path, start_server):
    """L0_simple_ensemble's backpressure pipeline: a decoupled producer sends its parts fast,
    a slow step behind it may have max_inflight_requests (2) in flight, a quick step follows.
    While the slow step is full, the producer's further parts wait for it, but the parts the
    slow step answered go on through the quick step at once: the first answer reaches the
    client after about one slow step, not after the producer's backlog (Triton blocks the
    response that would issue the full step, not the ensemble's other answers)."""
    import queue
    import time

    import tritonclient.grpc as grpcclient

    repo = tmp_path / "repo"
    io = ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
          'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    (repo / "producer" / "1").mkdir(parents=True)
    (repo / "producer" / "1" / "model.py").write_text(PRODUCER)
    (repo / "producer" / "config.pbtxt").write_text(
        'name: "producer"\nbackend: "python"\nmax_batch_size: 2\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'model_transaction_policy { decoupled: true }\n')
    for name, delay in (("slow", 0.4), ("quick", 0.01)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(SLOW.replace("DELAY", str(delay)))
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 2\n' + io)
    steps = ", ".join(
        f'{{ model_name: "{m}" model_version: -1 input_map {{ key: "{i}" value: "{a}" }} '
        f'output_map {{ key: "{o}" value: "{b}" }} }}'
        for m, i, o, a, b in (("producer", "IN", "OUT", "IN", "P"),
                              ("slow", "INPUT0", "OUTPUT0", "P", "S"),
                              ("quick", "INPUT0", "OUTPUT0", "S", "OUT")))
    (repo / "pipe" / "1").mkdir(parents=True)
    (repo / "pipe" / "config.pbtxt").write_text(
        'name: "pipe"\nplatform: "ensemble"\nmax_batch_size: 2\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'ensemble_scheduling {{ max_inflight_requests: 2 step [ {steps} ] }}\n')
    server = start_server(repo)
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}") as client:
        client.start_stream(lambda result, error: answers.put((time.monotonic(), result, error)))
        inp = grpcclient.InferInput("IN", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[10]], np.int32))
        sent = time.monotonic()
        client.async_stream_infer("pipe", [inp])
        got = [answers.get(timeout=60) for _ in range(10)]
        client.stop_stream()
    assert all(error is None for _, _, error in got), got
    assert sorted(float(r.as_numpy("OUT").item()) for _, r, _ in got) == [
        float(i) for i in range(10)]
    first, last = got[0][0] - sent, got[-1][0] - sent
    assert last > 3.0  # ten slow steps, one at a time
    assert first < 2.0, (first, last)  # before: after about eight of them (3.2 s)


def test_ensemble_input_and_output_reshape(tmp_path, start_server):
    """L0_infer_reshape's `simple_reshape_*` ensembles: an ensemble input with a `reshape`
    reaches its steps in that shape (Triton normalizes the request first), and an ensemble
    output with a `reshape` is answered in its dims again, the batch dim kept; a variable dim
    carries its value across."""
    import tritonclient.http as httpclient

    from tests.conftest import make_models

    repo = tmp_path / "repo"
    for name, dims in (("fixed", [4, 2]), ("variable", [-1])):
        make_models.write_model(
            repo, name, make_models.build_identity("FP32", ["batch", "n"] if -1 in dims
                                                    else ["batch", 4, 2]),
            make_models.config_text(name, [("INPUT0", "FP32", dims)],
                                    [("OUTPUT0", "FP32", dims)], 8))
    for ens, step, dims, reshape in (("ens_fixed", "fixed", "8", "4, 2"),
                                     ("ens_variable", "variable", "1, -1", "-1")):
        (repo / ens / "1").mkdir(parents=True)
        (repo / ens / "config.pbtxt").write_text(
            f'name: "{ens}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
            f'input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ {dims} ] '
            f'reshape: {{ shape: [ {reshape} ] }} }} ]\n'
            f'output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ {dims} ] '
            f'reshape: {{ shape: [ {reshape} ] }} }} ]\n'
            f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
            'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } '
            '} ] }\n')
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url)
    for ens, shape in (("ens_fixed", (1, 8)), ("ens_fixed", (3, 8)), ("ens_variable", (1, 1, 3)),
                       ("ens_variable", (2, 1, 5))):
        x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        inp = httpclient.InferInput("IN", list(shape), "FP32")
        inp.set_data_from_numpy(x)
        got = client.infer(ens, [inp]).as_numpy("OUT")
        assert got.shape == shape, (ens, got.shape)
        np.testing.assert_array_equal(got, x)
    client.close()


def test_python_output_with_a_reshape_is_answered_in_its_dims(tmp_path, start_server):
    """A Python model makes an output that has a `reshape` in the reshape's shape; the answer
    reports it in the output's dims, as Triton's response does (L0_infer_reshape's
    `nop_tunnel_in` steps, on the identity stand-in, hand [batch, 8] on to the next step)."""
    import tritonclient.http as httpclient

    repo = tmp_path / "repo"
    (repo / "tunnel" / "1").mkdir(parents=True)
    (repo / "tunnel" / "1" / "model.py").write_text(MODEL)
    (repo / "tunnel" / "config.pbtxt").write_text(
        'name: "tunnel"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4, 2 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 8 ] '
        'reshape: { shape: [ 4, 2 ] } } ]\n')
    # and an input with a reshape reaches the Python model in the reshape's shape (Triton
    # normalizes the request first): it answers what it got, [batch, 8]
    (repo / "tunnel_in" / "1").mkdir(parents=True)
    (repo / "tunnel_in" / "1" / "model.py").write_text(MODEL)
    (repo / "tunnel_in" / "config.pbtxt").write_text(
        'name: "tunnel_in"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4, 2 ] '
        'reshape: { shape: [ 8 ] } } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 8 ] } ]\n')
    server = start_server(repo)
    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(16, dtype=np.int32).reshape(2, 4, 2)
    for model in ("tunnel", "tunnel_in"):
        inp = httpclient.InferInput("INPUT0", [2, 4, 2], "INT32")
        inp.set_data_from_numpy(x)
        got = client.infer(model, [inp]).as_numpy("OUTPUT0")
        assert got.shape == (2, 8), model
        np.testing.assert_array_equal(got, x.reshape(2, 8))
    client.close()
