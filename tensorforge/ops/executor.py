"""The reference executor: runs any imported graph node by node with the registry's torch implementations,
on the CPU or on CUDA. It checks the feeds against the graph's inputs and frees each intermediate tensor
after its last use.
"""

from __future__ import annotations

import difflib
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ..errors import InputError, OpError, TensorforgeError, UnsupportedError
from ..ir import DType, Graph, Model, Node, Value, format_type
from ..tensors import from_any
from . import load_all
from .math_flags import full_float32
from .registry import REGISTRY, OpContext, OpDef


@dataclass(slots=True)
class _Step:
    node: Node
    op_def: OpDef
    ctx: OpContext
    release: tuple[Value, ...]  # values dead after this step
    has_subgraphs: bool


class Executor:
    """Runs `model` on `device`: `run(feeds)` maps input names to tensors and returns the outputs."""

    def __init__(self, model: Model, device: str | torch.device = "cpu") -> None:
        load_all()
        self.model = model
        self.device = torch.device(device)
        check_supported(model)
        self._plans: dict[int, list[_Step]] = {}
        self._constants: dict[Value, Any] = {}
        self._plan(model.graph)

    # -- planning -------------------------------------------------------------------------------------

    def _plan(self, graph: Graph) -> None:
        graph.sort()
        steps = []
        last_use: dict[Value, int] = {}
        keep = set(graph.outputs)
        for index, node in enumerate(graph.nodes):
            for value in _reads(node):
                last_use[value] = index
        for value in graph.initializers.values():
            self._constants[value] = _to_device(value.const, self.device)
        for index, node in enumerate(graph.nodes):
            op_def = REGISTRY.lookup(node.op_type, node.domain, self.model.opset(node.domain))
            assert op_def is not None  # check_supported ran
            ctx = OpContext(
                node=node,
                opset=self.model.opset(node.domain),
                device=self.device,
                output_dtypes=tuple(v.dtype for v in node.outputs),
            )
            release = tuple(
                v
                for v in dict.fromkeys(_reads(node))
                if last_use.get(v) == index
                and v not in keep
                and v.producer() is not None
                and v.producer().graph is graph
            )
            steps.append(_Step(node, op_def, ctx, release, any(True for _ in node.subgraphs())))
            for sub in node.subgraphs():
                self._plan(sub)
        self._plans[id(graph)] = steps

    # -- running --------------------------------------------------------------------------------------

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Run the graph on `feeds` (torch tensors, numpy arrays or DLPack objects) and return outputs."""
        graph = self.model.graph
        env = self.bind_inputs(feeds)
        with torch.inference_mode(), full_float32():
            results = self._run_graph(graph, {}, ChainMap(env, self._constants))
        return {value.name: result for value, result in zip(graph.outputs, results, strict=True)}

    def bind_inputs(self, feeds: Mapping[str, Any]) -> dict[Value, Any]:
        """Check `feeds` against the graph inputs and convert them to tensors on the device."""
        return bind_feeds(self.model.graph, feeds, self.device)

    def _run_graph(self, graph: Graph, bound: dict[Value, Any], outer: ChainMap) -> list[Any]:
        env = outer.new_child(bound)
        for step in self._plans[id(graph)]:
            self._run_step(step, env)
        missing = [v.name for v in graph.outputs if v not in env]
        if missing:
            raise OpError(f"graph {graph.name!r} did not produce outputs {missing}")
        return [env[v] for v in graph.outputs]

    def _subgraph_runner(self, env: ChainMap):
        def run_subgraph(graph: Graph, inputs: Sequence[Any]) -> list[Any]:
            return self._run_graph(graph, dict(zip(graph.inputs, inputs, strict=False)), env)

        return run_subgraph

    def _run_step(self, step: _Step, env: ChainMap) -> None:
        node = step.node
        try:
            args = [None if v is None else env[v] for v in node.inputs]
        except KeyError as err:
            raise OpError(f"{node.label}: input {err.args[0].name!r} has no value") from None
        ctx = step.ctx
        if step.has_subgraphs:
            ctx = replace(ctx, run_subgraph=self._subgraph_runner(env))
        try:
            result = step.op_def.impl(ctx, *args, **node.attributes)
        except TensorforgeError:
            raise
        except Exception as err:
            shapes = ", ".join(_describe(a) for a in args)
            raise OpError(f"{node.label} ({_op_name(node)}) failed on inputs ({shapes}): {err}") from err
        outputs = result if isinstance(result, tuple) else (result,)
        if len(outputs) < len(node.outputs) and any(v.name for v in node.outputs[len(outputs) :]):
            raise OpError(f"{node.label} produced {len(outputs)} outputs, the graph expects {len(node.outputs)}")
        for value, output in zip(node.outputs, outputs, strict=False):
            if value.name:
                env.maps[0][value] = output
        for value in step.release:
            env.maps[0].pop(value, None)


def bind_feeds(graph: Graph, feeds: Mapping[str, Any], device: torch.device, *, copy: bool = True) -> dict[Value, Any]:
    """`feeds` checked against `graph`'s inputs (names, dtypes, shapes, symbolic dims that must agree) and
    converted to tensors on `device` (`copy`: whether numpy arrays are copied, `tensors.from_numpy`); every problem
    is reported at once in one `InputError`."""
    required = [v for v in graph.inputs if v.name not in graph.initializers]
    by_name = {v.name: v for v in graph.inputs}
    problems = []
    for name in feeds:
        if name not in by_name:
            hint = _suggest(name, [v.name for v in required if v.name not in feeds] or list(by_name))
            problems.append(f"unknown input {name!r}{hint} (inputs are {sorted(by_name)})")
    for value in required:
        if value.name not in feeds:
            problems.append(f"missing input {value.name!r} ({format_type(value.dtype, value.shape)})")
    env: dict[Value, Any] = {}
    symbols: dict[str, tuple[int, str]] = {}
    for name, data in feeds.items():
        value = by_name.get(name)
        if value is None:
            continue
        tensor = _feed_to_device(data, device, copy)
        problems.extend(_check_feed(value, tensor, symbols))
        env[value] = tensor
    if problems:
        raise InputError("bad inputs:\n  " + "\n  ".join(problems))
    return env


@dataclass(frozen=True, slots=True)
class Unsupported:
    """A node the registry cannot run, and why."""

    domain: str
    op_type: str
    opset: int
    node: str
    reason: str


def find_unsupported(model: Model) -> list[Unsupported]:
    """Every node (subgraphs included) whose op, opset or attributes the registry lacks."""
    load_all()
    found = []
    for node in model.graph.all_nodes():
        opset = model.opset(node.domain)
        domain = node.domain or "ai.onnx"
        op_def = REGISTRY.lookup(node.op_type, node.domain, opset)
        if op_def is None:
            known = REGISTRY.known(node.op_type, node.domain)
            reason = f"not supported at opset {opset}" if known else "not supported"
            found.append(Unsupported(domain, node.op_type, opset, _short_label(node), reason))
            continue
        unknown = op_def.check_attributes(node)
        if unknown:
            reason = f"attributes {unknown} are not supported"
            found.append(Unsupported(domain, node.op_type, opset, _short_label(node), reason))
    return found


def check_supported(model: Model) -> None:
    """Raise one `UnsupportedError` that lists every unsupported op with its domain, opset and nodes."""
    found = find_unsupported(model)
    if not found:
        return
    grouped: dict[tuple[str, str, int, str], list[str]] = {}
    for item in found:
        grouped.setdefault((item.domain, item.op_type, item.opset, item.reason), []).append(item.node)
    lines = []
    for (domain, op_type, opset, reason), names in sorted(grouped.items()):
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        lines.append(f"{domain}::{op_type} (opset {opset}) {reason}: nodes {', '.join(names[:5])}{more}")
    raise UnsupportedError(f"the model uses {len(grouped)} unsupported op(s) or attribute(s):\n  " + "\n  ".join(lines))


def _suggest(name: str, candidates: list[str]) -> str:
    """ "; did you mean 'x'?" for the candidate closest to `name` (ignoring case), or ""."""
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.5)
    return f"; did you mean {lowered[close[0]]!r}?" if close else ""


def _short_label(node: Node) -> str:
    if node.name:
        return repr(node.name)
    first = next((v.name for v in node.outputs if v.name), "?")
    return f"(unnamed, output {first!r})"


def _reads(node: Node) -> list[Value]:
    """Values a node reads, including those its subgraphs capture from enclosing scopes."""
    values = [v for v in node.inputs if v is not None]
    for sub in node.subgraphs():
        inner = set()
        for inner_node in sub.all_nodes():
            inner.update(inner_node.outputs)
        for inner_node in sub.all_nodes():
            values.extend(v for v in inner_node.inputs if v is not None and v not in inner)
        values.extend(v for v in sub.outputs if v not in inner)
    return values


def _check_feed(value: Value, tensor: Any, symbols: dict[str, tuple[int, str]]) -> list[str]:
    if isinstance(tensor, list) or tensor is None:
        return []
    problems = []
    actual = DType.STRING if isinstance(tensor, np.ndarray) else DType.from_torch(tensor.dtype)
    expected = value.dtype
    if expected != DType.UNDEFINED and expected.has_torch and actual != expected and expected.torch != tensor.dtype:
        problems.append(f"input {value.name!r} has dtype {actual}, the model expects {expected}")
    if value.shape is not None:
        shape = tuple(tensor.shape)
        if len(shape) != len(value.shape):
            problems.append(
                f"input {value.name!r} has shape {list(shape)} (rank {len(shape)}), "
                f"the model expects rank {len(value.shape)}: {format_type(expected, value.shape)}"
            )
        else:
            for axis, (got, want) in enumerate(zip(shape, value.shape, strict=True)):
                if isinstance(want, int) and want != got:
                    problems.append(
                        f"input {value.name!r} has size {got} on axis {axis}, the model expects {want} "
                        f"(shape {list(shape)} vs {format_type(expected, value.shape)})"
                    )
                elif isinstance(want, str):
                    seen = symbols.setdefault(want, (got, value.name))
                    if seen[0] != got:
                        problems.append(
                            f"input {value.name!r} has size {got} on axis {axis} ({want!r}), but input "
                            f"{seen[1]!r} gave {want!r} = {seen[0]}"
                        )
    return problems


def _feed_to_device(data: Any, device: torch.device, copy: bool) -> Any:
    """A feed as a tensor on `device`; a sequence (list) element-wise, an empty optional (None) as is."""
    if isinstance(data, list):
        return [_feed_to_device(item, device, copy) for item in data]
    return None if data is None else from_any(data, device, copy=copy)


def _to_device(const: Any, device: torch.device) -> Any:
    return const.to(device) if isinstance(const, torch.Tensor) else const


def _describe(arg: Any) -> str:
    if isinstance(arg, torch.Tensor):
        return f"{DType.from_torch(arg.dtype)}{list(arg.shape)}" if arg.dtype in _KNOWN else str(arg.dtype)
    if isinstance(arg, np.ndarray):
        return f"str{list(arg.shape)}"
    if isinstance(arg, list):
        return f"sequence[{len(arg)}]"
    return "none" if arg is None else type(arg).__name__


def _op_name(node: Node) -> str:
    return f"{node.domain or 'ai.onnx'}::{node.op_type}"


_KNOWN = {d.torch for d in DType if d.has_torch}
