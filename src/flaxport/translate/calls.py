"""What a module's calls differ in, made arguments of its `__call__`: constants in the same code
become parameters the callers pass, different code becomes branches on the argument that chose it
(or on a numbered variant). Found after every call is rendered once (classes.render_bodies)."""
from __future__ import annotations


from flaxport.translate.naming import safe_name
from flaxport.translate.plan import MARK, VAGUE_HINTS, CallConstants, Line, body_lines, hashable


def constants_calls_differ_in(plan, bodies: dict) -> CallConstants:
    """What a module's calls differ in, where they differ, made arguments of its `__call__`:
    constants in the same code (`self.scale(x, 2.0)`, then 3.0: one parameter per vector of values
    over the calls), or the code itself where an argument torch was called with tells the calls
    apart (HF ModernBERT's rotary embedding reads `{layer_type}_inv_freq`: one branch per value)."""
    found = CallConstants()
    for path, kind in plan.kinds.items():
        if kind != "generated":
            continue
        calls: dict = {}
        for mode, frame in plan.frames_by_path.get(path, []):
            body = bodies.get((mode, frame.key))
            if body is not None:
                calls.setdefault(mode, []).append((frame, body_lines(body), body.params))
        if all(len(items) < 2 for items in calls.values()):
            continue
        differ = [mode for mode, items in calls.items() if len({_code(lines) for _, lines, _ in items}) > 1]
        if not differ:
            continue
        # one eager run of the model, for modules whose calls differ only
        arguments = _arguments_passed(plan, path, len(max(calls.values(), key=len)))
        names: dict = {}  # value vector (or branching argument) -> parameter name, shared by the modes
        passed: dict = {}  # (mode, frame key) -> {name: value}
        for mode, items in calls.items():
            params = items[0][2]
            if len({tuple(x.text for x in lines) for _, lines, _ in items}) > 1:
                arg = _branching_argument(items, arguments)
                if arg is not None:
                    chosen = arguments[arg]
                elif len({tuple(p) for _, _, p in items}) == 1:
                    # nothing the calls were given tells them apart (torch.export fixed a size in one
                    # call and not in another): each code is numbered, and each call passes its number
                    codes = [_code(lines) for _, lines, _ in items]
                    arg = next(n for n in ("variant", "variant_", "code_variant") if n not in params)
                    chosen = [list(dict.fromkeys(codes)).index(code) for code in codes]
                else:
                    continue
                # the argument's own name, unless a size read from it already is a parameter
                name = names.get(("branch", arg)) or (arg if arg not in params else f"{arg}_value")
                names[("branch", arg)] = name
                found.branches[(mode, path)] = name
                for i, (frame, _, _) in enumerate(items):
                    passed[(mode, frame.key)] = {name: chosen[i]}
                continue
            positions = {}
            first = items[0][1]
            for li, line in enumerate(first):
                for si, (_, hint) in enumerate(line.slots):
                    vector = tuple(hashable(lines[li].slots[si][0]) for _, lines, _ in items)
                    if len(set(vector)) == 1:
                        continue
                    if vector not in names:
                        carried = [name for name, values in arguments.items() if values == vector]
                        base = carried[0] if len(carried) == 1 else \
                            safe_name(hint) if hint and hint not in VAGUE_HINTS else "value"
                        taken = set(names.values()) | set(params)
                        names[vector] = next(n for n in [base, *(f"{base}{k}" for k in range(2, 1000))] if n not in taken)
                    positions[(li, si)] = names[vector]
            if positions:
                found.positions[(mode, path)] = positions
                for frame, lines, _ in items:
                    passed[(mode, frame.key)] = {name: lines[li].slots[si][0] for (li, si), name in positions.items()}
        every = set(names.values())
        if every and all(set(passed.get((mode, f.key), {})) == every for mode, items in calls.items() for f, _, _ in items):
            found.params[path] = list(names.values())
            for key in [(mode, f.key) for mode, items in calls.items() for f, _, _ in items]:
                found.values[key] = [(passed[key][n], n) for n in found.params[path]]
        else:  # a mode that calls it once, or differently: left as it was (and refused, or disproved)
            for mode in calls:
                found.positions.pop((mode, path), None)
                found.branches.pop((mode, path), None)
    return found


def _code(lines) -> tuple:
    """What makes two renderings of a call the same code: their text and their constants."""
    return tuple(x.text for x in lines), tuple(map(hashable, (s[0] for x in lines for s in x.slots)))


def _branching_argument(items, arguments) -> str | None:
    """The argument whose value tells apart calls with different code (one value per code, each
    code its own value), where the calls read the same inputs; None where there is none."""
    if len({tuple(params) for _, _, params in items}) > 1 or not arguments:
        return None
    codes = [_code(lines) for _, lines, _ in items]
    for name, values in arguments.items():
        if len(values) != len(codes):
            continue
        by_value = {}
        for code, value in zip(codes, values):
            by_value.setdefault(value, set()).add(code)
        if all(len(c) == 1 for c in by_value.values()) and len({next(iter(c)) for c in by_value.values()}) == len(by_value):
            return name
    return None


def _arguments_passed(plan, path, calls: int) -> dict:
    """{forward parameter: (value per call)} of the literals (numbers, strings, None, tuples) the
    module at path is called with, from the plan's eager run (arguments.py): a constant that
    differs between calls takes the name of the argument that carried it (`factor`), and calls
    with different code branch on the argument that tells them apart (`layer_type`)."""
    seen = [{k: _plain(v) for k, v in call.literals.items()} for call in plan.recorded_calls(path)]
    if len(seen) != calls:  # names only: a model that will not run again keeps neutral names
        return {}
    return {k: tuple(s.get(k) for s in seen) for k in seen[0] if all(k in s for s in seen)}


def _plain(value):
    """A literal as the generated code writes it: torch.Size (a tuple) as a tuple."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    return hashable(value)


def as_parameters(lines, positions: dict) -> list:
    """Lines with the slots at positions ({(line, slot): name}) written as the parameter's name."""
    out = []
    for li, line in enumerate(lines):
        kept = []

        def sub(m):
            si = int(m.group(1))
            if (li, si) in positions:
                return positions[(li, si)]
            kept.append(line.slots[si])
            return f"\x00{len(kept) - 1}\x00"

        out.append(Line(MARK.sub(sub, line.text), tuple(kept)))
    return out


def branches(arg, calls) -> list:
    """`if layer_type == "full_attention": ... elif ...` over [(argument value, Lines)]."""
    codes: dict = {}
    for value, lines in calls:
        codes.setdefault(hashable(value), (value, lines))
    out = []
    for k, (value, lines) in enumerate(codes.values()):
        test = "is" if value is None or isinstance(value, bool) else "=="
        out.append(Line(f"{'if' if k == 0 else 'elif'} {arg} {test} \x000\x00:", ((value, arg),)))
        out += [Line("    " + line.text, line.slots) for line in lines]
    return out
