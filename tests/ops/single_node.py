"""Build one-node ONNX models for op tests."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from tests.helpers import make_model, tensor_info


def int64_tensor(name: str, array: np.ndarray):
    return helper.make_tensor(name, TensorProto.INT64, array.shape, array.ravel())


def single_node_model(op, inputs, attrs=None, opset=17, initializers=(), n_out=1, out_dtype=TensorProto.FLOAT):
    """A model of one `op` node and its feeds: `inputs` maps names to arrays (in input order), the ones
    named in `initializers` become int64 initializers; outputs are y0, y1, ... of `out_dtype`."""
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, list(inputs), outs, **(attrs or {}))
    inits = [int64_tensor(n, inputs[n]) for n in initializers]
    feeds = {n: a for n, a in inputs.items() if n not in initializers}
    infos = [tensor_info(n, list(a.shape), helper.np_dtype_to_tensor_dtype(a.dtype)) for n, a in feeds.items()]
    model = make_model([node], infos, [tensor_info(o, None, out_dtype) for o in outs], opset, inits)
    return model, feeds
