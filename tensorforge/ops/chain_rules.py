"""The chaining rules of quantized layers: which activations they pass to each other quantized, stated once.

Two users apply them: the chaining pass (`passes.quant_chain`) to a quantized graph's QuantizedConv /
QuantizedGemm nodes, and the Q/DQ simulation (`quant.simulate`, `residuals=True`) to the float layers that the
lowering will turn into such nodes, so that it rounds the residuals the engine will round. Each describes its
graph through a `ChainView`: the quantized layer a node is or will be (`QuantizedLayer`, None for a float node)
and which outputs are written quantized (a `y_scale`, or an entry of `written`, which `plan_chains` fills in
without touching the graph).

For a quantized layer P whose output Y is float, not a graph output, with readers C_i (a reader that quantizes Y
per channel, a depthwise QuantizedConv with `Xs`, is not one of P's type: it reads Y in float):
- `INPUT_CHAINS` (exact): every C_i is a quantized layer of P's type reading Y as its input X, all with one
  scale s. P then writes Q_s(Y) and the readers skip their quantize.
- `RESIDUAL_STREAMS` (after the input chains; an approximation): at least one C_i adds Y as its residual, and
  every C_i is a quantized layer of P's type reading Y as X with one scale s, or a quantized layer adding Y as
  its residual Z (reading its own X quantized, or float and quantizing it on load: ResNet's first downsample
  reads the max pool's float output). P then writes Q_s(Y) and the adders add Q_s(Y) · s
  (`z_scale` = s): the residual rounded onto the grid its X readers quantize it to anyway. When no C_i reads Y
  as X (a residual-only tensor: the last convolution of a ResNet stage's first block, added by the downsample
  convolution), s is Y's own calibrated scale (`y_range_scale`, set by the lowering), if it has one.
- `THROUGH_MAX_POOL` (exact): Y's one reader is a 2-D MaxPool whose readers all read its output as in
  `INPUT_CHAINS`: P writes Q_s(Y) and the pool passes the quantized values on (int8 or E4M3: max commutes with
  either rounding, both monotone).
- `FROM_LAYER_NORM` (exact): P is not a quantized layer but a LayerNormalization (Y alone, float32 statistics)
  some of whose readers quantize Y as their input X (those of the first one's type and scale, not per channel):
  the norm writes Q_s(Y) (`y_scale`) for them and, when anything else reads Y (a float layer, a quantized layer's
  residual Z, the graph's outputs), Y itself beside it (the domain norm's second output). A pre-norm transformer's
  norms then hand its attention and feed-forward input projections their input quantized; a post-norm
  transformer's (BERT's) hand the next projection Q_s(Y) and the residual add after it Y, exact.
When the build names the layers its tuned plan runs quantized (`eligible`), P and every C_i must be among them
(for a norm, never quantized itself, the readers it writes Q_s(Y) for are those among them).
A float layer therefore breaks a stream where it stands as P (nothing is written quantized) or as any reader (Y
stays float for every reader); as the producer of an adder's own X it leaves the adder's residual quantized.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from ..ir import DType, Graph, Node, Value, qualified_op
from .fused import DOMAIN

QUANTIZED_LAYERS = (f"{DOMAIN}::QuantizedConv", f"{DOMAIN}::QuantizedGemm")
X_INPUT, Z_INPUT = 0, 3  # a quantized layer's input positions: its activation, its residual
XS_INPUT = 5  # a QuantizedConv's per-channel input scales
_FLOAT_OUTPUTS = (DType.FLOAT, DType.FLOAT16, DType.BFLOAT16, DType.UNDEFINED)

Readers = list[tuple[Node, int]]  # (node, input index)


@dataclass(frozen=True, slots=True)
class QuantizedLayer:
    """What the rules need of a quantized layer: its op ("QuantizedConv" or "QuantizedGemm"), its quantized
    type and the scale it quantizes its input X with."""

    op_type: str
    quant: str
    x_scale: float
    per_channel: bool = False  # X quantized per channel (a QuantizedConv's Xs): no producer writes that grid
    y_range_scale: float = 0.0  # the calibrated scale of its output Y (0: none), for a residual-only Y


def is_quantized_layer(node: Node) -> bool:
    return qualified_op(node) in QUANTIZED_LAYERS


def layer_of(node: Node) -> QuantizedLayer | None:
    """A QuantizedConv / QuantizedGemm node as the rules see it; None for any other node."""
    if not is_quantized_layer(node):
        return None
    per_channel = node.op_type == "QuantizedConv" and len(node.inputs) > XS_INPUT and node.inputs[XS_INPUT] is not None
    return QuantizedLayer(
        node.op_type,
        node.attributes.get("quant", "int8"),
        float(node.attributes["x_scale"]),
        per_channel,
        float(node.attributes.get("y_range_scale", 0.0)),
    )


class ChainView:
    """A graph's quantized layers (`layer`) and the outputs written quantized: those of producers with a
    `y_scale`, and those `written` records (producer → scale) for a plan that leaves the graph alone."""

    __slots__ = ("layer", "written")

    def __init__(self, layer: Callable[[Node], QuantizedLayer | None] = layer_of) -> None:
        self.layer = layer
        self.written: dict[Node, float] = {}

    def writes_quantized(self, node: Node) -> bool:
        return node in self.written or bool(node.attributes.get("y_scale", 0.0))


class ChainRule:
    """One rule: the readers that make a producer a candidate (`serves`) and why a reader keeps the output
    float (`reader_problem`); `problem` is the whole check, `scale` the scale a chained output is written on:
    the one its input readers quantize it with, else (`own_scale`) one of the producer's own."""

    def serves(self, readers: Readers, view: ChainView) -> bool:
        raise NotImplementedError

    def reader_problem(
        self, reader: Node, index: int, output: Value, quant: str, view: ChainView, scales: set[float]
    ) -> str | None:
        """Why `reader` (reading `output` as input `index`) keeps it float; adds its input scale to `scales`."""
        raise NotImplementedError

    def candidate(self, producer: Node, view: ChainView) -> Readers | None:
        """The readers of `producer`'s output when the rule applies to it (its output float, not yet written
        quantized, served), else None."""
        layer = view.layer(producer)
        if layer is None or not producer.outputs or view.writes_quantized(producer):
            return None
        readers = list(producer.outputs[0].uses())
        return readers if self.serves(readers, view) else None

    def problem(
        self, producer: Node, readers: Readers, view: ChainView, eligible: Collection[Node] | None = None
    ) -> str | None:
        """Why `producer`'s output (read by `readers`) stays float, or None when it may be written quantized."""
        output = producer.outputs[0]
        layer = view.layer(producer)
        assert layer is not None
        if _is_graph_output(output):
            return f"{output.name!r} is a graph output: it stays float"
        if output.dtype not in _FLOAT_OUTPUTS:
            return f"{output.name!r} is {output.dtype.name}, not a float activation"
        problem = self.readers_problem(layer, output, readers, view)
        return problem or _ineligible([producer, *(reader for reader, _ in readers)], eligible)

    def readers_problem(self, layer: QuantizedLayer, output: Value, readers: Readers, view: ChainView) -> str | None:
        """Why `readers` keep `output` (of `layer`'s type) float, or None when they take it on one scale."""
        scales: set[float] = set()
        for reader, index in readers:
            problem = self.reader_problem(reader, index, output, layer.quant, view, scales)
            if problem:
                return problem
        if not scales and not self.own_scale(layer):
            return f"no quantized layer reads {output.name!r} as its input and it has no calibrated scale"
        if len(scales) > 1:
            return f"the readers of {output.name!r} quantize it with different scales {sorted(scales)}"
        return None

    def own_scale(self, producer: QuantizedLayer) -> float:
        """The scale of the producer's output when no reader quantizes it as its input (0: none)."""
        return 0.0

    def scale(self, producer: Node, readers: Readers, view: ChainView) -> float:
        """The scale its input readers quantize the output with (the one `problem` found), else `own_scale`."""
        inputs = (view.layer(reader).x_scale for reader, index in readers if index == X_INPUT)
        return next(inputs, None) or self.own_scale(view.layer(producer))


