"""torch's scaled_dot_product_attention (math form: masks, causal, scale, grouped-query, dropout)."""
from __future__ import annotations

from flaxport.translate.ops.table import call, op


@op("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(c, node):
    p = c.raw("dropout_p") if c.has("dropout_p") else 0.0
    p_other = c.twin_raw("dropout_p") or 0.0
    kwargs = {}
    if c.has("attn_mask"):
        kwargs["attn_mask"] = c.x("attn_mask")
    if p or p_other:  # torch's `dropout_p=p if self.training else 0.0`: an nnx.Dropout, off in eval mode
        rate = p or p_other
        kwargs["dropout"] = c.submodule("attention_dropout", f"nnx.Dropout({rate!r}, rngs=rngs)")
        if p and p_other:  # a dropout_p whatever the mode: torch drops in eval mode too
            kwargs["dropout"] = f"functools.partial({kwargs['dropout']}, deterministic=False)"
    if c.has("is_causal") and c.raw("is_causal"):
        kwargs["is_causal"] = "True"
    if c.has("scale") and c.raw("scale") is not None:
        kwargs["scale"] = c.lit(c.raw("scale"), "scale")
    if c.has("enable_gqa") and c.raw("enable_gqa"):
        kwargs["enable_gqa"] = "True"
    return call(c.helper("scaled_dot_product_attention"), c.x("query"), c.x("key"), c.x("value"), **kwargs)
