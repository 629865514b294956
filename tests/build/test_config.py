import pytest

from tensorforge.build.config import BuildConfig, Profile, QuantizationConfig, parse_profile, parse_target
from tensorforge.errors import InputError


def test_profile_accepts_shapes_inside_and_names_those_outside():
    profile = Profile().add("x", (1, 3, 32, 32), (8, 3, 64, 64), (16, 3, 128, 128))
    assert profile.problems({"x": (4, 3, 100, 40)}) == []
    (problem,) = profile.problems({"x": (32, 3, 64, 64)})
    assert (
        "input 'x' has shape [32, 3, 64, 64], outside the profile's min [1, 3, 32, 32] .. max [16, 3, 128, 128]"
        in problem
    )
    assert profile.problems({"x": (1, 3, 64)})  # wrong rank


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((1, 3), (2, 3), (4,)), "same rank"),
        (((4, 3), (2, 3), (8, 3)), "min <= opt <= max"),
        (((-1, 3), (2, 3), (8, 3)), "negative"),
    ],
)
def test_bad_profiles(shapes, message):
    with pytest.raises(InputError, match=message):
        Profile().add("x", *shapes)


def test_parse_profile_from_cli_text():
    profile = parse_profile(["x=1x3x8x8:4x3x8x8:8x3x8x8", "mask=4x16"])
    assert profile.ranges["x"].opt == (4, 3, 8, 8)
    assert profile.ranges["mask"].min == profile.ranges["mask"].max == (4, 16)
    with pytest.raises(InputError, match="min:opt:max"):
        parse_profile(["x=1x3:2x3"])


def test_config_round_trips_through_a_dict():
    config = BuildConfig(
        device="cuda:1",
        precisions=("fp32", "fp16"),
        profiles=(Profile().add("x", (1, 3), (4, 3), (8, 3)),),
        effort=2,
        timing_cache="cache.json",
        tactic_families=("vendor",),
        quantization=QuantizationConfig("calib/", "percentile", 99.9, "calib.json", ("top1", 0.99), ("conv1",)),
        sparsity="force",
    )
    assert BuildConfig.from_dict(config.to_dict()) == config
    older = {k: v for k, v in config.to_dict().items() if k != "sparsity"}  # an engine header of before
    assert BuildConfig.from_dict(older).sparsity == "auto"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "kl"}, "unknown calibration method"),
        ({"method": "entropy", "percentile": 99.0}, "percentile calibration method only"),
        ({"method": "percentile", "percentile": 0.0}, "percentile"),
        ({"target": ("accuracy", 0.9)}, "the metric is one of"),
        ({"target": ("cosine", 1.5)}, "the value in"),
    ],
)
def test_bad_quantization_configs(kwargs, message):
    with pytest.raises(InputError, match=message):
        QuantizationConfig(**kwargs)


def test_accuracy_targets_parse_and_bad_ones_say_how_to_write_them():
    assert parse_target("cosine=0.999") == ("cosine", 0.999)
    with pytest.raises(InputError, match="METRIC=VALUE"):
        parse_target("cosine")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, "unknown device"),
        ({"precisions": ("fp32", "fp64")}, "unknown precision"),
        ({"precisions": ("fp32", "int8", "fp8")}, "one quantized precision"),
        ({"precisions": ("fp16",)}, "fp32 must stay allowed"),
        ({"effort": 7}, "effort"),
        ({"sparsity": "on"}, "sparsity must be one of"),
        ({"workspace_bytes": -1}, "workspace"),
    ],
)
def test_bad_configs(kwargs, message):
    with pytest.raises(InputError, match=message):
        BuildConfig(**kwargs)
