"""Shape inference as a pass: registry inference (`ops.infer`) over the graph, filling the dims that import-time
ONNX inference left unknown and that folding has since made computable (a Slice whose bounds were a Shape
subgraph, a Split whose sizes were computed). Fusions that need static shapes (a residual add's broadcast, a
layer merge) see them on the next sweep of the pipeline."""

from __future__ import annotations

from ..ops.infer import infer_model
from .base import Pass, PassContext


class InferShapes(Pass):
    name = "infer-shapes"

    def run(self, ctx: PassContext) -> bool:
        return infer_model(ctx.model, check=False) > 0
