"""Reproducible test models in plain `torch.nn`, and their ONNX export.

The architectures follow the published ones (torchvision's ResNet-50 and MobileNetV3-Large, an
Inception-v1 block, a pre-norm transformer encoder), with weights drawn from a fixed seed. `export` also
randomizes every BatchNorm's running statistics and affine parameters, so folding BN into a convolution is
not the identity and an error in it shows. Input sizes are a parameter: small images keep CPU tests fast.

    >>> proto = export("resnet50", size=64)      # onnx.ModelProto, input "input" [batch, 3, 64, 64]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx
import torch
from torch import nn

from .frontend.torch_import import DEFAULT_OPSET, export_onnx

SEED = 20260101


# -- ResNet-50 ---------------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck: 1×1 → 3×3 (carries the stride) → 1×1, plus the shortcut."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """ResNet-50 as in torchvision: stem, Bottleneck stages [3, 4, 6, 3], global pool, classifier."""

    layers = (3, 4, 6, 3)

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, in_channels = [], 64
        for index, blocks in enumerate(self.layers):
            width = 64 * 2**index
            stage = []
            for block in range(blocks):
                stride = 2 if index > 0 and block == 0 else 1
                stage.append(Bottleneck(in_channels, width, stride))
                in_channels = width * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# -- MobileNetV3-Large -------------------------------------------------------------------------------------


def _make_divisible(value: float, divisor: int = 8) -> int:
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class Relu6HardSigmoid(nn.Module):
    """The paper's h-sigmoid, ReLU6(x + 3) / 6, written out (exports as Add, Clip, Div)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.relu6(x + 3.0) / 6.0


class Relu6HardSwish(nn.Module):
    """The paper's h-swish, x · ReLU6(x + 3) / 6, written out (exports as Add, Clip, Mul, Div)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * nn.functional.relu6(x + 3.0) / 6.0


@dataclass(frozen=True)
class _Hard:
    """Which modules implement h-swish and h-sigmoid: the ONNX ops, or the paper's ReLU6 formulas."""

    swish: Callable[[], nn.Module]
    sigmoid: Callable[[], nn.Module]


_HARD_OPS = _Hard(nn.Hardswish, nn.Hardsigmoid)
_HARD_RELU6 = _Hard(Relu6HardSwish, Relu6HardSigmoid)


class SqueezeExcite(nn.Module):
    """x · h-sigmoid(W₂ · ReLU(W₁ · avgpool(x))), with 1×1 convolutions for W₁, W₂ as in torchvision."""

    def __init__(self, channels: int, hard: _Hard) -> None:
        super().__init__()
        squeeze = _make_divisible(channels // 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = hard.sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.relu(self.fc1(self.pool(x)))))


def _conv_bn(in_channels: int, out_channels: int, kernel: int, stride: int, groups: int, act: nn.Module | None):
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
    ]
    if act is not None:
        layers.append(act)
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """MobileNetV3 bneck: 1×1 expand → depthwise k×k → optional SE → 1×1 project, residual when shapes allow."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, hs: bool, stride: int, hard: _Hard):
        super().__init__()
        self.use_residual = stride == 1 and cin == cout

        def act() -> nn.Module:
            return hard.swish() if hs else nn.ReLU(inplace=True)

        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(_conv_bn(cin, expanded, 1, 1, 1, act()))
        layers.append(_conv_bn(expanded, expanded, kernel, stride, expanded, act()))
        if se:
            layers.append(SqueezeExcite(expanded, hard))
        layers.append(_conv_bn(expanded, cout, 1, 1, 1, None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_residual else out


class MobileNetV3Large(nn.Module):
    """MobileNetV3-Large (Howard et al. 2019, table 1), laid out as torchvision's `mobilenet_v3_large`."""

    # input channels, kernel, expanded channels, output channels, squeeze-excite, h-swish, stride
    config = (
        (16, 3, 16, 16, False, False, 1),
        (16, 3, 64, 24, False, False, 2),
        (24, 3, 72, 24, False, False, 1),
        (24, 5, 72, 40, True, False, 2),
        (40, 5, 120, 40, True, False, 1),
        (40, 5, 120, 40, True, False, 1),
        (40, 3, 240, 80, False, True, 2),
        (80, 3, 200, 80, False, True, 1),
        (80, 3, 184, 80, False, True, 1),
        (80, 3, 184, 80, False, True, 1),
        (80, 3, 480, 112, True, True, 1),
        (112, 3, 672, 112, True, True, 1),
        (112, 5, 672, 160, True, True, 2),
        (160, 5, 960, 160, True, True, 1),
        (160, 5, 960, 160, True, True, 1),
    )

    def __init__(self, num_classes: int = 1000, relu6_formulas: bool = False) -> None:
        super().__init__()
        hard = _HARD_RELU6 if relu6_formulas else _HARD_OPS
        layers: list[nn.Module] = [_conv_bn(3, 16, 3, 2, 1, hard.swish())]
        layers += [InvertedResidual(*row, hard=hard) for row in self.config]
        layers.append(_conv_bn(160, 960, 1, 1, 1, hard.swish()))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(960, 1280), hard.swish(), nn.Dropout(0.2), nn.Linear(1280, num_classes)
        )
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# -- Inception block ---------------------------------------------------------------------------------------