class InputChains(ChainRule):
    def serves(self, readers: Readers, view: ChainView) -> bool:
        return any(view.layer(reader) is not None and index == X_INPUT for reader, index in readers)

    def reader_problem(
        self, reader: Node, index: int, output: Value, quant: str, view: ChainView, scales: set[float]
    ) -> str | None:
        layer = view.layer(reader)
        if layer is None:
            return f"{reader.label} ({reader.op_type}) reads {output.name!r} in float"
        if index != X_INPUT:
            return f"{reader.label} reads {output.name!r} as input {index} (a residual stays float)"
        if layer.quant != quant:
            return f"{reader.label} quantizes to {layer.quant}, this layer's type is {quant}"
        if layer.per_channel:
            return f"{reader.label} quantizes {output.name!r} per channel"
        scales.add(layer.x_scale)
        return None


class ResidualStreams(ChainRule):
    def serves(self, readers: Readers, view: ChainView) -> bool:
        return any(_adds(reader, index, view) for reader, index in readers)

    def own_scale(self, producer: QuantizedLayer) -> float:
        return producer.y_range_scale

    def reader_problem(
        self, reader: Node, index: int, output: Value, quant: str, view: ChainView, scales: set[float]
    ) -> str | None:
        layer = view.layer(reader)
        if layer is None:
            return f"{reader.label} ({reader.op_type}) reads {output.name!r} in float"
        if layer.quant != quant:
            return f"{reader.label} quantizes to {layer.quant}, this layer's is {quant}"
        if index == X_INPUT and layer.per_channel:
            return f"{reader.label} quantizes {output.name!r} per channel"
        if index == X_INPUT:
            scales.add(layer.x_scale)
        elif not _adds(reader, index, view):
            return f"{reader.label} reads {output.name!r} as input {index}"
        return None


