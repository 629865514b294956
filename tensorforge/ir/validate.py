"""Graph validation: every value defined once and before use, no cycles, outputs produced."""

from __future__ import annotations

from ..errors import GraphError
from .graph import Graph, Node, Value


def topological_order(graph: Graph) -> list[Node]:
    """Nodes in an order where producers come before users; stable for already sorted graphs.

    Values from outside `graph` (graph inputs, initializers, outer scopes) count as available. Raises
    `GraphError` naming the nodes of a cycle.
    """
    nodes = graph.nodes
    members = set(nodes)
    pending: dict[Node, int] = {}
    users: dict[Node, list[Node]] = {node: [] for node in nodes}
    for node in nodes:
        deps = {dep for dep in _dependencies(node) if dep in members and dep is not node}
        pending[node] = len(deps)
        for dep in deps:
            users[dep].append(node)
    ready = [node for node in nodes if pending[node] == 0]
    ready.reverse()
    order: list[Node] = []
    while ready:
        node = ready.pop()
        order.append(node)
        released = []
        for user in users[node]:
            pending[user] -= 1
            if pending[user] == 0:
                released.append(user)
        ready.extend(reversed(released))
    if len(order) != len(nodes):
        stuck = [node.label for node in nodes if pending[node] > 0]
        shown = ", ".join(stuck[:8]) + (" ..." if len(stuck) > 8 else "")
        raise GraphError(f"graph {graph.name!r} has a cycle through {len(stuck)} nodes: {shown}")
    return order


def _dependencies(node: Node) -> set[Node]:
    """Producers of the node's inputs, including values its subgraphs capture from outer scopes."""
    deps = {v.producer() for v in node.inputs if v is not None and v.producer() is not None}
    for sub in node.subgraphs():
        for inner in sub.all_nodes():
            for value in inner.inputs:
                if value is not None and value.producer() is not None and value.producer().graph is node.graph:
                    deps.add(value.producer())
    return deps


def validate(graph: Graph) -> None:
    """Raise `GraphError` for dangling inputs, doubly defined values, cycles or unproduced outputs."""
    _validate(graph, visible=set())


def _validate(graph: Graph, visible: set[Value]) -> None:
    problems: list[str] = []
    defined: dict[str, Value] = {}

    def define(value: Value, where: str) -> None:
        if not value.name:
            return
        other = defined.get(value.name)
        if other is not None and other is not value:
            problems.append(f"value {value.name!r} is defined twice (again by {where})")
        defined[value.name] = value

    for value in graph.inputs:
        define(value, f"graph input of {graph.name!r}")
    for value in graph.initializers.values():
        define(value, "an initializer")
    for node in graph.nodes:
        if node.graph is not graph:
            problems.append(f"{node.label} is listed in graph {graph.name!r} but belongs elsewhere")
        for value in node.outputs:
            define(value, node.label)
    scope = visible | set(defined.values())
    for node in graph.nodes:
        for index, value in enumerate(node.inputs):
            if value is not None and value not in scope:
                problems.append(f"{node.label} reads input {index} {value.name!r}, which nothing defines")
        for sub in node.subgraphs():
            try:
                _validate(sub, scope)
            except GraphError as err:
                problems.append(f"in subgraph {sub.name!r} of {node.label}: {err}")
    for value in graph.outputs:
        if value not in scope:
            problems.append(f"graph output {value.name!r} is not produced by any node, input or initializer")
    if problems:
        raise GraphError(f"graph {graph.name!r} is invalid:\n  " + "\n  ".join(problems))
    topological_order(graph)
