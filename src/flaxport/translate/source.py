"""Where a node came from in the user's source, and the names that statement gives its results.

torch.export records each node's Python stack. The translation groups the nodes of one
source statement into one generated statement, and names its result as the user did:
`out = self.bn1(out)` gives `out`, `q, k, v = self.qkv(x).split(c, dim=2)` gives `q`, `k`,
`v`. Only frames in the user's files count (torch's own files only for the forward of a
torch class being translated, e.g. nn.MultiheadAttention).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import linecache
import re

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


@dataclasses.dataclass(frozen=True)
class Statement:
    key: tuple  # (file, first line, column): identifies the statement
    targets: tuple  # names assigned, in order (None where not a plain name); () if none
    is_return: bool
    text: str  # the statement's first line, stripped
    calls: int = 1  # function calls written in it (a loop running it again calls more)
    loops: bool = False  # inside a for/while loop, or holding a comprehension: it may run again
    self_calls: tuple = ()  # attributes of self it calls (`self.encode(x)`: ('encode',))
    # per target, the names a nested tuple unpacks: `out, (h, c) = ...` gives ((), ('h', 'c'))
    inner_targets: tuple = ()


def frames(node) -> list:
    """[(file, line, function)] of the node's recorded stack, outermost first."""
    trace = node.meta.get("stack_trace") or ""
    return [(f, int(line), fn) for f, line, fn, _ in _FRAME.findall(trace)]


def _torch_internal(file: str) -> bool:
    return "/torch/" in file or file.startswith("<")


def statement(node, class_file: str | None) -> Statement | None:
    """The innermost user statement that produced `node` (None when export recorded none)."""
    for file, line, _ in reversed(frames(node)):
        if _torch_internal(file) and file != class_file:
            continue
        stmt = _statement_at(file, line)
        if stmt is not None:
            return stmt
    return None


@functools.lru_cache(maxsize=1024)
def class_lines(cls) -> tuple:
    """(file, first line, last line) of cls's source and of the class defining its forward."""
    spans = []
    for c in (cls, next((k for k in cls.__mro__ if "forward" in vars(k)), None)):
        if c is None:
            continue
        try:
            lines, start = inspect.getsourcelines(c)
            spans.append((inspect.getsourcefile(c), start, start + len(lines) - 1))
        except (TypeError, OSError):
            pass
    return tuple(spans)


def call_statement(nodes, cls) -> Statement | None:
    """The statement in cls's own code (its methods) from which a child module was called."""
    spans = class_lines(cls)
    for node in nodes:
        for file, line, _ in reversed(frames(node)):
            if any(f == file and lo <= line <= hi for f, lo, hi in spans):
                return _statement_at(file, line)
    return None


def user_line(node) -> str:
    """'file:line `code`' of the deepest user frame, for error messages."""
    for file, line, _ in reversed(frames(node)):
        if not _torch_internal(file):
            code = linecache.getline(file, line).strip()
            return f"{file}:{line} `{code}`" if code else f"{file}:{line}"
    return ""


@functools.lru_cache(maxsize=256)
def _tree(file: str):
    try:
        lines = linecache.getlines(file)
        return ast.parse("".join(lines)) if lines else None
    except (SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=4096)
def _statement_at(file: str, line: int) -> Statement | None:
    tree = _tree(file)
    if tree is None:
        return None
    best = None
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.stmt) and not isinstance(stmt, _COMPOUND) and \
                stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            if best is None or stmt.lineno >= best.lineno:
                best = stmt
    if best is None:
        return None
    targets: tuple = ()
    inner: tuple = ()
    if isinstance(best, ast.Assign):
        targets = _names(best.targets[0])
        if isinstance(best.targets[0], (ast.Tuple, ast.List)):
            inner = tuple(_names(e) if isinstance(e, (ast.Tuple, ast.List)) else () for e in best.targets[0].elts)
    elif isinstance(best, (ast.AugAssign, ast.AnnAssign)):
        targets = _names(best.target)
    text = linecache.getline(file, best.lineno).strip()
    calls = [n for n in ast.walk(best) if isinstance(n, ast.Call)]
    loops = any(isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) for n in ast.walk(best)) or \
        any(isinstance(n, (ast.For, ast.AsyncFor, ast.While)) and n.body[0].lineno <= best.lineno <= (n.end_lineno or 0)
            for n in ast.walk(tree))
    self_calls = tuple(c.func.attr for c in calls if isinstance(c.func, ast.Attribute)
                       and isinstance(c.func.value, ast.Name) and c.func.value.id == "self")
    return Statement((file, best.lineno, best.col_offset), targets, isinstance(best, ast.Return), text,
                     max(len(calls), 1), loops, self_calls, inner)


_COMPOUND = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
             ast.AsyncFor, ast.AsyncWith)


def _names(target) -> tuple:
    if isinstance(target, ast.Name):
        return (target.id,)
    if isinstance(target, (ast.Tuple, ast.List)):
        return tuple(e.id if isinstance(e, ast.Name) else None for e in target.elts)
    return (None,)


def class_file(cls) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except (TypeError, OSError):
        return None


def forward_parameters(cls) -> list:
    """Names of the forward's parameters (after self)."""
    try:
        params = list(inspect.signature(cls.forward).parameters.values())[1:]
    except (TypeError, ValueError, AttributeError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _statement_node(file: str, line: int):
    """The ast statement at `line` of `file`, or None."""
    stmt = _statement_at(file, line)
    if stmt is None:
        return None
    for node in ast.walk(_tree(file)):
        if isinstance(node, ast.stmt) and node.lineno == stmt.key[1] and node.col_offset == stmt.key[2]:
            return node
    return None


def names_read_on_line(file: str, line: int) -> list:
    """The names the statement at `line` reads, each once, in the order they are written."""
    node = _statement_node(file, line)
    if node is None:
        return []
    reads = [n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return list(dict.fromkeys(n.id for n in sorted(reads, key=lambda n: (n.lineno, n.col_offset))))


def names_on_line(file: str, line: int) -> set:
    node = _statement_node(file, line)
    return set() if node is None else {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
