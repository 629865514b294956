"""Reproducible test models in plain `torch.nn`, and their ONNX export.

The architectures follow the published ones (torchvision's ResNet-50, MobileNetV3-Large, EfficientNet-B0,
ConvNeXt-Tiny and ViT-S/16, an Inception-v1 block, a pre-norm transformer encoder, a YOLOv8n-style detector,
the BERT-base encoder), with weights drawn from a fixed seed. `build` also randomizes every BatchNorm's running
statistics and affine parameters, so folding BN into a convolution is not the identity and an error in it
shows. Input sizes are a parameter (the image side, or the sequence length): small ones keep CPU tests fast.
Keyword options of `build` and `export` reach the model's constructor (e.g. fewer layers for a quick test).

    >>> proto = export("resnet50", size=64)      # onnx.ModelProto, input "input" [batch, 3, 64, 64]
    >>> feeds = example_inputs("bert_base", batch=2, size=32)   # {"input_ids": int64, "attention_mask": int64}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    """x · gate(W₂ · act(W₁ · avgpool(x))), with 1×1 convolutions for W₁, W₂ as in torchvision.

    MobileNetV3 uses ReLU and h-sigmoid, EfficientNet SiLU and sigmoid.
    """

    def __init__(
        self, channels: int, squeeze: int, act: Callable[[], nn.Module], gate: Callable[[], nn.Module]
    ) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


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
            layers.append(SqueezeExcite(expanded, _make_divisible(expanded // 4), nn.ReLU, hard.sigmoid))
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
    """softmax(Q·Kᵀ/√d_head + M)·V per head, with separate Q/K/V projections and explicit reshapes.

    M is an optional additive mask broadcast over the scores [batch, heads, query, key] (BERT's padding mask).
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / self.head_dim**0.5
        if mask is not None:
            scores = scores + mask
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(context.transpose(1, 2).reshape(batch, seq, dim))


class EncoderLayer(nn.Module):
    """Pre-norm encoder layer: x + Attn(LN(x)), then x + W₂·GELU(W₁·LN(x))."""

    def __init__(self, dim: int, heads: int, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=eps), SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
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


# -- EfficientNet-B0 ---------------------------------------------------------------------------------------


class MBConv(nn.Module):
    """EfficientNet's MBConv: 1×1 expand → depthwise k×k → squeeze-excite → 1×1 project, SiLU, residual
    when shapes allow (stochastic depth is a training-time drop, absent at inference)."""

    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.use_residual = stride == 1 and cin == cout
        expanded = cin * expand
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(_conv_bn(cin, expanded, 1, 1, 1, nn.SiLU()))
        layers.append(_conv_bn(expanded, expanded, kernel, stride, expanded, nn.SiLU()))
        layers.append(SqueezeExcite(expanded, max(1, cin // 4), nn.SiLU, nn.Sigmoid))
        layers.append(_conv_bn(expanded, cout, 1, 1, 1, None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_residual else out


class EfficientNet(nn.Module):
    """EfficientNet (Tan & Le 2019, table 1) laid out as torchvision's; `width` and `depth` scale the channel
    and layer counts as B0..B7 do (B0: 1.0, 1.0)."""

    # expansion, kernel, stride, input channels, output channels, layers
    config = (
        (1, 3, 1, 32, 16, 1),
        (6, 3, 2, 16, 24, 2),
        (6, 5, 2, 24, 40, 2),
        (6, 3, 2, 40, 80, 3),
        (6, 5, 1, 80, 112, 3),
        (6, 5, 2, 112, 192, 4),
        (6, 3, 1, 192, 320, 1),
    )

    def __init__(self, width: float = 1.0, depth: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()

        def channels(c: int) -> int:
            return _make_divisible(c * width)

        stem = channels(32)
        layers: list[nn.Module] = [_conv_bn(3, stem, 3, 2, 1, nn.SiLU())]
        for expand, kernel, stride, cin, cout, repeats in self.config:
            cin, cout = channels(cin), channels(cout)
            for index in range(math.ceil(repeats * depth)):
                layers.append(MBConv(cin if index == 0 else cout, cout, expand, kernel, stride if index == 0 else 1))
        last = channels(320)
        head = 4 * last
        layers.append(_conv_bn(last, head, 1, 1, 1, nn.SiLU()))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(head, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# -- ConvNeXt-Tiny -----------------------------------------------------------------------------------------


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (torchvision's `LayerNorm2d`): NHWC, normalize, NCHW."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """x + γ ⊙ W₂·GELU(W₁·LN(dwconv₇ₓ₇(x))), the LayerNorm and the two Linear layers applied channels-last.

    γ (the layer scale) is drawn in [0.1, 0.5] rather than the training-time 1e-6, so every block's branch
    shows in the output.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1, self.act, self.pw2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.layer_scale = nn.Parameter(torch.empty(dim, 1, 1).uniform_(0.1, 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        y = self.pw2(self.act(self.pw1(y))).permute(0, 3, 1, 2)
        return x + self.layer_scale * y


class ConvNeXt(nn.Module):
    """ConvNeXt (Liu et al. 2022) as torchvision's: 4×4/4 patchify stem, stages of blocks separated by
    LayerNorm + 2×2/2 downsampling, global pool, LayerNorm, classifier. Defaults are ConvNeXt-Tiny."""

    def __init__(
        self, depths: tuple[int, ...] = (3, 3, 9, 3), dims: tuple[int, ...] = (96, 192, 384, 768), num_classes=1000
    ) -> None:
        super().__init__()
        if len(depths) != len(dims):
            raise ValueError(f"ConvNeXt needs one width per stage: depths {depths}, dims {dims}")
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, stride=4), ChannelLayerNorm(dims[0], eps=1e-6)]
        for index, (depth, dim) in enumerate(zip(depths, dims, strict=True)):
            if index > 0:
                layers += [ChannelLayerNorm(dims[index - 1], eps=1e-6), nn.Conv2d(dims[index - 1], dim, 2, stride=2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.norm = ChannelLayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.norm(self.avgpool(self.features(x))), 1))


# -- ViT-S/16 ----------------------------------------------------------------------------------------------


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al. 2021): p×p/p patch-embedding conv, a class token, learned position embeddings,
    pre-norm encoder layers (GELU MLP), final LayerNorm, classifier on the class token. Defaults are ViT-S/16
    (dim 384, 6 heads, 12 layers, MLP 1536); the position table is sized for `image_size`."""

    def __init__(
        self,
        image_size: int = 224,
        patch: int = 16,
        dim: int = 384,
        layers: int = 12,
        heads: int = 6,
        mlp: int = 1536,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        if image_size % patch:
            raise ValueError(f"ViT image size {image_size} must be a multiple of the patch size {patch}")
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.position = nn.Parameter(0.02 * torch.randn(1, 1 + (image_size // patch) ** 2, dim))
        self.encoder = nn.Sequential(*[EncoderLayer(dim, heads, mlp, eps=1e-6) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.position
        return self.head(self.norm(self.encoder(tokens))[:, 0])


# -- YOLOv8n-style detector --------------------------------------------------------------------------------


class ConvBnSiLU(nn.Module):
    """Ultralytics' `Conv`: k×k convolution (no bias, 'same' padding) → BatchNorm (ε = 1e-3) → SiLU."""

    def __init__(self, cin: int, cout: int, kernel: int = 1, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class YoloBottleneck(nn.Module):
    """Two 3×3 ConvBnSiLU, plus the input when `shortcut`."""

    def __init__(self, channels: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2 = ConvBnSiLU(channels, channels, 3), ConvBnSiLU(channels, channels, 3)
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.cv2(self.cv1(x))
        return x + out if self.shortcut else out


class C2f(nn.Module):
    """YOLOv8's CSP block: a 1×1 conv split in two halves, n bottlenecks chained on the second half, every
    intermediate concatenated (Split → … → Concat) and mixed by a 1×1 conv."""

    def __init__(self, cin: int, cout: int, repeats: int, shortcut: bool) -> None:
        super().__init__()
        self.hidden = cout // 2
        self.cv1 = ConvBnSiLU(cin, 2 * self.hidden)
        self.cv2 = ConvBnSiLU((2 + repeats) * self.hidden, cout)
        self.blocks = nn.ModuleList(YoloBottleneck(self.hidden, shortcut) for _ in range(repeats))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = list(self.cv1(x).chunk(2, 1))
        for block in self.blocks:
            parts.append(block(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5×5/1 max pools, concatenated with their input."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        hidden = cin // 2
        self.cv1, self.cv2 = ConvBnSiLU(cin, hidden), ConvBnSiLU(4 * hidden, cout)
        self.pool = nn.MaxPool2d(5, stride=1, padding=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [self.cv1(x)]
        for _ in range(3):
            parts.append(self.pool(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class YoloDetector(nn.Module):
    """A YOLOv8-style detector: C2f backbone with SPPF, FPN/PAN neck (nearest ×2 upsampling, Concat), and
    three decoupled heads at strides 8, 16, 32 (box: 4·16 distribution bins, class: 80 logits).

    The output is the heads' raw maps flattened and concatenated, [batch, 64 + classes, anchors], as
    ultralytics has it before box decoding; no NMS. `width` and `depth` scale channels and C2f repeats
    (YOLOv8n: 0.25 and 1/3).
    """

    def __init__(self, width: float = 0.25, depth: float = 1 / 3, num_classes: int = 80, reg_max: int = 16) -> None:
        super().__init__()

        def ch(c: int) -> int:
            return _make_divisible(min(c, 1024) * width)

        def n(repeats: int) -> int:
            return max(round(repeats * depth), 1)

        c1, c2, c3, c4, c5 = ch(64), ch(128), ch(256), ch(512), ch(1024)
        self.stem = nn.Sequential(ConvBnSiLU(3, c1, 3, 2), ConvBnSiLU(c1, c2, 3, 2), C2f(c2, c2, n(3), True))
        self.down3 = nn.Sequential(ConvBnSiLU(c2, c3, 3, 2), C2f(c3, c3, n(6), True))
        self.down4 = nn.Sequential(ConvBnSiLU(c3, c4, 3, 2), C2f(c4, c4, n(6), True))
        self.down5 = nn.Sequential(ConvBnSiLU(c4, c5, 3, 2), C2f(c5, c5, n(3), True), SPPF(c5, c5))
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.top_down4 = C2f(c5 + c4, c4, n(3), False)
        self.top_down3 = C2f(c4 + c3, c3, n(3), False)
        self.reduce3, self.bottom_up4 = ConvBnSiLU(c3, c3, 3, 2), C2f(c3 + c4, c4, n(3), False)
        self.reduce4, self.bottom_up5 = ConvBnSiLU(c4, c4, 3, 2), C2f(c4 + c5, c5, n(3), False)
        box, cls = max(16, c3 // 4, 4 * reg_max), max(c3, min(num_classes, 100))

        def head(cin: int, hidden: int, cout: int) -> nn.Module:
            return nn.Sequential(ConvBnSiLU(cin, hidden, 3), ConvBnSiLU(hidden, hidden, 3), nn.Conv2d(hidden, cout, 1))

        self.box_heads = nn.ModuleList(head(c, box, 4 * reg_max) for c in (c3, c4, c5))
        self.cls_heads = nn.ModuleList(head(c, cls, num_classes) for c in (c3, c4, c5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p3 = self.down3(self.stem(x))
        p4 = self.down4(p3)
        p5 = self.down5(p4)
        t4 = self.top_down4(torch.cat([self.upsample(p5), p4], 1))
        n3 = self.top_down3(torch.cat([self.upsample(t4), p3], 1))
        n4 = self.bottom_up4(torch.cat([self.reduce3(n3), t4], 1))
        n5 = self.bottom_up5(torch.cat([self.reduce4(n4), p5], 1))
        maps = [
            torch.cat([box(level), cls(level)], 1).flatten(2)
            for level, box, cls in zip((n3, n4, n5), self.box_heads, self.cls_heads, strict=True)
        ]
        return torch.cat(maps, 2)


# -- BERT-base ---------------------------------------------------------------------------------------------


class BertLayer(nn.Module):
    """Post-norm encoder layer: x = LN(x + Attn(x, M)), then LN(x + W₂·GELU(W₁·x)), GELU the exact (erf) one."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.attn, self.norm1 = SelfAttention(hidden, heads), nn.LayerNorm(hidden, eps=1e-12)
        self.mlp = nn.Sequential(nn.Linear(hidden, intermediate), nn.GELU(), nn.Linear(intermediate, hidden))
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.mlp(x))


class BertEncoder(nn.Module):
    """BERT (Devlin et al. 2019): token + position + segment embeddings, LayerNorm, post-norm encoder layers.

    Inputs: `input_ids` [batch, seq] (int64, in the 30522-token vocabulary) and `attention_mask` [batch, seq]
    (1 for tokens, 0 for padding), turned into the additive mask (1 − m)·(−10000) over the keys. Every token
    is in segment 0. Output: the last hidden states [batch, seq, hidden]. Defaults are BERT-base.
    """

    vocab = 30522
    max_positions = 512

    def __init__(self, layers: int = 12, hidden: int = 768, heads: int = 12, intermediate: int = 3072) -> None:
        super().__init__()
        self.tokens = nn.Embedding(self.vocab, hidden)
        self.positions = nn.Embedding(self.max_positions, hidden)
        self.segments = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, intermediate) for _ in range(layers))
        for embedding in (self.tokens, self.positions, self.segments):
            nn.init.normal_(embedding.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        x = self.tokens(input_ids) + self.positions.weight[:seq] + self.segments(torch.zeros_like(input_ids))
        x = self.norm(x)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


# -- export ------------------------------------------------------------------------------------------------


Inputs = dict[str, torch.Tensor]


def _image_input(shape: tuple[int, ...], generator: torch.Generator) -> Inputs:
    return {"input": torch.randn(shape, generator=generator)}


def _token_inputs(shape: tuple[int, ...], generator: torch.Generator) -> Inputs:
    """Token ids uniform in BERT's vocabulary; a mask of ones with each sequence's last quarter or less padded."""
    batch, seq = shape
    ids = torch.randint(0, BertEncoder.vocab, shape, generator=generator)
    lengths = torch.randint(max(1, 3 * seq // 4), seq + 1, (batch,), generator=generator)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).to(torch.int64)
    return {"input_ids": ids, "attention_mask": mask}


@dataclass(frozen=True)
class ZooEntry:
    """How to make a zoo model and its inputs.

    `build(**options)` makes the module (`build(size=..., **options)` when `size_dependent`: its parameters
    depend on the input size); `input_shape(batch, size)` is the shape of every input; `inputs(shape,
    generator)` draws named example inputs of that shape.
    """

    build: Callable[..., nn.Module]
    input_shape: Callable[[int, int], tuple[int, ...]]
    default_size: int
    inputs: Callable[[tuple[int, ...], torch.Generator], Inputs] = _image_input
    size_dependent: bool = False


def _image(batch: int, size: int) -> tuple[int, ...]:
    return (batch, 3, size, size)


MODELS: dict[str, ZooEntry] = {
    "resnet50": ZooEntry(ResNet50, _image, 64),
    "mobilenetv3": ZooEntry(MobileNetV3Large, _image, 64),
    "mobilenetv3_relu6": ZooEntry(lambda: MobileNetV3Large(relu6_formulas=True), _image, 64),
    "inception": ZooEntry(InceptionBlock, lambda b, s: (b, 64, s, s), 16),
    "transformer": ZooEntry(TransformerEncoder, lambda b, s: (b, s, 64), 16),
    "efficientnet_b0": ZooEntry(EfficientNet, _image, 64),
    "convnext_tiny": ZooEntry(ConvNeXt, _image, 64),
    "vit_s16": ZooEntry(lambda size, **o: VisionTransformer(image_size=size, **o), _image, 64, size_dependent=True),
    "yolo": ZooEntry(YoloDetector, _image, 64),
    "bert_base": ZooEntry(BertEncoder, lambda b, s: (b, s), 128, _token_inputs),
}


def _entry(name: str) -> ZooEntry:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; known: {sorted(MODELS)}") from None


def build(name: str, seed: int = SEED, *, size: int | None = None, **options: Any) -> nn.Module:
    """The module `name` in eval mode, its weights and BatchNorm statistics drawn from `seed`.

    `size` matters only to models whose parameters depend on it (ViT's position table); `options` go to the
    model's constructor (e.g. `layers=2` for a shallow BERT).
    """
    entry = _entry(name)
    if entry.size_dependent:
        options["size"] = size or entry.default_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = entry.build(**options)
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
    """The shape of the model's input (of each input, for BERT's ids and mask)."""
    entry = _entry(name)
    return entry.input_shape(batch, size or entry.default_size)


def example_inputs(name: str, batch: int = 1, size: int | None = None, seed: int = 0) -> Inputs:
    """Random inputs by name, in the model's input order: standard normal images or sequences, or BERT's
    token ids (uniform in the vocabulary) and attention mask (mostly ones, padding at the end)."""
    generator = torch.Generator().manual_seed(seed)
    return _entry(name).inputs(input_shape(name, batch, size), generator)


def export(
    name: str,
    batch: int = 1,
    dynamic_batch: bool = True,
    *,
    size: int | None = None,
    opset: int = DEFAULT_OPSET,
    seed: int = SEED,
    keep_batchnorm: bool = True,
    **options: Any,
) -> onnx.ModelProto:
    """The zoo model `name` exported to ONNX: inputs named as `example_inputs` names them ("input" for all
    but BERT), output "output", batch axis named "batch".

    `size` is the image side (or the sequence length); `dynamic_batch=False` fixes the batch dimension to
    `batch`. BatchNormalization stays a node of its own unless `keep_batchnorm=False` (then the exporter folds
    it into the Conv before it). `options` go to the model's constructor, as in `build`.
    """
    module = build(name, seed, size=size, **options)
    example = example_inputs(name, batch, size)
    axes = {input_name: {0: "batch"} for input_name in [*example, "output"]} if dynamic_batch else None
    return export_onnx(
        module,
        tuple(example.values()),
        input_names=list(example),
        output_names=["output"],
        dynamic_axes=axes,
        opset=opset,
        keep_batchnorm=keep_batchnorm,
    )
