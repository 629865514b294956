import dataclasses
import platform

import pytest
import torch

import tensorforge
from tensorforge.errors import UnsupportedError
from tensorforge.kernels.cpu import avx512
from tensorforge.runtime.environment import ENGINE_FORMAT_VERSION, Environment, compatibility_problems

H200 = Environment(
    format_version=ENGINE_FORMAT_VERSION,
    tensorforge_version="0.1.0",
    torch_version="2.11.0+cu128",
    cuda_version="12.8",
    triton_version="3.5.0",
    device_type="cuda",
    device_name="NVIDIA H200",
    compute_capability=(9, 0),
)


def test_current_cpu_records_this_process():
    env = Environment.current("cpu")
    assert env.format_version == ENGINE_FORMAT_VERSION
    assert env.tensorforge_version == tensorforge.__version__
    assert env.torch_version == torch.__version__
    assert env.cuda_version == torch.version.cuda
    assert env.device_type == "cpu"
    assert env.device_name == f"{platform.machine()} CPU with {avx512.features()}"
    assert env.compute_capability is None
    assert Environment.current(torch.device("cpu")) == env


def test_an_engine_from_a_cpu_with_other_vector_instructions_is_refused(monkeypatch):
    monkeypatch.setattr(avx512, "host_flags", lambda: "flags : fpu sse2 avx avx2 fma")
    here = Environment.current("cpu")
    monkeypatch.setattr(avx512, "host_flags", lambda: "flags : fpu avx2 fma avx512f avx512_bf16 avx512_vnni")
    other = Environment.current("cpu")
    assert here.device_name.endswith("CPU with AVX2")
    assert other.device_name.endswith("CPU with AVX-512, BF16, VNNI")
    assert compatibility_problems(other, here) == [
        f"built on {other.device_name} (cpu), this device is {here.device_name} (cpu)"
    ]


def test_environment_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        H200.device_name = "other"


@pytest.mark.parametrize("env", [H200, Environment.current("cpu")])
def test_dict_round_trip(env):
    data = env.to_dict()
    assert data["compute_capability"] == (None if env.compute_capability is None else list(env.compute_capability))
    assert Environment.from_dict(data) == env


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"device_name": 3}, "device_name"),
        ({"format_version": "1"}, "format_version"),
        ({"format_version": True}, "format_version"),
        ({"cuda_version": 12.8}, "cuda_version"),
        ({"compute_capability": [9]}, "compute_capability"),
        ({"compute_capability": "sm_90"}, "compute_capability"),
        ({"extra": 1}, "unknown fields ['extra']"),
    ],
)
def test_from_dict_rejects_bad_fields(change, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Environment.from_dict({**H200.to_dict(), **change})


def test_from_dict_rejects_missing_fields_and_non_objects():
    data = H200.to_dict()
    del data["torch_version"]
    with pytest.raises(ValueError, match="missing fields \\['torch_version'\\]"):
        Environment.from_dict(data)
    with pytest.raises(ValueError, match="JSON object"):
        Environment.from_dict([1, 2])


def test_identical_environments_are_compatible():
    assert compatibility_problems(H200, dataclasses.replace(H200)) == []


def test_other_gpu_is_one_readable_line():
    a100 = dataclasses.replace(H200, device_name="NVIDIA A100", compute_capability=(8, 0))
    assert compatibility_problems(H200, a100) == ["built on NVIDIA H200 (sm_90), this device is NVIDIA A100 (sm_80)"]


def test_every_difference_is_listed():
    here = Environment(
        format_version=ENGINE_FORMAT_VERSION,
        tensorforge_version="0.2.0",
        torch_version="2.13.0+cpu",
        cuda_version=None,
        triton_version=None,
        device_type="cpu",
        device_name="x86_64 CPU",
        compute_capability=None,
    )
    built = dataclasses.replace(H200, format_version=ENGINE_FORMAT_VERSION + 1)
    assert compatibility_problems(built, here) == [
        f"the engine has format version {ENGINE_FORMAT_VERSION + 1}, "
        f"this tensorforge reads format version {ENGINE_FORMAT_VERSION}",
        "built on NVIDIA H200 (sm_90), this device is x86_64 CPU (cpu)",
        "built with tensorforge 0.1.0, this machine has tensorforge 0.2.0",
        "built with torch 2.11.0+cu128, this machine has torch 2.13.0+cpu",
        "built with CUDA 12.8, this machine has no CUDA",
        "built with triton 3.5.0, this machine has no triton",
    ]


def test_missing_software_reads_as_no():
    here = dataclasses.replace(H200, triton_version=None)
    assert compatibility_problems(H200, here) == ["built with triton 3.5.0, this machine has no triton"]


@pytest.mark.parametrize("device", ["mps", "not-a-device"])
def test_unsupported_device_is_refused(device):
    with pytest.raises(UnsupportedError, match="cpu"):
        Environment.current(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_gpu_is_refused():
    with pytest.raises(UnsupportedError, match="no usable CUDA GPU"):
        Environment.current("cuda")


@pytest.mark.gpu
def test_current_cuda_records_the_gpu():
    env = Environment.current("cuda")
    assert env.device_type == "cuda"
    assert env.device_name == torch.cuda.get_device_name()
    assert env.compute_capability == torch.cuda.get_device_capability()
    assert env.cuda_version == torch.version.cuda
    assert compatibility_problems(env, Environment.current("cuda:0")) == []
    with pytest.raises(UnsupportedError, match="CUDA GPUs"):
        Environment.current(f"cuda:{torch.cuda.device_count()}")
