"""HuggingFace transformers' architectures for the coverage benchmark, each from a tiny config with random weights.

A case is a model type of transformers' base-model mapping (`MODEL_MAPPING_NAMES`: `bert` ->
`BertModel`). Its config class's defaults are shrunk by attribute name (widths 32, 2 heads of 16,
2 layers, feed-forward 64, 4 experts, vocabularies of 99, 32-pixel images in 4-pixel patches but
where attention is windowed, per-stage depths 1; the same rules inside every sub-config), with
eager attention and no cache, and the model is built with random weights (nothing is
downloaded). Its inputs follow the model's main input (token ids, pixels, video frames, audio
features or samples): the first set of candidates the torch model runs on, in eval mode, is the
case's sample. A model whose config these rules do not fit, or whose forward needs inputs
beyond those (boxes, image grids, a tracking session), is reported as not built.
"""
from __future__ import annotations

import inspect
import re

from flaxport.bench.coverage.runner import select
from flaxport.errors import first_line

WIDTH = 32
HEADS = 2
HEAD_DIM = WIDTH // HEADS
LAYERS = 2
FFN = 64
EXPERTS = 4
VOCAB = 99
BATCH = 2
SEQUENCE = 7

# attribute name -> small value (applied when the default is a larger int)
_SMALL = {
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
                     "num_encoder_layers", "num_decoder_layers", "decoder_num_layers", "depth", "num_blocks",
                     "text_layers", "vision_layers", "num_adapter_layers"), LAYERS),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "hidden_dim", "dim", "embedding_size",
                     "projection_dim", "encoder_hidden_size", "decoder_hidden_size", "text_hidden_size",
                     "vision_hidden_size", "out_hidden_size", "projector_hidden_size", "output_hidden_size",
                     "word_embed_proj_dim", "d_embed", "hidden_size_per_layer_input", "embedding_dim",
                     "kv_lora_rank", "q_lora_rank", "fpn_hidden_size", "latent_dim"), WIDTH),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "decoder_num_attention_heads", "attention_heads",
                     "swa_num_attention_heads", "linear_num_value_heads", "index_n_heads"), HEADS),
    **dict.fromkeys(("head_dim", "d_kv", "v_head_dim", "qk_nope_head_dim", "qk_rope_head_dim", "swa_head_dim",
                     "linear_key_head_dim", "linear_value_head_dim", "index_head_dim", "dim_head", "attention_head_size"),
                    HEAD_DIM),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
                     "mlp_dim", "ffn_hidden_size", "decoder_intermediate_size", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "intermediate_dim"), FFN),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), EXPERTS),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_source_positions", "max_target_positions"), 128),
    "image_size": 32, "patch_size": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "rotary_dim": HEAD_DIM // 2, "rotary_emb_dim": HEAD_DIM // 2, "mamba_n_groups": 1,
    "n_groups": 1, "entity_emb_size": WIDTH, "image_token_embed_dim": WIDTH, "num_frames": 4,
}
_KV_HEADS = ("num_key_value_heads", "swa_num_key_value_heads", "linear_num_key_heads")
_LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "encoder_layers", "decoder_layers")


