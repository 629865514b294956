"""Which tensors a plan can write straight into the concatenation that reads them: the memory plan's `views`.

A channel concatenation of channels_last tensors copies every input once more. When an input's producer writes
its output through the strides it is given (`writes_into`, NHWC, `strided_outputs`), it can write into the
concatenation's own storage instead, at the input's channel range, and the concatenation (`vendor.concat-into`)
finds it in place and skips it. The tensor it writes may also be wider than the concatenated input: a C2f block
splits a 1×1 convolution's output in two channel slices and concatenates both, in order, with what follows; the
convolution then writes its whole output at the slices' place. Readers of such a tensor see a channel slice of
the wider buffer (strided), which the Triton convolutions read as it is (`strided_inputs`).

The autotuner times each Concat alone, where nothing is in place, so `vendor.concat-into` (one strided copy per
input) often loses there to torch's single `cat` by a few percent; `prefer_concat_into` then moves the Concats
whose inputs the views would place to it, by the time it is expected to take in the plan.

Only an optimization: `vendor.concat-into` copies whatever it does not find in place, so a plan that does not
run as planned (a producer that allocated, a slice that copied) still computes the same values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..ir import DType, Model, Node, Value
from ..runtime.plan import Layer
from ..tactics.autotune import Candidate
from ..tactics.base import tactic_by_key

_CHANNEL_AXES = (1, -3)
_CONCAT_INTO = "vendor.concat-into"


def concat_views(
    model: Model, layers: Sequence[Layer], shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, DType]
) -> dict[str, tuple[str, int]]:
    """tensor name -> (concatenation, first channel) for every tensor of the plan `layers` (with the `shapes` and
    `dtypes` one run observed) that can be written inside the concatenation reading it."""
    nodes = model.graph.nodes
    by_node = {nodes[layer.node]: layer for layer in layers}
    outputs = {value.name for value in model.graph.outputs}
    views: dict[str, tuple[str, int]] = {}
    for layer in layers:
        node = nodes[layer.node]
        out = node.outputs[0]
        shape = shapes.get(out.name)
        if node.op_type != "Concat" or not _writes_nhwc(layer) or shape is None or len(shape) != 4:
            continue
        if node.attributes.get("axis") not in _CHANNEL_AXES or out.name in views:
            continue
        if any(len(shapes.get(value.name) or ()) != 4 for value in node.inputs):
            continue  # a constant or an input of unknown shape: no channel positions
        groups: dict[tuple[str, int], list[int]] = {}  # (source, its first channel) -> input channel counts
        sources: dict[str, Value] = {}
        position = 0
        for value in node.inputs:
            channels = shapes[value.name][1]
            source, offset = _channel_slice_of(value, shapes)
            groups.setdefault((source.name, position - offset), []).append(channels)
            sources[source.name] = source
            position += channels
        for (name, first), parts in groups.items():
            source = sources[name]
            producer = source.producer()
            source_shape = shapes.get(name)
            if (
                name in views
                or name in outputs
                or producer not in by_node
                or not _writes_nhwc(by_node[producer], strided=True)
                or source_shape is None
                or len(source_shape) != 4
                or dtypes.get(name) != dtypes.get(out.name)
                or (source_shape[0], *source_shape[2:]) != (shape[0], *shape[2:])
                or first < 0
                or sum(parts) != source_shape[1]  # the source's channels are exactly the concatenated slices
                or any(name == host for host, _ in views.values())
            ):
                continue
            views[name] = (out.name, first)
    return views


def prefer_concat_into(
    model: Model, layers: Sequence[Layer], shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, DType]
) -> list[Layer]:
    """`layers` with each channel Concat on `vendor.concat-into` where that is expected to be faster in the plan:
    its measured time (copying every input) times the share of its channels the views leave to copy, against the
    time of the tactic the autotuner chose."""
    nodes = model.graph.nodes
    trial = list(layers)
    moved: dict[str, int] = {}  # concatenation -> its position in `layers`
    for position, layer in enumerate(layers):
        candidate = _concat_into_candidate(layer) if nodes[layer.node].op_type == "Concat" else None
        if candidate is not None and not _writes_nhwc(layer):
            trial[position] = Layer(
                layer.node, candidate.tactic, candidate.config, candidate.median_ms, layer.candidates, layer.from_cache
            )
            moved[nodes[layer.node].outputs[0].name] = position
    placed = dict.fromkeys(moved, 0)
    for name, (host, _) in concat_views(model, trial, shapes, dtypes).items():
        if host in placed:
            placed[host] += shapes[name][1]
    for host, position in moved.items():
        channels = (shapes.get(host) or (0, 0))[1]
        left = 1 - placed[host] / channels if channels else 1
        if trial[position].median_ms * left >= layers[position].median_ms:
            trial[position] = layers[position]
    return trial


def _concat_into_candidate(layer: Layer) -> Candidate | None:
    """The fastest measured `vendor.concat-into` candidate of `layer` in its precision, if any."""
    measured = [
        c
        for c in layer.candidates
        if c.tactic == _CONCAT_INTO and c.config.get("precision") == layer.precision and math.isfinite(c.median_ms)
    ]
    return min(measured, key=lambda c: c.median_ms, default=None)


def _writes_nhwc(layer: Layer, strided: bool = False) -> bool:
    """Whether `layer` writes channels_last outputs into buffers it is given (`strided`: through their strides).
    A strided writer of layout "any" (a max pool) counts: it asks for its output in its input's memory format,
    and one asked in another layout than its concatenation's gets a buffer of its own (copied in then)."""
    tactic = tactic_by_key(layer.tactic)
    if tactic is None or not tactic.writes_into:
        return False
    if strided:
        return tactic.strided_outputs and layer.config.get("layout") in ("NHWC", "any")
    return layer.config.get("layout") == "NHWC"