class ThroughMaxPool(ChainRule):
    """P's output read by a 2-D MaxPool alone, whose output every reader quantizes as X with one scale s: P writes
    Q_s(Y) and the pool pools the quantized values, which is exactly Q_s(MaxPool(Y)), what the readers quantize
    anyway (the rounding, to int8 or to E4M3 with saturation, is monotone, so the maximum commutes with it; every
    window holds a cell of the input). A ResNet stem's output then travels to the pool and on to the first block
    quantized. Exact: the Q/DQ simulation has nothing to round for it."""

    def serves(self, readers: Readers, view: ChainView) -> bool:
        if len(readers) != 1:
            return False
        (pool, index) = readers[0]
        return index == 0 and qualified_op(pool) == "MaxPool" and not any(v.name for v in pool.outputs[1:])

    def problem(
        self, producer: Node, readers: Readers, view: ChainView, eligible: Collection[Node] | None = None
    ) -> str | None:
        output, layer = producer.outputs[0], view.layer(producer)
        assert layer is not None
        if _is_graph_output(output) or output.dtype not in _FLOAT_OUTPUTS:
            return f"{output.name!r} is a graph output or not a float activation"
        pooled = readers[0][0].outputs[0]
        if _is_graph_output(pooled):
            return f"{pooled.name!r}, the max pool's output, is a graph output: it stays float"
        pool_readers = list(pooled.uses())
        problem = INPUT_CHAINS.readers_problem(layer, pooled, pool_readers, view)
        return problem or _ineligible([producer, *(reader for reader, _ in pool_readers)], eligible)

    def scale(self, producer: Node, readers: Readers, view: ChainView) -> float:
        return INPUT_CHAINS.scale(producer, list(readers[0][0].outputs[0].uses()), view)


LAYER_NORMS = ("LayerNormalization", f"{DOMAIN}::LayerNormalization")


