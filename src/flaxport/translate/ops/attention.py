"""torch's scaled_dot_product_attention (math form: masks, causal, scale, grouped-query, dropout)."""
from __future__ import annotations

from flaxport.translate.ops import TERNARY, Expr, call, op


@op("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(c, node):
    p = c.raw("dropout_p") if c.has("dropout_p") else 0.0
    p_other = c.twin_raw("dropout_p") or 0.0
    kwargs = {}
    if c.has("attn_mask"):
        kwargs["attn_mask"] = c.x("attn_mask")
    if p or p_other:
        if p != p_other and c.mode in ("eval", "train"):  # `dropout_p=p if self.training else 0.0`
            train_p, eval_p = (p, p_other) if c.mode == "train" else (p_other, p)
            kwargs["dropout_p"] = Expr(f"{c.lit(train_p, 'dropout_p')} if {c.training()} else {eval_p!r}", TERNARY)
        else:
            kwargs["dropout_p"] = c.lit(p, "dropout_p")
        kwargs["dropout_rng"] = c.dropout_rng()
    if c.has("is_causal") and c.raw("is_causal"):
        kwargs["is_causal"] = "True"
    if c.has("scale") and c.raw("scale") is not None:
        kwargs["scale"] = c.lit(c.raw("scale"), "scale")
    if c.has("enable_gqa") and c.raw("enable_gqa"):
        kwargs["enable_gqa"] = "True"
    return call(c.helper("scaled_dot_product_attention"), c.x("query"), c.x("key"), c.x("value"), **kwargs)
