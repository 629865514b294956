"""`tensorforge serve` as a process: it answers on loopback and a SIGTERM shuts it down cleanly."""

import json
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np

from tensorforge import zoo
from tensorforge.build.builder import build_engine
from tensorforge.build.config import BuildConfig
from tensorforge.frontend import import_model


def test_serve_answers_and_stops_on_sigterm(tmp_path):
    path = tmp_path / "inception.engine"
    build_engine(import_model(zoo.export("inception")), BuildConfig(effort=0)).save(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "tensorforge.cli.main", "serve", f"net={path}", "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{base}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        x = np.random.default_rng(0).standard_normal((1, 64, 16, 16)).astype(np.float32)
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64, 16, 16], "data": x.ravel().tolist()}]}
        response = httpx.post(f"{base}/v2/models/net/infer", content=json.dumps(body), timeout=60)
        assert response.status_code == 200, response.text + ((process.poll() and process.communicate()[0]) or "")
        assert response.json()["outputs"][0]["shape"] == [1, 96, 16, 16]
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal so the exit status reports it
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "serving net" in output and "Traceback" not in output