def _channel_slice_of(value: Value, shapes: Mapping[str, tuple[int, ...]]) -> tuple[Value, int]:
    """(u, s) when `value` is channels [s, s + its channels) of a 4-D tensor u through one Slice or Split along
    the channels with step 1 (a view); else (value, 0)."""
    producer: Node | None = value.producer()
    if producer is None or producer.domain not in ("", "ai.onnx") or not producer.inputs:
        return value, 0
    data = producer.inputs[0]
    data_shape = shapes.get(data.name)
    if data_shape is None or len(data_shape) != 4:
        return value, 0
    if producer.op_type == "Split" and producer.attributes.get("axis", 0) in _CHANNEL_AXES:
        offset = 0
        for output in producer.outputs:
            if output is value:
                return data, offset
            offset += shapes[output.name][1] if output.name in shapes else 0
        return value, 0
    if producer.op_type == "Slice":
        start = _slice_start(producer, data_shape[1])
        if start is not None:
            return data, start
    return value, 0


def _slice_start(node: Node, channels: int) -> int | None:
    """The first channel of a Slice along the channels alone with step 1, from constant operands; else None."""
    if len(node.inputs) > 1:  # opset 10+: starts, ends, axes, steps as inputs
        operands = [_ints(v) if v is not None else None for v in (list(node.inputs) + [None] * 5)[1:5]]
        starts, _, axes, steps = operands
    else:
        starts, axes, steps = node.attributes.get("starts"), node.attributes.get("axes"), None
    if starts is None or len(starts) != 1 or (steps is not None and list(steps) != [1]):
        return None
    if axes is None or len(axes) != 1 or axes[0] not in _CHANNEL_AXES:
        return None
    start = starts[0] + channels if starts[0] < 0 else starts[0]
    return min(max(start, 0), channels)


def _ints(value: Value) -> list[int] | None:
    if not value.is_const:
        return None
    return [int(v) for v in value.const.reshape(-1).tolist()]
