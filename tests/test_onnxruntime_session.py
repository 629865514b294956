"""ONNX Runtime sessions beside an engine: the providers chosen for a device, and clear errors."""

import onnx
import pytest
from onnx import helper

from tensorforge.errors import ModelLoadError, UnsupportedError
from tensorforge.onnxruntime_session import CPU, CUDA, open_session, providers_for, runtime
from tests.helpers import make_model, tensor_info

AVAILABLE = runtime().get_available_providers()


def test_the_cpu_runs_on_the_cpu_provider_alone():
    providers = providers_for("cpu")
    assert providers.chosen == ((CPU, {}),) and providers.note is None and providers.device == "cpu"
    assert providers_for("cuda:1", "cpu").chosen == ((CPU, {}),)


@pytest.mark.skipif(CUDA in AVAILABLE, reason="this ONNX Runtime has its CUDA provider")
def test_a_cuda_device_without_the_cuda_provider_falls_back_to_the_cpu_and_says_so():
    providers = providers_for("cuda:1")
    assert providers.chosen == ((CPU, {}),) and providers.device == "cpu"
    assert "has no CUDAExecutionProvider" in providers.note and "onnxruntime-gpu" in providers.note
    with pytest.raises(UnsupportedError, match="has no CUDAExecutionProvider .* choose one of those"):
        providers_for("cuda:1", "cuda")  # asked for by name: no fallback


@pytest.mark.skipif(CUDA not in AVAILABLE, reason="needs ONNX Runtime's CUDA provider")
def test_a_cuda_device_gets_the_cuda_provider_on_its_index_with_the_cpu_behind():
    providers = providers_for("cuda:1")
    assert providers.chosen == ((CUDA, {"device_id": 1}), (CPU, {})) and providers.device == "cuda:1"


def test_an_unknown_provider_names_the_ones_there_are():
    with pytest.raises(UnsupportedError, match="has no NoSuchExecutionProvider"):
        providers_for("cpu", "NoSuchExecutionProvider")


def test_sessions_open_on_files_and_protos_with_clear_errors(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    proto = make_model([node], [tensor_info("x", [2])], [tensor_info("y", [2])])
    path = tmp_path / "relu.onnx"
    onnx.save(proto, path)
    for model in (proto, path):
        session = open_session(model, providers_for("cpu"))
        assert [i.name for i in session.get_inputs()] == ["x"]
    with pytest.raises(ModelLoadError, match="does not exist"):
        open_session(tmp_path / "missing.onnx", providers_for("cpu"))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"ONNX Runtime could not load '.*garbage.onnx' on CPUExecutionProvider"):
        open_session(garbage, providers_for("cpu"))
