"""The coverage benchmark: how many of a zoo's models (or torch's ops) translate and pass the proof."""


def one_line(e: BaseException) -> str:
    """`Type: first line of the message` (an UnsupportedOpsError: its distinct ops on that line)."""
    from flaxport.translate.errors import UnsupportedOpsError

    if isinstance(e, UnsupportedOpsError):
        ops = list(dict.fromkeys(op for op, _, _ in e.items))
        return f"UnsupportedOpsError: no translation for {', '.join(ops)}"
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__
