"""Shape inference inside the pipeline: dims that import left unknown become static once folding makes them
computable, and the fusions that need them fire."""

from tensorforge import zoo
from tensorforge.frontend import import_model
from tensorforge.passes.pipeline import default_passes, optimize
from tensorforge.passes.shapes import InferShapes
from tests.passes.support import ops


def test_the_detectors_residual_adds_fuse_once_the_split_outputs_have_shapes():
    """The YOLO-style detector's C2f blocks add a conv's output to a Split/Slice output whose dims ONNX
    inference at import left as 'unk__' symbols: without the shape pass those adds stay unfused."""
    proto = zoo.export("yolo", dynamic_batch=False)
    without = [p for p in default_passes() if not isinstance(p, InferShapes)]
    unshaped, _ = optimize(import_model(proto), without)
    shaped, report = optimize(import_model(proto))
    assert ops(unshaped).count("Add") == 6
    assert ops(shaped).count("Add") == 0
    assert any(run.name == "infer-shapes" and run.modified for run in report.runs)
