"""The KServe v2 server, talked to as a client would: in-process, and over loopback with many clients."""

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient

from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig, Profile
from tensorforge.frontend import import_model
from tensorforge.serve.app import ServeOptions, create_app
from tensorforge.serve.protocol import HEADER_LENGTH

SHAPE = (64, 16, 16)


@pytest.fixture(scope="module")
def engine():
    profile = Profile().add("input", (1, *SHAPE), (4, *SHAPE), (8, *SHAPE))
    return build_engine(import_model(zoo.export("inception")), BuildConfig(effort=0, profiles=(profile,)))


@pytest.fixture
def client(engine):
    with TestClient(create_app({"inception": engine}, ServeOptions(max_delay_ms=5, max_body_bytes=4 << 20))) as c:
        yield c


def _x(batch, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, *SHAPE)).astype(np.float32)


def _json_request(x, **extra):
    return {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}],
        **extra,
    }


def _direct(engine, x):
    return engine.create_context().run({"input": x})["output"].numpy()


def test_health_and_metadata(client):
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").json() == {"ready": True}
    assert "binary_tensor_data" in client.get("/v2").json()["extensions"]
    meta = client.get("/v2/models/inception").json()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, *SHAPE]}]
    assert meta["parameters"]["max_batch_size"] == 8
    assert client.get("/v2/models/inception/ready").status_code == 200
    assert client.get("/v2/models/nope/ready").status_code == 404


def test_json_inference_matches_a_direct_run(client, engine):
    x = _x(2)
    response = client.post("/v2/models/inception/infer", json=_json_request(x, id="r1"))
    assert response.status_code == 200, response.text
    body = response.json()
    (output,) = body["outputs"]
    assert body["id"] == "r1" and output["name"] == "output" and output["shape"] == [2, 96, 16, 16]
    got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
    want = _direct(engine, x)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_binary_tensors_in_and_out(client, engine):
    x = _x(3, 1)
    header = {
        "inputs": [
            {"name": "input", "datatype": "FP32", "shape": [3, *SHAPE], "parameters": {"binary_data_size": x.nbytes}}
        ],
        "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header).encode()
    response = client.post(
        "/v2/models/inception/infer", content=head + x.tobytes(), headers={HEADER_LENGTH: str(len(head))}
    )
    assert response.status_code == 200, response.text
    split = int(response.headers[HEADER_LENGTH])
    meta = json.loads(response.content[:split])
    (output,) = meta["outputs"]
    got = np.frombuffer(response.content[split:], dtype=np.float32).reshape(output["shape"])
    want = _direct(engine, x)
    assert output["parameters"]["binary_data_size"] == got.nbytes
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def _body(name="input", datatype="FP32", shape=(1,), data=(1.0,)) -> bytes:
    return json.dumps(
        {"inputs": [{"name": name, "datatype": datatype, "shape": list(shape), "data": list(data)}]}
    ).encode()


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (json.dumps({"inputs": []}).encode(), 400, "non-empty"),
        (_body(name="x"), 400, "no input 'x'"),
        (_body(datatype="FP64", shape=(1, 1)), 400, "expects FP32"),
        (_body(shape=(1, 2)), 400, "1 values for shape"),
        (_body(shape=(1, 3, 2, 2), data=[0.5] * 12), 400, "profile"),
        (_body(shape=(9, *SHAPE), data=[0.0] * (9 * 16384)), 400, "1..8"),
        (_body(datatype="WHAT"), 400, "datatype"),
    ],
    ids=["json", "empty", "name", "dtype", "count", "shape", "batch", "datatype"],
)
def test_bad_requests_get_a_4xx_with_a_clear_message(client, body, status, message):
    response = client.post("/v2/models/inception/infer", content=body)
    assert response.status_code == status and message in response.json()["error"], response.text
    assert client.get("/v2/health/live").status_code == 200  # still up


def test_unknown_models_and_oversized_bodies(client):
    assert client.post("/v2/models/nope/infer", json=_json_request(_x(1))).status_code == 404
    big = client.post("/v2/models/inception/infer", content=b" " * (5 << 20))
    assert big.status_code == 413 and "at most" in big.json()["error"]


def test_metrics_count_requests_and_batches(client):
    client.post("/v2/models/inception/infer", json=_json_request(_x(1)))
    text = client.get("/metrics").text
    assert 'tensorforge_requests_total{model="inception",status="200"}' in text
    assert "tensorforge_batch_size_bucket" in text and "tensorforge_queue_depth" in text


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_many_loopback_clients_get_correct_answers_and_shutdown_finishes_in_flight_requests(engine):
    import uvicorn

    port = _free_port()
    app = create_app({"inception": engine}, ServeOptions(max_delay_ms=10, contexts=2))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/v2/models/inception/infer"
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    inputs = [_x(1 + i % 2, i) for i in range(40)]

    def call(x):
        response = httpx.post(url, json=_json_request(x), timeout=60)
        return response.status_code, response.json()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, inputs))
    for x, (status, body) in zip(inputs, results, strict=True):
        assert status == 200
        got = np.asarray(body["outputs"][0]["data"], dtype=np.float32).reshape(body["outputs"][0]["shape"])
        want = _direct(engine, x)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    batcher = app.state.models["inception"].batcher
    assert batcher.stats.completed == 40 and batcher.stats.batches < 40

    # Requests waiting in the queue when the shutdown starts are answered, not dropped.
    batcher.max_delay_s = 1.0
    with ThreadPoolExecutor(8) as pool:
        in_flight = [pool.submit(call, x) for x in inputs[:6]]
        while batcher.stats.requests < 46 and time.time() < deadline + 30:  # all six are in the server
            time.sleep(0.01)
        server.should_exit = True
        finished = [f.result() for f in in_flight]
    thread.join(30)
    assert [status for status, _ in finished] == [200] * 6
    assert not thread.is_alive() and batcher.stats.completed == 46


def test_one_server_serves_several_models(engine):
    other = build_engine(import_model(zoo.export("transformer")), BuildConfig(effort=0))
    with TestClient(create_app({"inception": engine, "encoder": other})) as client:
        assert client.get("/v2/models/encoder").json()["inputs"][0]["shape"] == [-1, 16, 64]
        x = np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16, 64], "data": x.ravel().tolist()}]}
        response = client.post("/v2/models/encoder/infer", json=body)
        assert response.status_code == 200, response.text
        got = np.asarray(response.json()["outputs"][0]["data"], dtype=np.float32).reshape(1, 16, 64)
        want = other.create_context().run({"input": x})["output"].numpy()
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        assert client.post("/v2/models/inception/infer", json=_json_request(_x(1))).status_code == 200
