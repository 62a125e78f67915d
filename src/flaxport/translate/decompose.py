"""Ops nothing translates, rewritten with torch's own decompositions.

torch.export keeps composite ops whole (hinge_embedding_loss, pairwise_distance, ...). Where
translating a graph finds ops neither the op table nor a layer class handles, the graph is
captured again with exactly those ops decomposed by torch's decomposition table (the one
torch.export uses by default), repeatedly while that leaves others, so a handler always
wins over a decomposition and only what neither handles is refused. An op whose decomposition
leaves ops nothing translates is not decomposed: it is refused under its own name, at the
user's line.
"""
from __future__ import annotations


def decomposable(problems) -> frozenset:
    """The op names among `problems` (a plan's unsupported-op texts, 'aten.x.default' first)
    that torch's table decomposes."""
    from torch.export import default_decompositions

    table = {str(op) for op in default_decompositions().keys()}
    return frozenset(text.split(":")[0].strip() for text in problems if text.split(":")[0].strip() in table)


def decompose_ops(program, names: frozenset):
    """`program` with the ops named `names` decomposed by torch's table."""
    from torch.export import default_decompositions

    table = default_decompositions()
    for op in list(table.keys()):
        if str(op) not in names:
            del table[op]
    return program.run_decompositions(table) if len(table) else program


def problem_ops(problems) -> set:
    """The op names of a plan's unsupported-op texts."""
    return {text.split(":")[0].strip() for text in problems}


def origins(captures, ops: set, decomposed: frozenset) -> set:
    """The decomposed ops (of `decomposed`) whose decomposition produced one of `ops` (torch.export
    records each new node's origin in meta['from_node'])."""
    found = set()
    for capture in captures:
        for node in capture.graph.nodes:
            if node.op == "call_function" and str(node.target) in ops:
                for origin in node.meta.get("from_node") or []:
                    name = str(getattr(origin, "target", ""))
                    if name in decomposed:
                        found.add(name)
    return found
