"""The default optimization pipeline: which passes run, in which order, and `optimize` to run them.

The order matters: folding and cleanup first expose the plain structure (constant subgraphs gone, no-op
Identity/Dropout removed) and shape inference fills the dims folding made computable, CSE merges duplicates
before patterns are matched, pattern recognition turns decomposed GELU/LayerNorm/softmax into single ops and
then attention (two MatMuls around a softmax) into one, pointwise ops after a layer's transposed output move
above the Transpose (next to the layer that can absorb them), a feature map flattened into tokens is transposed
first (views of a channels_last map), BatchNorm is folded into its convolution before the
epilogue fusion absorbs bias, activation and residual add into FusedConv/FusedGemm, the Q/DQ pairs of an
explicitly quantized model fold into the convolutions that read them (QuantizedConv), parallel layers are
merged once their epilogues are settled, squeeze-and-excitation blocks (pool, two 1×1 convolutions, the gating
product) become one node for an engine (and on the CPU, with our kernels for them, a depthwise convolution or a
squeeze-excite block with the 1×1 after it), and what is left of elementwise chains becomes FusedPointwise. A last
dead-code sweep removes what the fusions orphaned. The manager repeats the list to a fixed point.

`device` is the device type the graph is optimized for ("cpu", "cuda"): a pass whose node pays off only through
an engine's tactics runs only when a device is given (the squeeze-and-excitation fusion, for CPU and CUDA
builds); None runs the passes that are about the graph alone.
"""

from __future__ import annotations

from ..ir import Model
from .attention import RecognizeAttention
from .base import Pass
from .cleanup import Cleanup
from .cpu_blocks import CpuKernels, FuseCpuBlocks, FuseCpuExpansions
from .cse import CommonSubexpressions
from .epilogue import FuseEpilogue
from .explicit_quant import FoldExplicitQuantization
from .fold import ConstantFolding, DeadCodeElimination
from .fold_bn import FoldBatchNorm
from .horizontal import MergeParallel
from .manager import OptimizationReport, PassManager
from .patterns import RecognizePatterns
from .pointwise import FusePointwise
from .shapes import InferShapes
from .squeeze_excite import FuseSqueezeExcite
from .tokens import ChannelsLastTokens
from .transposes import HoistThroughTransposes


def default_passes(device: str | None = None, cpu_kernels: CpuKernels | None = None) -> list[Pass]:
    """A fresh instance of each pass of the default pipeline for `device` (a device type; None: the passes that
    do not depend on one), in order. `cpu_kernels`: what our CPU kernels for fused blocks evaluate, where the build
    can use them (`FuseCpuBlocks`; None: no such kernels)."""
    for_engines = [FuseSqueezeExcite()] if device is not None else []
    if device == "cpu" and cpu_kernels is not None:
        for_engines += [FuseCpuBlocks(cpu_kernels), FuseCpuExpansions(cpu_kernels)]
    return [
        ConstantFolding(),
        Cleanup(),
        DeadCodeElimination(),
        InferShapes(),
        CommonSubexpressions(),
        RecognizePatterns(),
        RecognizeAttention(),
        HoistThroughTransposes(),
        ChannelsLastTokens(),
        FoldBatchNorm(),
        FuseEpilogue(),
        FoldExplicitQuantization(),
        MergeParallel(),
        *for_engines,
        FusePointwise(),
        DeadCodeElimination(),
    ]


def optimize(
    model: Model,
    passes: list[Pass] | None = None,
    max_iterations: int = 8,
    device: str | None = None,
    cpu_kernels: CpuKernels | None = None,
) -> tuple[Model, OptimizationReport]:
    """Optimize `model` in place with `passes` (the default pipeline for the device type `device` when None);
    return it and the report.

    Clone the model first (`tensorforge.ir.clone.clone_model`) to keep the original.
    """
    if passes is None:
        passes = default_passes() if device is None else default_passes(device, cpu_kernels)
    manager = PassManager(passes, max_iterations=max_iterations)
    return manager.run(model)