def names(filter: str | None = None) -> list[str]:
    """Every model type with a base model class, sorted; those `filter` selects (runner.select)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    return select(sorted(MODEL_MAPPING_NAMES), filter)


def build(name: str) -> list[tuple]:
    """[(model in eval mode, args, kwargs)]: the architecture `name` from a tiny config, with the
    first candidate inputs it runs on (token ids (2, 7), images (2, C, 32, 32), ...)."""
    from flaxport.bench.zoos import import_torchvision

    import_torchvision()  # transformers' image utilities import it
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    class_name = MODEL_MAPPING_NAMES[name]
    class_name = class_name if isinstance(class_name, str) else class_name[0]
    config = tiny_config(CONFIG_MAPPING[name]())
    torch.manual_seed(0)
    model = getattr(transformers, class_name)._from_config(config, dtype=torch.float32).eval()
    failures = []
    for args, kwargs in candidate_inputs(model, config):
        try:
            with torch.no_grad():
                model(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the next candidate may fit
            failures.append(f"{type(e).__name__}: {first_line(e, 160)}")
            continue
        return [(model, args, kwargs)]
    raise RuntimeError(f"no candidate input runs the torch model ({len(failures)} tried; the first: {failures[0]})")


def tiny_config(config):
    """`config` (and every sub-config) shrunk by attribute name, eager attention, no cache. -> config"""
    for key in getattr(type(config), "sub_configs", {}):
        sub = getattr(config, key, None)
        if hasattr(sub, "to_dict"):
            tiny_config(sub)
    settings = {k: v for k, v in vars(config).items() if not k.startswith("_")}
    layers = next((v for k in _LAYER_COUNTS if type(v := settings.get(k)) is int and v > LAYERS), None)
    heads = settings.get("num_attention_heads")
    stages = next((len(v) for k, v in settings.items() if "depths" in k and isinstance(v, (list, tuple))), None)
    for key, value in settings.items():
        if key in ("image_size", "patch_size") and type(settings.get("window_size")) is int:
            continue  # windowed attention (Swin) needs every stage at least a window wide: the image stays
        if type(value) is int and key in _SMALL and value > _SMALL[key] and not (key == "num_layers" and stages):
            setattr(config, key, _SMALL[key])
        elif type(value) is int and key in _KV_HEADS and value > 1:
            # grouped-query attention stays grouped (one key/value head), multi-head stays multi-head
            setattr(config, key, HEADS if type(heads) is int and value >= heads else 1)
        elif type(value) is int and key.endswith(("vocab_size", "codebook_size")) and value > VOCAB:
            setattr(config, key, VOCAB)
        elif isinstance(value, (list, tuple)) and value and all(type(v) is int for v in value):
            setattr(config, key, type(value)(_shrunk_list(key, list(value), layers)))
        elif isinstance(value, (list, tuple)) and layers and len(value) == layers:  # per-layer settings (layer_types)
            setattr(config, key, type(value)(value[:LAYERS]))
        elif isinstance(value, dict) and isinstance(value.get("mrope_section"), list):  # rotary sections of a head
            setattr(config, key, {**value, "mrope_section": _sections(value["mrope_section"], HEAD_DIM // 2)})
    _state_space_heads(config)
    if hasattr(config, "vocab_size") and type(config.vocab_size) in (int, type(None)):
        config.vocab_size = max(min(config.vocab_size or VOCAB, VOCAB), _largest_token_id(config) + 1)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    config._attn_implementation = "eager"
    return config


def _shrunk_list(key: str, value: list, layers: int | None) -> list:
    """Per-stage depths become 1 each, per-stage heads 1 each (per-stage widths stay: bottleneck and
    group-norm ratios hang on them); layer indices stay below the new layer count; a per-layer list is
    cut to the new layer count."""
    if "depth" in key or key in ("num_layers", "stage_num_blocks", "blocks_per_stage", "num_block_repeats"):
        return [1] * len(value)
    if "head" in key:
        return [1] * len(value)
    if layers and re.search(r"index|indices|idx|layer_ids", key) and max(value) < layers:
        return sorted({min(v, LAYERS - 1) for v in value})
    if layers and len(value) == layers:
        return value[:LAYERS]
    return value


def _sections(sections: list, total: int) -> list:
    """`sections` scaled to sum to `total`, each at least 1 (the last takes the rounding)."""
    scaled = [max(1, s * total // sum(sections)) for s in sections[:-1]]
    return scaled + [max(1, total - sum(scaled))]


def _state_space_heads(config) -> None:
    """Mamba-style mixers: heads x head size must equal expand x hidden size after shrinking."""
    for heads, size, expand in (("num_heads", "head_dim", "expand"), ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
                                ("n_mamba_heads", "mamba_headdim", "mamba_expand")):
        values = [getattr(config, k, None) for k in (heads, size, expand)]
        if type(values[2]) is not int or type(values[0]) is not int or type(getattr(config, "hidden_size", None)) is not int:
            continue
        inner = values[2] * config.hidden_size
        if type(values[1]) is int:
            setattr(config, heads, max(1, inner // values[1]))
        else:  # a head size derived from the heads ("auto")
            setattr(config, heads, max(1, inner // HEAD_DIM))


def _largest_token_id(config) -> int:
    """The largest special token id the config names (embeddings must hold it)."""
    ids = []
    for key, value in vars(config).items():
        if not re.search(r"token_(id|index)$", key):
            continue
        for v in value if isinstance(value, list) else [value]:
            if type(v) is int:
                ids.append(v)
    return max(ids, default=0)


def candidate_inputs(model, config):
    """(args, kwargs) candidates for `model`'s forward, most likely first: its main input (token
    ids, pixels, audio features or samples), with decoder token ids where it takes them."""
    import torch

    g = torch.Generator().manual_seed(0)
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    # the smallest vocabulary of the model and its text part (an image model's may be larger)
    vocab = min([v for c in (config, _text_config(config)) if type(v := getattr(c, "vocab_size", None)) is int]
                or [VOCAB])
    # below the special tokens (an image token in the ids asks for images)
    high = max(2, min(vocab, _smallest_special_id(config) or vocab))

    def ids(length=SEQUENCE):
        return torch.randint(0, high, (BATCH, length), generator=g)

    def extra(kwargs):
        if "decoder_input_ids" in params and "decoder_input_ids" not in kwargs:
            kwargs["decoder_input_ids"] = ids()
        return kwargs

    if main == "input_ids" or main not in params and "input_ids" in params:
        for length in (SEQUENCE, 16, 64):
            yield _positional(params, extra({"input_ids": ids(length)}))
        if "attention_mask" in params:  # some forwards read the mask's device or length
            yield _positional(params, extra({"input_ids": ids(), "attention_mask": torch.ones(BATCH, SEQUENCE, dtype=torch.long)}))
        if "pixel_values" in params:
            for side in _image_sides(config):
                yield _positional(params, extra({"input_ids": ids(), "pixel_values": _pixels(config, side, g)}))
    elif main == "pixel_values":
        for side in _image_sides(config):
            kwargs = {"pixel_values": _pixels(config, side, g)}
            frames = getattr(_vision_config(config), "num_frames", None)
            if type(frames) is int:  # a video model: (batch, frames, channels, height, width)
                kwargs["pixel_values"] = torch.stack([kwargs["pixel_values"]] * frames, 1)
            yield _positional(params, extra(dict(kwargs)))
            if "input_ids" in params:
                yield _positional(params, extra({**kwargs, "input_ids": ids()}))
    elif main == "input_features":
        bins = _first_int(config, ("num_mel_bins", "feature_size", "input_feat_per_channel", "input_dim")) or 80
        frames = [2 * p for p in [_first_int(config, ("max_source_positions",))] if p] + [64, 128, 400, 3000]
        for n in frames:
            yield _positional(params, extra({"input_features": torch.randn(BATCH, bins, n, generator=g)}))
            yield _positional(params, extra({"input_features": torch.randn(BATCH, n, bins, generator=g)}))
    elif main == "input_values":
        for n in (1600, 4000, 16000):
            yield _positional(params, extra({"input_values": torch.randn(BATCH, n, generator=g)}))
            yield _positional(params, extra({"input_values": torch.randn(BATCH, 1, n, generator=g)}))
    elif main == "inputs_embeds" or main not in params and "inputs_embeds" in params:
        width = getattr(config, "hidden_size", WIDTH)
        yield _positional(params, extra({"inputs_embeds": torch.randn(BATCH, SEQUENCE, width, generator=g)}))


def _positional(params, kwargs) -> tuple:
    """The forward's first parameter positionally (as users call model(x)), the rest by keyword."""
    first = next(iter(params), None)
    if first in kwargs:
        value = kwargs.pop(first)
        return (value,), kwargs
    return (), kwargs


def _text_config(config):
    return getattr(config, "text_config", None)


def _smallest_special_id(config) -> int | None:
    ids = []
    for c in (c for c in (config, _text_config(config)) if c is not None):
        for key, value in vars(c).items():
            if re.search(r"(image|video|audio|vision|boi|eoi|boa|eoa).*token_(id|index)$", key) and type(value) is int:
                ids.append(value)
    return min((i for i in ids if i > 2), default=None)


def _first_int(config, keys) -> int | None:
    for c in (config, getattr(config, "audio_config", None), getattr(config, "encoder_config", None)):
        for k in keys:
            v = getattr(c, k, None) if c is not None else None
            if type(v) is int:
                return v
    return None


def _vision_config(config):
    return getattr(config, "vision_config", None) or config


def _image_sides(config) -> list[int]:
    size = getattr(_vision_config(config), "image_size", None)
    size = size[0] if isinstance(size, (list, tuple)) else size
    return list(dict.fromkeys([s for s in (size, 32, 64, 224) if isinstance(s, int)]))


def _pixels(config, side, g):
    import torch

    channels = getattr(_vision_config(config), "num_channels", 3)
    return torch.randn(BATCH, channels if isinstance(channels, int) else 3, side, side, generator=g)