class BasicConv(nn.Module):
    """Conv (no bias) → BatchNorm → ReLU, torchvision's `BasicConv2d`."""

    def __init__(self, cin: int, cout: int, kernel: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class InceptionBlock(nn.Module):
    """Inception-v1 module: 1×1, 1×1→3×3, 1×1→5×5 and 3×3 max-pool→1×1 branches, concatenated on channels.

    The three 1×1 convolutions reading the block input are the candidates for merging parallel layers.
    """

    def __init__(self, cin: int = 64, c1: int = 32, c3: tuple = (24, 32), c5: tuple = (8, 16), pool: int = 16):
        super().__init__()
        self.branch1 = BasicConv(cin, c1, 1)
        self.branch3 = nn.Sequential(BasicConv(cin, c3[0], 1), BasicConv(c3[0], c3[1], 3))
        self.branch5 = nn.Sequential(BasicConv(cin, c5[0], 1), BasicConv(c5[0], c5[1], 5))
        self.branch_pool = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), BasicConv(cin, pool, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = (self.branch1, self.branch3, self.branch5, self.branch_pool)
        return torch.cat([branch(x) for branch in branches], 1)


# -- Transformer encoder -----------------------------------------------------------------------------------


class SelfAttention(nn.Module):
    """softmax(Q·Kᵀ/√d_head)·V per head, with separate Q/K/V projections and explicit reshapes."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / self.head_dim**0.5
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(context.transpose(1, 2).reshape(batch, seq, dim))


class EncoderLayer(nn.Module):
    """Pre-norm encoder layer: x + Attn(LN(x)), then x + W₂·GELU(W₁·LN(x))."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TransformerEncoder(nn.Module):
    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2, hidden: int = 256) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[EncoderLayer(dim, heads, hidden) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.layers(x))


# -- export ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooEntry:
    build: Callable[[], nn.Module]
    input_shape: Callable[[int, int], tuple[int, ...]]  # (batch, size) -> shape
    default_size: int


MODELS: dict[str, ZooEntry] = {
    "resnet50": ZooEntry(ResNet50, lambda b, s: (b, 3, s, s), 64),
    "mobilenetv3": ZooEntry(MobileNetV3Large, lambda b, s: (b, 3, s, s), 64),
    "mobilenetv3_relu6": ZooEntry(lambda: MobileNetV3Large(relu6_formulas=True), lambda b, s: (b, 3, s, s), 64),
    "inception": ZooEntry(InceptionBlock, lambda b, s: (b, 64, s, s), 16),
    "transformer": ZooEntry(TransformerEncoder, lambda b, s: (b, s, 64), 16),
}


def build(name: str, seed: int = SEED) -> nn.Module:
    """The module `name` in eval mode, its weights and BatchNorm statistics drawn from `seed`."""
    try:
        entry = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known: {sorted(MODELS)}") from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = entry.build()
        randomize_batchnorm(module)
    return module.eval()


def randomize_batchnorm(module: nn.Module) -> None:
    """Running mean/var and γ/β drawn at random (from the global generator), so BN is far from identity."""
    with torch.no_grad():
        for bn in module.modules():
            if isinstance(bn, nn.modules.batchnorm._BatchNorm):
                bn.running_mean.normal_(0.0, 0.2)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.normal_(0.0, 0.2)


def input_shape(name: str, batch: int = 1, size: int | None = None) -> tuple[int, ...]:
    entry = MODELS[name]
    return entry.input_shape(batch, size or entry.default_size)


def export(
    name: str,
    batch: int = 1,
    dynamic_batch: bool = True,
    *,
    size: int | None = None,
    opset: int = DEFAULT_OPSET,
    seed: int = SEED,
    keep_batchnorm: bool = True,
) -> onnx.ModelProto:
    """The zoo model `name` exported to ONNX: input "input", output "output", batch axis named "batch".

    `size` is the image side (or the sequence length of the transformer); `dynamic_batch=False` fixes the
    batch dimension to `batch`. BatchNormalization stays a node of its own unless `keep_batchnorm=False`
    (then the exporter folds it into the Conv before it).
    """
    module = build(name, seed)
    example = torch.zeros(input_shape(name, batch, size))
    axes = {"input": {0: "batch"}, "output": {0: "batch"}} if dynamic_batch else None
    return export_onnx(
        module,
        example,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes=axes,
        opset=opset,
        keep_batchnorm=keep_batchnorm,
    )
