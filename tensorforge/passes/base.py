"""Pass infrastructure: rules (match → check → rewrite), passes, and the record of what they did.

A `Rule` looks at one node at a time: `match` says whether the node is the root of its pattern and
gathers what the rewrite needs, `check` returns the reason it declines (or None), and `rewrite` changes
the graph. A `RulePass` applies a list of rules to every node until none fires. Passes report every
rewrite and every declined match to the `PassContext`, which is how `tensorforge inspect --optimize`
can say what fired where and why something did not.

Provenance is kept here too, so that rules need no bookkeeping of their own. `mark_origins` records, before
the first pass, that each node and value stands for itself. Each rewrite runs inside `PassContext.rewriting`:
every node it adds stands for every node it removes (`Node.origins` merged, producers first), and a rewrite
that only removes nodes leaves their origins with its surviving root (an inner Transpose merged into the
outer). `utils` hands a replaced value's `origin` to the value that replaces it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..ir import Graph, Model, Node, Value, qualified_op


@dataclass(frozen=True, slots=True)
class Event:
    """One thing a pass did (`fired`) or chose not to do (`declined`), at a node."""

    pass_name: str
    rule: str
    status: str  # "fired" | "declined" | "failed"
    node: str
    detail: str = ""


@dataclass
class PassContext:
    """What a pass may use besides the graph: the model (opsets), the event log and fresh names."""

    model: Model
    events: list[Event] = field(default_factory=list)
    pass_name: str = ""
    _counter: Iterable[int] = field(default_factory=itertools.count)
    _names: set[str] | None = None

    def opset(self, domain: str = "") -> int:
        return self.model.opset(domain)

    def fired(self, rule: str, node: Node | str, detail: str = "") -> None:
        self.events.append(Event(self.pass_name, rule, "fired", _label(node), detail))

    def declined(self, rule: str, node: Node | str, reason: str) -> None:
        self.events.append(Event(self.pass_name, rule, "declined", _label(node), reason))

    def fresh_name(self, hint: str) -> str:
        """A value or node name not used anywhere in the model, derived from `hint`."""
        if self._names is None:
            self._names = _all_names(self.model.graph)
        for index in self._counter:
            name = f"{hint}__tf{index}"
            if name not in self._names:
                self._names.add(name)
                return name
        raise AssertionError("unreachable")

    def new_value(self, hint: str, like: Value | None = None, const: Any = None) -> Value:
        value = Value(self.fresh_name(hint))
        if like is not None:
            value.dtype, value.shape = like.dtype, like.shape
        value.const = const
        return value

    @contextmanager
    def rewriting(self, root: Node | None = None) -> Iterator[None]:
        """Around one rewrite of the top-level graph: the nodes it adds inherit the origins of the nodes it
        removes; when it adds none, `root` does (if it survives)."""
        graph = self.model.graph
        before = {node: node.inputs for node in graph.nodes}
        yield
        removed = [node for node in before if node.graph is not graph]
        if not removed:
            return
        added = [node for node in graph.nodes if node not in before]
        if added:
            heirs, donors = added, removed
        elif root is not None and root.graph is graph:
            heirs, donors = [root], [node for node in before if node.graph is not graph or node is root]
        else:
            return
        origins = [name for node in _producers_first(donors, before) for name in node.origins]
        for heir in heirs:
            heir.origins = tuple(dict.fromkeys([*origins, *heir.origins]))


class Pass:
    """A graph transformation. `run` changes `ctx.model` in place and returns whether it changed."""

    name: ClassVar[str] = "pass"

    def run(self, ctx: PassContext) -> bool:
        raise NotImplementedError


class Rule:
    """One rewrite rule; its docstring states the algebra."""

    name: ClassVar[str] = "rule"
    # Root op types this rule looks at: "Conv" for the ONNX domain, "tensorforge::FusedConv" for others;
    # empty means every node.
    op_types: ClassVar[Sequence[str]] = ()

    def match(self, node: Node, ctx: PassContext) -> Any | None:
        """What the rewrite needs if `node` roots this pattern, else None (silently: not a candidate)."""
        raise NotImplementedError

    def check(self, match: Any, ctx: PassContext) -> str | None:
        """Why the rule declines this match (e.g. "weight is shared with another node"), or None."""
        return None

    def rewrite(self, match: Any, ctx: PassContext) -> str:
        """Change the graph; return a short description of what was done."""
        raise NotImplementedError


class RulePass(Pass):
    """Applies its rules to every node of the top-level graph, repeatedly, until no rule fires."""

    rules: ClassVar[Sequence[type[Rule]]] = ()
    max_sweeps: ClassVar[int] = 50

    def run(self, ctx: PassContext) -> bool:
        rules = [rule() for rule in self.rules]
        graph = ctx.model.graph
        changed = False
        declined: set[tuple[str, int]] = set()
        for _ in range(self.max_sweeps):
            fired = False
            for node in graph.nodes:
                if node.graph is not graph:
                    continue  # removed by an earlier rewrite in this sweep
                kind = qualified_op(node)
                for rule in rules:
                    if rule.op_types and kind not in rule.op_types:
                        continue
                    match = rule.match(node, ctx)
                    if match is None:
                        continue
                    reason = rule.check(match, ctx)
                    if reason is not None:
                        key = (rule.name, id(node))
                        if key not in declined:
                            declined.add(key)
                            ctx.declined(rule.name, node, reason)
                        continue
                    label = _label(node)
                    with ctx.rewriting(node):
                        detail = rule.rewrite(match, ctx)
                    ctx.fired(rule.name, label, detail)
                    fired = changed = True
                    break
            if not fired:
                break
        return changed


def mark_origins(model: Model) -> None:
    """Record that each node and value of `model` stands for itself, unless a record exists already (a
    model optimized before keeps the origins it has)."""
    graph = model.graph
    if any(node.origins for node in graph.all_nodes()):
        return
    for node in graph.all_nodes():
        node.origins = (_label(node),)
        for value in node.outputs:
            value.origin = value.name or None
    for value in [*graph.inputs, *graph.initializers.values()]:
        value.origin = value.name or None


def _producers_first(nodes: list[Node], inputs: dict[Node, tuple[Value | None, ...]]) -> list[Node]:
    """`nodes` with each one after those of them it read from (`inputs`: what each read before the rewrite)."""
    inside = set(nodes)
    ordered: dict[Node, None] = {}
    seen: set[Node] = set()

    def visit(node: Node) -> None:
        seen.add(node)
        for value in inputs.get(node, ()):
            producer = value.producer() if value is not None else None
            if producer in inside and producer not in seen:
                visit(producer)
        ordered[node] = None

    for node in nodes:
        if node not in seen:
            visit(node)
    return list(ordered)


def _label(node: Node | str) -> str:
    if isinstance(node, str):
        return node
    if node.name:
        return node.name
    first = next((v.name for v in node.outputs if v.name), "?")
    return f"{node.op_type}({first})"


def _all_names(graph: Graph) -> set[str]:
    names = {v.name for v in graph.inputs} | set(graph.initializers)
    for node in graph.all_nodes():
        names.add(node.name)
        names.update(v.name for v in node.outputs)
    return names