class FromLayerNorm(ChainRule):
    """A LayerNormalization's Y read by quantized layers as their input X: the norm writes Q_s(Y) from its float32
    result for those of the first one's type and scale s (`quantized_readers`), which is what each quantizes
    anyway, and Y beside it for every other reader (exact: the Q/DQ simulation has nothing to round for it). The
    readers' type is the norm's `quant`."""

    def candidate(self, producer: Node, view: ChainView) -> Readers | None:
        if qualified_op(producer) not in LAYER_NORMS or view.writes_quantized(producer):
            return None
        if any(v.name for v in producer.outputs[1:]) or producer.attributes.get("stash_type", 1) != 1:
            return None  # (Mean and InvStdDev, or other statistics: the reference's)
        readers = list(producer.outputs[0].uses())
        return readers if INPUT_CHAINS.serves(readers, view) else None

    def problem(
        self, producer: Node, readers: Readers, view: ChainView, eligible: Collection[Node] | None = None
    ) -> str | None:
        output = producer.outputs[0]
        if output.dtype not in _FLOAT_OUTPUTS:
            return f"{output.name!r} is {output.dtype.name}, not a float activation"
        inputs = [reader for reader, index in readers if index == X_INPUT and _per_tensor(view.layer(reader))]
        if not inputs:
            return f"every quantized layer that reads {output.name!r} as its input quantizes it per channel"
        if not self.quantized_readers(readers, view, eligible):
            return _ineligible(inputs, eligible)
        return None

    @staticmethod
    def quantized_readers(readers: Readers, view: ChainView, eligible: Collection[Node] | None = None) -> Readers:
        """The readers that take Q_s(Y): those quantizing Y per tensor as their input X (and running quantized in
        the tuned plan, when `eligible` names those) of the first one's type and scale."""
        chosen = [
            (reader, view.layer(reader))
            for reader, index in readers
            if index == X_INPUT and _per_tensor(view.layer(reader)) and (eligible is None or reader in eligible)
        ]
        if not chosen:
            return []
        grid = (chosen[0][1].quant, chosen[0][1].x_scale)
        return [(reader, X_INPUT) for reader, layer in chosen if (layer.quant, layer.x_scale) == grid]

    def scale(self, producer: Node, readers: Readers, view: ChainView) -> float:
        return view.layer(self.quantized_readers(readers, view)[0][0]).x_scale


INPUT_CHAINS = InputChains()
RESIDUAL_STREAMS = ResidualStreams()
THROUGH_MAX_POOL = ThroughMaxPool()
FROM_LAYER_NORM = FromLayerNorm()


def _ineligible(nodes: Iterable[Node], eligible: Collection[Node] | None) -> str | None:
    """Why a chain through `nodes` does not form when the build names the layers that run quantized (`eligible`):
    the first of them that runs as its float original."""
    for node in nodes if eligible is not None else ():
        if node not in eligible:
            return f"{node.label} runs as its float original in the tuned plan (it timed faster)"
    return None


def _per_tensor(layer: QuantizedLayer | None) -> bool:
    """Whether `layer` is a quantized layer quantizing its input X with one scale."""
    return layer is not None and not layer.per_channel


def _adds(reader: Node, index: int, view: ChainView) -> bool:
    """Whether `reader` reads input `index` as a quantized layer's residual Z."""
    return index == Z_INPUT and view.layer(reader) is not None


def _is_graph_output(value: Value) -> bool:
    producer = value.producer()
    return producer is not None and producer.graph is not None and value in producer.graph.outputs


@dataclass(frozen=True)
class ChainPlan:
    """What the chaining passes would do to a graph: the producers that write their output quantized, with the
    scale (`inputs`: the exact input chains between quantized layers, `residuals`: those that are also added as
    residuals), and the quantized layers (to be) that add a quantized residual, with its `z_scale`."""

    inputs: dict[Node, float]
    residuals: dict[Node, float]
    adders: dict[Node, float]


def plan_chains(
    graph: Graph,
    layer: Callable[[Node], QuantizedLayer | None],
    *,
    eligible: Collection[Node] | None = None,
    residuals: bool = True,
) -> ChainPlan:
    """The chains `passes.quant_chain` forms in `graph` whose quantized layers (present or to come) `layer`
    describes: the input chains, then (with `residuals`) the residual streams to their fixed point (an adder
    may read its X from a producer chained by an earlier stream). The graph is left as it is."""
    view = ChainView(layer)
    inputs = _sweep(graph.nodes, INPUT_CHAINS, view, eligible)
    streams = {}
    if residuals:
        streams = _sweep(graph.nodes, RESIDUAL_STREAMS, view, eligible)
    adders = {
        reader: scale
        for producer, scale in streams.items()
        for reader, index in producer.outputs[0].uses()
        if _adds(reader, index, view)
    }
    return ChainPlan(inputs, streams, adders)


def _sweep(nodes: Iterable[Node], rule: ChainRule, view: ChainView, eligible) -> dict[Node, float]:
    """The producers `rule` chains, repeated until none is added (as a `RulePass` sweeps); records them in
    `view.written` as it goes."""
    nodes = list(nodes)
    chained: dict[Node, float] = {}
    while True:
        added = False
        for node in nodes:
            readers = rule.candidate(node, view)
            if readers is None or rule.problem(node, readers, view, eligible) is not None:
                continue
            chained[node] = view.written[node] = rule.scale(node, readers, view)
            added = True
        if not added:
            return chained
