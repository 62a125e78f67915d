"""The op table, op by op, against torch's own kernels (flaxport.translate.optest.run_op)."""
import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from flaxport.translate import marks  # noqa: E402

aten = torch.ops.aten
G = torch.Generator().manual_seed(0)


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=G, dtype=dtype)


def ri(high, *shape):
    return torch.randint(0, high, shape, generator=G)


def pos(*shape):
    return torch.rand(*shape, generator=G) + 0.5


# (id, op, args, kwargs): torch's ATen call; the translation must give the same values.
CASES = [
    # elementwise: promotion, torch's division and remainder rules
    ("add_alpha", aten.add.Tensor, (r(3, 4), r(4)), {"alpha": 2}),
    ("add_scalar", aten.add.Tensor, (r(3, 4), 1.5), {}),
    ("sub", aten.sub.Tensor, (r(3, 4), r(3, 1)), {}),
    ("rsub", aten.rsub.Scalar, (r(3, 4), 2.0), {}),
    ("mul_int_float", aten.mul.Tensor, (ri(5, 3, 4), 0.5), {}),
    ("div_true_ints", aten.div.Tensor, (ri(9, 6) - 4, torch.tensor([3, -2, 5, 7, -3, 2])), {}),
    ("div_floor_ints", aten.div.Tensor_mode, (ri(9, 6) - 4, torch.tensor([3, -2, 5, 7, -3, 2])),
     {"rounding_mode": "floor"}),
    ("div_trunc_ints", aten.div.Tensor_mode, (ri(9, 6) - 4, torch.tensor([3, -2, 5, 7, -3, 2])),
     {"rounding_mode": "trunc"}),
    ("div_floor_float", aten.div.Tensor_mode, (r(6) * 5, r(6)), {"rounding_mode": "floor"}),
    ("floor_divide", aten.floor_divide.default, (ri(9, 6) - 4, torch.tensor([3, -2, 5, 7, -3, 2])), {}),
    ("remainder", aten.remainder.Tensor, (ri(9, 6) - 4, torch.tensor([3, -2, 5, 7, -3, 2])), {}),
    ("fmod", aten.fmod.Tensor, (r(6) * 4, r(6) + 3), {}),
    ("pow_scalar", aten.pow.Tensor_Scalar, (pos(3, 4), 3.0), {}),
    ("pow_square", aten.pow.Tensor_Scalar, (r(3, 4), 2), {}),
    ("pow_base", aten.pow.Scalar, (2.0, r(5)), {}),
    ("neg", aten.neg.default, (r(4),), {}),
    ("rsqrt", aten.rsqrt.default, (pos(4),), {}),
    ("erf", aten.erf.default, (r(8),), {}),
    ("exp_log1p", aten.log1p.default, (pos(8),), {}),
    ("round_decimals", aten.round.decimals, (r(8) * 10,), {"decimals": 1}),
    ("clamp", aten.clamp.default, (r(3, 4), -0.5, 0.5), {}),
    ("clamp_min", aten.clamp_min.default, (r(3, 4), 0.1), {}),
    ("where", aten.where.self, (r(3, 4) > 0, r(3, 4), r(3, 4)), {}),
    ("masked_fill", aten.masked_fill.Scalar, (r(3, 4), r(3, 4) > 0, -1e9), {}),
    ("eq", aten.eq.Scalar, (ri(3, 5), 1), {}),
    ("lt_tensor", aten.lt.Tensor, (r(5), r(5)), {}),
    ("logical_and", aten.logical_and.default, (r(5) > 0, r(5) > 0), {}),
    ("bitwise_and", aten.bitwise_and.Tensor, (r(5) > 0, r(5) > 0), {}),
    ("lerp", aten.lerp.Scalar, (r(5), r(5), 0.3), {}),
    ("addcmul", aten.addcmul.default, (r(5), r(5), r(5)), {"value": 0.5}),
    ("maximum", aten.maximum.default, (r(5), r(5)), {}),
    # activations
    ("relu", aten.relu.default, (r(3, 4),), {}),
    ("gelu_exact", aten.gelu.default, (r(64) * 3,), {}),
    ("gelu_tanh", aten.gelu.default, (r(64) * 3,), {"approximate": "tanh"}),
    ("silu", aten.silu.default, (r(16),), {}),
    ("mish", aten.mish.default, (r(16),), {}),
    ("hardswish", aten.hardswish.default, (r(32) * 4,), {}),
    ("hardsigmoid", aten.hardsigmoid.default, (r(32) * 4,), {}),
    ("hardtanh_relu6", aten.hardtanh.default, (r(32) * 4, 0.0, 6.0), {}),
    ("leaky_relu", aten.leaky_relu.default, (r(16), 0.2), {}),
    ("elu", aten.elu.default, (r(16),), {"alpha": 0.7}),
    ("softplus_beta", aten.softplus.default, (r(16) * 10, 2.0, 5.0), {}),
    ("sigmoid", aten.sigmoid.default, (r(16),), {}),
    ("tanh", aten.tanh.default, (r(16),), {}),
    ("softmax", aten._softmax.default, (r(3, 5), -1, False), {}),
    ("log_softmax", aten.log_softmax.int, (r(3, 5), 1), {}),
    ("prelu", aten.prelu.default, (r(2, 3, 4, 4), torch.tensor([0.1, 0.2, 0.3])), {}),
    ("glu", aten.glu.default, (r(3, 8), -1), {}),
    # shapes and indexing
    ("view", aten.view.default, (r(2, 3, 4), [6, 4]), {}),
    ("view_infer", aten.view.default, (r(2, 3, 4), [2, -1]), {}),
    ("flatten", aten.flatten.using_ints, (r(2, 3, 4, 5), 1, 2), {}),
    ("unflatten", aten.unflatten.int, (r(2, 12), 1, [3, 4]), {}),
    ("permute", aten.permute.default, (r(2, 3, 4), [2, 0, 1]), {}),
    ("transpose", aten.transpose.int, (r(2, 3, 4), -1, 0), {}),
    ("t", aten.t.default, (r(3, 4),), {}),
    ("unsqueeze_neg", aten.unsqueeze.default, (r(3, 4), -1), {}),
    ("squeeze_dims", aten.squeeze.dims, (r(1, 3, 1, 4), [0, 1, 2]), {}),
    ("expand", aten.expand.default, (r(3, 1), [2, 3, 4]), {}),
    ("repeat", aten.repeat.default, (r(2, 3), [2, 1, 2]), {}),
    ("cat", aten.cat.default, ([r(2, 3), r(4, 3)],), {}),
    ("cat_dim", aten.cat.default, ([r(2, 3), r(2, 1)], 1), {}),
    ("stack", aten.stack.default, ([r(2, 3), r(2, 3)], -1), {}),
    ("split", aten.split.Tensor, (r(7, 3), 3), {}),
    ("split_with_sizes", aten.split_with_sizes.default, (r(2, 7), [2, 5], 1), {}),
    ("chunk", aten.chunk.default, (r(6, 2), 3), {}),
    ("unbind", aten.unbind.int, (r(3, 2), 0), {}),
    ("slice_step", aten.slice.Tensor, (r(4, 9), 1, 1, 8, 3), {}),
    ("slice_negative", aten.slice.Tensor, (r(4, 9), 1, -3, 9223372036854775807), {}),
    ("select_last", aten.select.int, (r(2, 3, 4), -1, -1), {}),
    ("narrow", aten.narrow.default, (r(2, 9), 1, 2, 4), {}),
    ("index_advanced", aten.index.Tensor, (r(5, 6), [None, torch.tensor([4, 0, 2])]), {}),
    ("index_two", aten.index.Tensor, (r(5, 6), [torch.tensor([1, 2]), torch.tensor([3, 0])]), {}),
    ("index_select", aten.index_select.default, (r(5, 6), 0, torch.tensor([4, 4, 1])), {}),
    ("gather", aten.gather.default, (r(3, 5), 1, ri(5, 3, 2)), {}),
    ("index_put", aten.index_put.default, (r(5, 3), [torch.tensor([0, 3])], r(2, 3)), {}),
    ("index_put_accumulate", aten.index_put.default, (r(5, 3), [torch.tensor([1, 1])], r(2, 3), True), {}),
    ("select_scatter", aten.select_scatter.default, (r(3, 4), r(3), 1, 2), {}),
    ("slice_scatter", aten.slice_scatter.default, (r(4, 6), r(4, 2), 1, 1, 5, 2), {}),
    ("flip", aten.flip.default, (r(3, 4), [0, 1]), {}),
    ("roll", aten.roll.default, (r(3, 4), [1], [1]), {}),
    ("tril", aten.tril.default, (r(4, 4), -1), {}),
    ("pad_constant", aten.constant_pad_nd.default, (r(2, 3, 4), [1, 2, 0, 1], 0.5), {}),
    ("pad_reflect", aten.reflection_pad2d.default, (r(1, 2, 4, 4), [1, 1, 2, 0]), {}),
    ("pad_replicate", aten.replication_pad1d.default, (r(1, 2, 5), [2, 1]), {}),
    ("to_dtype", aten._to_copy.default, (r(5) * 10,), {"dtype": torch.int32}),
    ("detach", aten.detach.default, (r(5),), {}),
    ("one_hot", aten.one_hot.default, (ri(4, 6), 4), {}),
    ("diff", aten.diff.default, (r(3, 6),), {"dim": 1}),
    # reductions
    ("sum_dims", aten.sum.dim_IntList, (r(2, 3, 4), [0, 2], True), {}),
    ("mean", aten.mean.dim, (r(2, 3, 4), [-1]), {}),
    ("amax", aten.amax.default, (r(2, 3, 4), [1]), {}),
    ("max_dim", aten.max.dim, (r(3, 5), 1), {}),
    ("argmax", aten.argmax.default, (r(3, 5), 1), {}),
    ("var_unbiased", aten.var.correction, (r(4, 6), [1]), {"correction": 1}),
    ("std_biased", aten.std.correction, (r(4, 6), [0]), {"correction": 0, "keepdim": True}),
    ("logsumexp", aten.logsumexp.default, (r(3, 5), [1]), {}),
    ("vector_norm", aten.linalg_vector_norm.default, (r(3, 5), 2, [1], True), {}),
    ("cumsum", aten.cumsum.default, (r(3, 5), 1), {}),
    ("all", aten.all.dim, (r(3, 5) > -1, 1), {}),
    ("topk", aten.topk.default, (r(3, 7), 3), {}),
    ("sort", aten.sort.default, (r(3, 7), 1, True), {}),
    # products
    ("linear", aten.linear.default, (r(2, 5, 3), r(4, 3), r(4)), {}),
    ("lstm_cell", aten.lstm_cell.default, (r(3, 5), [r(3, 4), r(3, 4)], r(16, 5), r(16, 4), r(16), r(16)), {}),
    ("lstm_cell_no_bias", aten.lstm_cell.default, (r(3, 5), [r(3, 4), r(3, 4)], r(16, 5), r(16, 4)), {}),
    ("gru_cell", aten.gru_cell.default, (r(3, 5), r(3, 4), r(12, 5), r(12, 4), r(12), r(12)), {}),
    ("rnn_tanh_cell", aten.rnn_tanh_cell.default, (r(3, 5), r(3, 4), r(4, 5), r(4, 4), r(4), r(4)), {}),
    ("rnn_relu_cell", aten.rnn_relu_cell.default, (r(3, 5), r(3, 4), r(4, 5), r(4, 4)), {}),
    ("bilinear", aten.bilinear.default, (r(2, 5, 3), r(2, 5, 4), r(6, 3, 4), r(6)), {}),
    ("cosine_similarity", aten.cosine_similarity.default, (r(4, 6), r(1, 6)), {"dim": -1}),
    ("cosine_similarity_eps", aten.cosine_similarity.default, (r(3, 5, 2) * 1e-3, r(3, 5, 2)), {"eps": 0.01}),
    ("matmul_batched", aten.matmul.default, (r(2, 3, 4), r(4, 5)), {}),
    ("bmm", aten.bmm.default, (r(2, 3, 4), r(2, 4, 5)), {}),
    ("addmm", aten.addmm.default, (r(5), r(3, 4), r(4, 5)), {"beta": 0.5, "alpha": 2.0}),
    ("baddbmm", aten.baddbmm.default, (r(2, 3, 5), r(2, 3, 4), r(2, 4, 5)), {}),
    ("einsum", aten.einsum.default, ("bij,bjk->bik", [r(2, 3, 4), r(2, 4, 5)]), {}),
    # convolutions, pooling, resampling (torch's layout)
    ("conv2d_stride_pad", aten.conv2d.default, (r(2, 4, 9, 9), r(6, 4, 3, 3), r(6), [2, 2], [1, 1]), {}),
    ("conv2d_groups_dilation", aten.conv2d.default, (r(1, 4, 9, 9), r(4, 2, 3, 3), None, [1, 1], [2, 2], [2, 2], 2),
     {}),
    ("conv2d_same", aten.conv2d.padding, (r(1, 2, 8, 8), r(3, 2, 4, 4), None, [1, 1], "same"), {}),
    ("conv1d", aten.conv1d.default, (r(2, 3, 10), r(4, 3, 5), r(4), [1], [2]), {}),
    ("conv3d", aten.conv3d.default, (r(1, 2, 5, 5, 5), r(3, 2, 3, 3, 3), None, [1, 1, 1], [1, 1, 1]), {}),
    ("conv_transpose2d", aten.conv_transpose2d.input, (r(2, 4, 5, 5), r(4, 3, 4, 4), r(3), [2, 2], [1, 1], [1, 1]),
     {}),
    ("conv_transpose2d_groups", aten.conv_transpose2d.input, (r(1, 4, 5, 5), r(4, 2, 3, 3), None, [2, 2], [0, 0],
                                                              [0, 0], 2), {}),
    ("conv_transpose1d", aten.conv_transpose1d.default, (r(2, 3, 7), r(3, 2, 3), None, [3], [1]), {}),
    ("max_pool2d", aten.max_pool2d.default, (r(2, 3, 8, 8), [3, 3], [2, 2], [1, 1]), {}),
    ("max_pool2d_ceil", aten.max_pool2d.default, (r(1, 2, 9, 9), [2, 2], [2, 2], [0, 0], [1, 1], True), {}),
    ("max_pool2d_dilation", aten.max_pool2d.default, (r(1, 2, 9, 9), [3, 3], [1, 1], [1, 1], [2, 2]), {}),
    ("max_pool1d", aten.max_pool1d.default, (r(2, 3, 11), [3], [2]), {}),
    ("avg_pool2d_pad", aten.avg_pool2d.default, (pos(2, 3, 7, 7), [3, 3], [2, 2], [1, 1]), {}),
    ("avg_pool2d_exclude_pad", aten.avg_pool2d.default, (pos(2, 3, 7, 7), [3, 3], [1, 1], [1, 1], False, False), {}),
    ("avg_pool2d_ceil", aten.avg_pool2d.default, (pos(1, 2, 9, 9), [3, 3], [2, 2], [1, 1], True), {}),
    ("avg_pool2d_ceil_exclude", aten.avg_pool2d.default, (pos(1, 2, 8, 8), [3, 3], [2, 2], [1, 1], True, False), {}),
    ("avg_pool2d_divisor", aten.avg_pool2d.default, (pos(1, 2, 6, 6), [2, 2], [2, 2], [0, 0], False, True, 3), {}),
    ("adaptive_avg_pool_1x1", aten.adaptive_avg_pool2d.default, (r(2, 3, 5, 7), [1, 1]), {}),
    ("adaptive_avg_pool_uneven", aten.adaptive_avg_pool2d.default, (r(2, 3, 7, 10), [3, 4]), {}),
    ("adaptive_max_pool", aten.adaptive_max_pool2d.default, (r(2, 3, 7, 10), [3, 4]), {}),
    ("upsample_nearest_scale", aten.upsample_nearest2d.vec, (r(1, 2, 3, 5), None, [2.0, 3.0]), {}),
    ("upsample_nearest_size", aten.upsample_nearest2d.vec, (r(1, 2, 5, 5), [7, 3], None), {}),
    ("upsample_nearest_exact", aten._upsample_nearest_exact2d.vec, (r(1, 2, 5, 5), [7, 3], None), {}),
    ("upsample_bilinear_scale", aten.upsample_bilinear2d.vec, (r(1, 2, 4, 5), None, False, [2.0, 1.5]), {}),
    ("upsample_bilinear_size", aten.upsample_bilinear2d.vec, (r(1, 2, 4, 5), [7, 9], False, None), {}),
    ("upsample_bilinear_align", aten.upsample_bilinear2d.vec, (r(1, 2, 4, 5), [7, 9], True, None), {}),
    ("upsample_linear1d", aten.upsample_linear1d.vec, (r(1, 2, 6), [11], False, None), {}),
    ("upsample_bilinear_aa_down", aten._upsample_bilinear2d_aa.default, (r(1, 2, 9, 13), [4, 5], False), {}),
    ("upsample_bilinear_aa_up", aten._upsample_bilinear2d_aa.default, (r(1, 2, 4, 5), [7, 9], False), {}),
    ("upsample_bilinear_aa_scale", aten._upsample_bilinear2d_aa.default, (r(1, 2, 8, 6), [3, 4], False, 0.4, 0.7),
     {}),
    ("upsample_bilinear_aa_align", aten._upsample_bilinear2d_aa.default, (r(2, 1, 9, 7), [4, 11], True), {}),
    ("upsample_bicubic_aa_down", aten._upsample_bicubic2d_aa.default, (r(1, 2, 11, 8), [4, 3], False), {}),
    ("upsample_bicubic_aa_align", aten._upsample_bicubic2d_aa.default, (r(1, 1, 6, 9), [10, 4], True), {}),
    ("pixel_shuffle", aten.pixel_shuffle.default, (r(1, 8, 3, 3), 2), {}),
    ("channel_shuffle", aten.channel_shuffle.default, (r(2, 6, 3, 2), 3), {}),
    ("affine_grid", aten.affine_grid_generator.default, (r(2, 2, 3), [2, 3, 4, 5], False), {}),
    ("affine_grid_corners", aten.affine_grid_generator.default, (r(2, 2, 3), [2, 3, 1, 5], True), {}),
    # grid points inside, on the border and outside the image (zeros padding reads 0 there)
    ("grid_sample", aten.grid_sampler.default, (r(2, 3, 4, 5), r(2, 6, 7, 2) * 1.3, 0, 0, False), {}),
    ("grid_sample_corners_border", aten.grid_sampler.default, (r(2, 3, 4, 5), r(2, 6, 7, 2) * 1.3, 0, 1, True), {}),
    ("grid_sample_nearest", aten.grid_sampler.default, (r(2, 3, 4, 5), r(2, 6, 7, 2) * 1.3, 1, 0, False), {}),
    ("im2col", aten.im2col.default, (r(2, 3, 5, 6), [2, 3], [1, 1], [1, 1], [2, 1]), {}),
    ("im2col_dilated", aten.im2col.default, (r(1, 2, 7, 7), [3, 3], [2, 2], [0, 0], [1, 1]), {}),
    # overlapping windows: col2im sums them
    ("col2im", aten.col2im.default, (r(2, 18, 18), [5, 6], [2, 3], [1, 1], [1, 1], [2, 1]), {}),
    ("grid_sampler_2d", aten.grid_sampler_2d.default, (r(1, 2, 3, 3), r(1, 4, 4, 2), 0, 0, False), {}),
    ("grid_sample_reflection", aten.grid_sampler.default, (r(2, 3, 4, 5), r(2, 6, 7, 2) * 2.5, 0, 2, False), {}),
    ("grid_sample_reflection_corners", aten.grid_sampler.default, (r(1, 2, 4, 5), r(1, 6, 7, 2) * 2.5, 1, 2, True),
     {}),
    ("grid_sampler_3d", aten.grid_sampler_3d.default, (r(2, 2, 3, 4, 5), r(2, 3, 2, 4, 3) * 1.3, 0, 0, False), {}),
    ("grid_sampler_3d_nearest_border", aten.grid_sampler_3d.default,
     (r(1, 2, 3, 4, 5), r(1, 3, 2, 4, 3) * 1.3, 1, 1, True), {}),
    ("grid_sampler_3d_reflection", aten.grid_sampler_3d.default,
     (r(1, 2, 3, 4, 5), r(1, 2, 2, 3, 3) * 2.5, 0, 2, False), {}),
    ("native_channel_shuffle", aten.native_channel_shuffle.default, (r(2, 6, 5), 2), {}),
    # normalisation and attention
    ("layer_norm", aten.layer_norm.default, (r(2, 3, 8) * 3 + 1, [8], r(8), r(8), 1e-5), {}),
    ("layer_norm_2d", aten.layer_norm.default, (r(2, 3, 4), [3, 4], None, None, 1e-6), {}),
    ("group_norm", aten.group_norm.default, (r(2, 6, 4, 4), 3, r(6), r(6), 1e-5), {}),
    ("batch_norm_eval", aten.batch_norm.default, (r(2, 3, 4, 4), pos(3), r(3), r(3), pos(3), False, 0.1, 1e-5, False),
     {}),
    ("rms_norm", aten.rms_norm.default, (r(2, 5, 8), [8], pos(8), 1e-6), {}),
    ("weight_norm", aten._weight_norm.default, (r(8, 2, 3), pos(8, 1, 1)), {}),
    ("weight_norm_dim1", aten._weight_norm.default, (r(8, 2, 3), pos(1, 2, 1), 1), {}),
    ("weight_norm_whole", aten._weight_norm.default, (r(8, 2, 3), pos(1, 1, 1), -1), {}),
    ("sdpa", aten.scaled_dot_product_attention.default, (r(2, 2, 5, 4), r(2, 2, 6, 4), r(2, 2, 6, 3)), {}),
    ("sdpa_causal_scale", aten.scaled_dot_product_attention.default, (r(2, 2, 5, 4), r(2, 2, 5, 4), r(2, 2, 5, 4)),
     {"is_causal": True, "scale": 0.3}),
    ("sdpa_bool_mask", aten.scaled_dot_product_attention.default,
     (r(2, 2, 5, 4), r(2, 2, 6, 4), r(2, 2, 6, 4), torch.rand(2, 1, 5, 6, generator=G) > 0.2), {}),
    ("sdpa_float_mask", aten.scaled_dot_product_attention.default,
     (r(2, 2, 5, 4), r(2, 2, 6, 4), r(2, 2, 6, 4), r(5, 6)), {}),
    ("sdpa_gqa", aten.scaled_dot_product_attention.default, (r(1, 4, 5, 4), r(1, 2, 5, 4), r(1, 2, 5, 4)),
     {"enable_gqa": True}),
    # creation
    ("arange", aten.arange.start_step, (2, 11, 3), {}),
    ("zeros_like", aten.zeros_like.default, (r(3, 2),), {}),
    ("full", aten.full.default, ([2, 3], 1.5), {}),
    ("new_ones", aten.new_ones.default, (r(3), [2, 2]), {}),
    ("embedding", aten.embedding.default, (r(10, 4), ri(10, 3, 5)), {}),
    # losses (translate_function)
    ("cross_entropy", aten.cross_entropy_loss.default, (r(6, 5), ri(5, 6)), {}),
    ("cross_entropy_smooth_ignore", aten.cross_entropy_loss.default,
     (r(6, 5), torch.tensor([0, 1, -100, 3, 4, 1]), None, 1, -100, 0.1), {}),
    ("cross_entropy_weight_sum", aten.cross_entropy_loss.default, (r(6, 5), ri(5, 6), pos(5), 2), {}),
    ("cross_entropy_probs", aten.cross_entropy_loss.default, (r(6, 5), torch.softmax(r(6, 5), 1)), {}),
    ("nll_loss_2d", aten.nll_loss_nd.default, (torch.log_softmax(r(2, 4, 3, 3), 1), ri(4, 2, 3, 3)), {}),
    ("mse", aten.mse_loss.default, (r(4, 3), r(4, 3)), {}),
    ("l1_sum", aten.l1_loss.default, (r(4, 3), r(4, 3), 2), {}),
    ("smooth_l1", aten.smooth_l1_loss.default, (r(4, 3), r(4, 3), 1, 0.5), {}),
    ("huber", aten.huber_loss.default, (r(4, 3) * 3, r(4, 3), 1, 1.5), {}),
    ("bce_logits_pos_weight", aten.binary_cross_entropy_with_logits.default,
     (r(4, 3) * 30, torch.rand(4, 3, generator=G), None, pos(3)), {}),
    ("bce", aten.binary_cross_entropy.default, (torch.rand(4, 3, generator=G), torch.rand(4, 3, generator=G)), {}),
    ("kl_div", aten.kl_div.default, (torch.log_softmax(r(4, 3), 1), torch.softmax(r(4, 3), 1)), {}),
]


UNARY = ["abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "digamma", "erfc", "erfinv",
         "exp", "exp2", "expm1", "floor", "frac", "isfinite", "isinf", "isnan", "lgamma", "log", "log10", "log2",
         "reciprocal", "sgn", "sign", "sin", "sinh", "sqrt", "square", "tan", "trunc", "selu",
         "log_sigmoid", "logical_not"]
_DOMAIN = {"acosh": lambda x: x.abs() + 1, "acos": lambda x: x.tanh() * 0.9, "asin": lambda x: x.tanh() * 0.9,
           "atanh": lambda x: x.tanh() * 0.9, "erfinv": lambda x: x.tanh() * 0.9, "log": lambda x: x.abs() + 0.1,
           "log10": lambda x: x.abs() + 0.1, "log2": lambda x: x.abs() + 0.1, "sqrt": lambda x: x.abs(),
           "digamma": lambda x: x.abs() + 0.5, "lgamma": lambda x: x.abs() + 0.5, "reciprocal": lambda x: x + 3,
           "isinf": lambda x: torch.where(x > 1, torch.inf, x), "isnan": lambda x: torch.where(x > 1, torch.nan, x)}
CASES += [(f"unary_{n}", getattr(aten, n).default, (_DOMAIN.get(n, lambda x: x)(r(12) * 2),), {}) for n in UNARY]
CASES += [
    ("atan2", aten.atan2.default, (r(6), r(6)), {}),
    ("addcdiv", aten.addcdiv.default, (r(5), r(5), pos(5)), {"value": 2.0}),
    ("clamp_max", aten.clamp_max.default, (r(5), 0.2), {}),
    ("clip_tensor", aten.clip.Tensor, (r(5), -r(5).abs(), r(5).abs()), {}),
    ("fmin", aten.fmin.default, (r(5), r(5)), {}),
    ("fmax", aten.fmax.default, (r(5), r(5)), {}),
    ("bitwise_xor_int", aten.bitwise_xor.Tensor, (ri(8, 5), ri(8, 5)), {}),
    ("minimum", aten.minimum.default, (r(5), r(5)), {}),
    ("logaddexp", aten.logaddexp.default, (r(5), r(5)), {}),
    ("nan_to_num", aten.nan_to_num.default, (torch.tensor([1.0, float("nan"), float("inf"), -float("inf")]),),
     {"nan": 0.0, "posinf": 9.0}),
    ("ne_ge_gt_le", aten.ne.Scalar, (ri(3, 6), 1), {}),
    ("ge", aten.ge.Tensor, (r(5), r(5)), {}),
    ("gt", aten.gt.Scalar, (r(5), 0.1), {}),
    ("le", aten.le.Scalar, (r(5), 0.1), {}),
    ("logical_or", aten.logical_or.default, (r(5) > 0, r(5) > 0), {}),
    ("logical_xor", aten.logical_xor.default, (r(5) > 0, r(5) > 0), {}),
    ("or", aten.__or__.Tensor, (r(5) > 0, r(5) > 0), {}),
    ("xor", aten.__xor__.Tensor, (r(5) > 0, r(5) > 0), {}),
    ("and", aten.__and__.Tensor, (r(5) > 0, r(5) > 0), {}),
    ("bitwise_not", aten.bitwise_not.default, (r(5) > 0,), {}),
    ("bitwise_or_int", aten.bitwise_or.Tensor, (ri(8, 5), ri(8, 5)), {}),
    ("true_divide", aten.true_divide.Tensor, (r(5), pos(5)), {}),
    ("fill", aten.fill.Scalar, (r(2, 3), 0.25), {}),
    ("zero", aten.zero.default, (r(2, 3),), {}),
    ("copy_broadcast_cast", aten.copy.default, (r(2, 3), ri(5, 3)), {}),
    ("celu", aten.celu.default, (r(16),), {"alpha": 0.5}),
    ("threshold", aten.threshold.default, (r(16), 0.1, -2.0), {}),
    ("softmax_int", aten.softmax.int, (r(3, 5), 0), {}),
    ("log_softmax_private", aten._log_softmax.default, (r(3, 5), 1, False), {}),
    ("prelu_kernel", aten._prelu_kernel.default, (r(2, 3), torch.tensor([0.25])), {}),
    ("reshape", aten.reshape.default, (r(2, 6), [3, 4]), {}),
    ("unsafe_view", aten._unsafe_view.default, (r(2, 6), [4, 3]), {}),
    ("view_copy", aten.view_copy.default, (r(2, 6), [12]), {}),
    ("swapaxes", aten.swapaxes.default, (r(2, 3, 4), 0, 2), {}),
    ("numpy_T", aten.numpy_T.default, (r(2, 3),), {}),
    ("movedim", aten.movedim.int, (r(2, 3, 4), 0, -1), {}),
    ("expand_as", aten.expand_as.default, (r(3, 1), r(2, 3, 4)), {}),
    ("broadcast_tensors", aten.broadcast_tensors.default, ([r(3, 1), r(2, 1, 4)],), {}),
    ("expand_copy", aten.expand_copy.default, (r(3, 1), [3, 5]), {}),
    ("repeat_interleave", aten.repeat_interleave.self_int, (r(2, 3), 2, 1), {}),
    ("concat", aten.concat.default, ([r(2, 3), r(1, 3)],), {}),
    ("concatenate", aten.concatenate.default, ([r(2, 3), r(2, 2)], 1), {}),
    ("tensor_split", aten.tensor_split.sections, (r(7, 2), 3), {}),
    ("unsafe_split", aten.unsafe_split.Tensor, (r(6, 2), 2), {}),
    ("triu", aten.triu.default, (r(4, 4), 1), {}),
    ("pad", aten.pad.default, (r(1, 2, 5), [1, 2], "reflect"), {}),
    ("pad_circular", aten.pad.default, (r(1, 2, 4, 4), [1, 2, 1, 0], "circular"), {}),
    ("reflection_pad1d", aten.reflection_pad1d.default, (r(1, 2, 6), [2, 1]), {}),
    ("reflection_pad3d", aten.reflection_pad3d.default, (r(1, 1, 4, 4, 4), [1, 1, 1, 1, 1, 1]), {}),
    ("replication_pad2d", aten.replication_pad2d.default, (r(1, 2, 4, 4), [1, 0, 2, 1]), {}),
    ("replication_pad3d", aten.replication_pad3d.default, (r(1, 1, 3, 3, 3), [1, 1, 0, 0, 1, 0]), {}),
    ("to", aten.to.dtype, (r(5) * 3, torch.int64), {}),
    ("type_as", aten.type_as.default, (r(5) * 3, ri(4, 2)), {}),
    ("numel", aten.numel.default, (r(3, 4),), {}),
    ("amin", aten.amin.default, (r(2, 3, 4), [0, 2]), {}),
    ("any", aten.any.dim, (r(3, 5) > 1, 1), {}),
    ("argmin", aten.argmin.default, (r(3, 5), 0, True), {}),
    ("min_dim", aten.min.dim, (r(3, 5), 0, True), {}),
    ("max_all", aten.max.default, (r(3, 5),), {}),
    ("min_all", aten.min.default, (r(3, 5),), {}),
    ("prod", aten.prod.dim_int, (pos(3, 5), 1), {}),
    ("cumprod", aten.cumprod.default, (pos(3, 5), 1), {}),
    ("var_mean", aten.var_mean.correction, (r(4, 6), [1]), {"correction": 1}),
    ("norm", aten.norm.ScalarOpt_dim, (r(3, 5), 1, [1]), {}),
    ("mm", aten.mm.default, (r(3, 4), r(4, 2)), {}),
    ("mv", aten.mv.default, (r(3, 4), r(4)), {}),
    ("dot", aten.dot.default, (r(4), r(4)), {}),
    ("vdot", aten.vdot.default, (r(4), r(4)), {}),
    ("outer", aten.outer.default, (r(3), r(4)), {}),
    ("ger", aten.ger.default, (r(3), r(4)), {}),
    ("addbmm", aten.addbmm.default, (r(3, 5), r(2, 3, 4), r(2, 4, 5)), {}),
    ("convolution", aten.convolution.default, (r(1, 2, 6, 6), r(3, 2, 3, 3), r(3), [1, 1], [1, 1], [1, 1], False,
                                               [0, 0], 1), {}),
    ("convolution_transposed", aten.convolution.default, (r(1, 2, 4, 4), r(2, 3, 3, 3), None, [2, 2], [1, 1],
                                                          [1, 1], True, [1, 1], 1), {}),
    ("conv_transpose3d", aten.conv_transpose3d.input, (r(1, 2, 3, 3, 3), r(2, 2, 2, 2, 2), None, [2, 2, 2]), {}),
    ("max_pool3d", aten.max_pool3d.default, (r(1, 2, 5, 5, 5), [2, 2, 2]), {}),
    ("max_pool2d_with_indices", aten.max_pool2d_with_indices.default, (r(1, 2, 6, 6), [2, 2]), {}),
    ("max_pool1d_with_indices", aten.max_pool1d_with_indices.default, (r(1, 2, 6), [2]), {}),
    ("max_pool3d_with_indices", aten.max_pool3d_with_indices.default, (r(1, 1, 4, 4, 4), [2, 2, 2]), {}),
    ("avg_pool1d", aten.avg_pool1d.default, (pos(1, 2, 7), [3], [2], [1]), {}),
    ("avg_pool3d", aten.avg_pool3d.default, (pos(1, 1, 5, 5, 5), [2, 2, 2]), {}),
    ("adaptive_avg_pool1d", aten.adaptive_avg_pool1d.default, (r(2, 3, 7), [3]), {}),
    ("adaptive_avg_pool3d", aten.adaptive_avg_pool3d.default, (r(1, 2, 4, 5, 6), [2, 2, 3]), {}),
    ("adaptive_avg_pool_private", aten._adaptive_avg_pool2d.default, (r(1, 2, 6, 6), [3, 2]), {}),
    ("adaptive_max_pool1d", aten.adaptive_max_pool1d.default, (r(2, 3, 7), [3]), {}),
    ("adaptive_max_pool3d", aten.adaptive_max_pool3d.default, (r(1, 2, 4, 5, 6), [2, 2, 3]), {}),
    ("upsample_nearest1d", aten.upsample_nearest1d.vec, (r(1, 2, 5), None, [2.5]), {}),
    ("upsample_nearest3d", aten.upsample_nearest3d.vec, (r(1, 1, 2, 3, 4), [4, 3, 5], None), {}),
    ("upsample_nearest_exact1d", aten._upsample_nearest_exact1d.vec, (r(1, 2, 5), [8], None), {}),
    ("upsample_nearest_exact3d", aten._upsample_nearest_exact3d.vec, (r(1, 1, 2, 3, 4), [3, 5, 6], None), {}),
    ("upsample_trilinear3d", aten.upsample_trilinear3d.vec, (r(1, 1, 2, 3, 4), [3, 5, 6], False, None), {}),
    ("native_layer_norm", aten.native_layer_norm.default, (r(2, 5), [5], r(5), r(5), 1e-5), {}),
    ("instance_norm", aten.instance_norm.default, (r(2, 3, 4, 4), pos(3), r(3), None, None, True, 0.1, 1e-5, False),
     {}),
    ("batch_norm_no_training", aten._native_batch_norm_legit_no_training.default,
     (r(2, 3, 4), pos(3), r(3), r(3), pos(3), 0.1, 1e-5), {}),
    ("zeros", aten.zeros.default, ([2, 3],), {}),
    ("ones", aten.ones.default, ([2, 3],), {"dtype": torch.int64}),
    ("ones_like", aten.ones_like.default, (r(3, 2),), {"dtype": torch.int32}),
    ("full_like", aten.full_like.default, (r(3, 2), 7.0), {}),
    ("new_zeros", aten.new_zeros.default, (ri(3, 2), [2, 2]), {}),
    ("new_full", aten.new_full.default, (r(3), [2, 2], 3.0), {}),
    ("scalar_tensor", aten.scalar_tensor.default, (2.5,), {}),
    ("linspace", aten.linspace.default, (0.0, 1.0, 7), {}),
    ("eye", aten.eye.default, (4,), {}),
    # writes at computed indices (index ids repeat: what lands on one place adds up or reduces)
    ("scatter_src", aten.scatter.src, (r(3, 5), 1, ri(5, 3, 2), r(3, 4)), {}),
    ("scatter_value_one_hot", aten.scatter.value, (torch.zeros(4, 6), 1, ri(6, 4, 1), 1.0), {}),
    ("scatter_dim0", aten.scatter.src, (r(4, 3), 0, torch.tensor([[0, 1, 2], [3, 0, 1]]), r(2, 3)), {}),
    ("scatter_reduce_legacy", aten.scatter.reduce, (r(3, 5), 1, ri(5, 3, 4), r(3, 4)), {"reduce": "add"}),
    ("scatter_add", aten.scatter_add.default, (r(4, 3), 0, ri(4, 6, 3), r(6, 3)), {}),
    ("scatter_reduce_sum", aten.scatter_reduce.two, (r(4, 3), 0, ri(4, 6, 3), r(6, 3), "sum"), {}),
    ("scatter_reduce_prod_excl", aten.scatter_reduce.two, (r(4, 3), 0, ri(4, 6, 3), r(6, 3), "prod"),
     {"include_self": False}),
    ("scatter_reduce_mean", aten.scatter_reduce.two, (r(4, 3), 0, ri(4, 6, 3), r(6, 3), "mean"), {}),
    ("scatter_reduce_mean_excl", aten.scatter_reduce.two, (r(4, 3), 0, ri(4, 6, 3), r(6, 3), "mean"),
     {"include_self": False}),
    ("scatter_reduce_mean_int", aten.scatter_reduce.two, (ri(9, 4, 3), 0, ri(4, 6, 3), ri(9, 6, 3), "mean"), {}),
    ("scatter_reduce_amax_excl", aten.scatter_reduce.two, (r(4, 3), 0, ri(4, 6, 3), r(6, 3), "amax"),
     {"include_self": False}),
    ("scatter_reduce_amin", aten.scatter_reduce.two, (r(2, 4, 3), 1, ri(4, 2, 6, 3), r(2, 6, 3), "amin"), {}),
    ("scatter_reduce_amax_int", aten.scatter_reduce.two, (ri(9, 4, 3), 0, ri(4, 6, 3), ri(9, 6, 3), "amax"),
     {"include_self": False}),
    ("index_add", aten.index_add.default, (r(5, 3), 0, ri(5, 7), r(7, 3)), {}),
    ("index_add_dim1_alpha", aten.index_add.default, (r(2, 5, 3), 1, ri(5, 4), r(2, 4, 3)), {"alpha": 0.5}),
    ("index_copy", aten.index_copy.default, (r(5, 3), 0, torch.tensor([4, 0, 2]), r(3, 3)), {}),
    ("index_fill", aten.index_fill.int_Scalar, (r(3, 5), 1, torch.tensor([0, 3]), -1.5), {}),
    ("nll_loss", aten.nll_loss.default, (torch.log_softmax(r(5, 4), 1), ri(4, 5)), {}),
    ("nll_loss2d", aten.nll_loss2d.default, (torch.log_softmax(r(2, 4, 3, 3), 1), ri(4, 2, 3, 3)), {}),
]
CASES += [
    # views torch defines by strides, sizes read from arrays, 0-d tensors where an op takes a dim
    ("as_strided", aten.as_strided.default, (r(4, 5), [3, 2], [2, 3], 1), {}),
    ("as_strided_copy", aten.as_strided_copy.default, (r(6), [2, 2], [1, 2]), {}),
    ("as_strided_scatter", aten.as_strided_scatter.default, (r(4, 5), r(3, 2), [3, 2], [2, 3], 1), {}),
    ("diagonal_offset_dims", aten.diagonal.default, (r(3, 4, 5), 1, 0, 2), {}),
    ("diagonal_copy", aten.diagonal_copy.default, (r(3, 4), -1), {}),
    ("linalg_diagonal", aten.linalg_diagonal.default, (r(2, 3, 4),), {"offset": 1}),
    ("diagonal_scatter_apart", aten.diagonal_scatter.default, (r(3, 4, 5), r(4, 3), 1, 0, 2), {}),
    ("diagonal_scatter_below", aten.diagonal_scatter.default, (r(4, 5), r(3), -1), {}),
    ("unfold_step", aten.unfold.default, (r(3, 7, 2), 1, 3, 2), {}),
    ("unfold_copy_last", aten.unfold_copy.default, (r(7),  0, 2, 1), {}),
    ("alias", aten.alias.default, (r(3),), {}),
    ("alias_copy", aten.alias_copy.default, (r(3),), {}),
    ("clone", aten.clone.default, (r(3),), {}),
    ("positive", aten.positive.default, (r(3),), {}),
    ("resolve_conj", aten.resolve_conj.default, (r(3),), {}),
    ("resolve_neg", aten.resolve_neg.default, (r(3),), {}),
    ("contiguous", aten.contiguous.default, (r(3),), {}),
    ("lift_fresh_copy", aten.lift_fresh_copy.default, (r(3),), {}),
    ("local_scalar_dense", aten._local_scalar_dense.default, (r(1),), {}),
    ("item", aten.item.default, (r(1, 1),), {}),
    ("sym_size", aten.sym_size.int, (r(3, 4), 1), {}),
    ("sym_numel", aten.sym_numel.default, (r(3, 4),), {}),
    ("sym_stride", aten.sym_stride.int, (r(3, 4, 5), 0), {}),
    ("sym_storage_offset", aten.sym_storage_offset.default, (r(3, 4),), {}),
    ("sym_is_contiguous", aten.sym_is_contiguous.default, (r(3, 4),), {}),
    ("sum_0d", aten.sum.dim_IntList, (torch.tensor(2.5), [0]), {}),
    ("cumsum_0d", aten.cumsum.default, (torch.tensor(2.5), -1), {}),
    ("max_dim_0d", aten.max.dim, (torch.tensor(2.5), 0, True), {}),
    ("index_select_0d", aten.index_select.default, (torch.tensor(2.5), 0, torch.tensor([0])), {}),
    ("index_add_0d", aten.index_add.default, (torch.tensor(2.5), 0, torch.tensor(0), torch.tensor(1.5)), {}),
]


def spd(*shape):
    """Symmetric positive definite matrices (..., n, n), well conditioned."""
    a = r(*shape)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def lu_of(a):
    return torch.linalg.lu_factor(a)


LU, PIVOTS = lu_of(spd(2, 3, 3) + r(2, 3, 3))
CASES += [
    # matrix functions (LAPACK on both sides)
    ("linalg_inv", aten.linalg_inv.default, (spd(2, 3, 3),), {}),
    ("linalg_inv_ex", aten.linalg_inv_ex.default, (spd(3, 3),), {}),
    ("linalg_det", aten.linalg_det.default, (r(2, 3, 3),), {}),
    ("det", aten.det.default, (r(3, 3),), {}),
    ("logdet", aten.logdet.default, (spd(2, 3, 3),), {}),
    ("linalg_slogdet", aten.linalg_slogdet.default, (r(2, 3, 3),), {}),
    ("slogdet", aten.slogdet.default, (r(3, 3),), {}),
    ("linalg_solve_vector", aten.linalg_solve.default, (spd(2, 3, 3), r(2, 3)), {}),
    ("linalg_solve_right", aten.linalg_solve.default, (spd(3, 3), r(4, 3)), {"left": False}),
    ("linalg_solve_ex", aten.linalg_solve_ex.default, (spd(3, 3), r(3, 2)), {}),
    ("linalg_cholesky_upper", aten.linalg_cholesky.default, (spd(2, 3, 3),), {"upper": True}),
    ("linalg_cholesky_ex", aten.linalg_cholesky_ex.default, (spd(3, 3),), {}),
    ("cholesky", aten.cholesky.default, (spd(3, 3),), {}),
    ("cholesky_solve", aten.cholesky_solve.default, (r(3, 2), torch.linalg.cholesky(spd(3, 3))), {}),
    ("cholesky_inverse_upper", aten.cholesky_inverse.default, (torch.linalg.cholesky(spd(3, 3)).mT, True), {}),
    ("linalg_qr_complete", aten.linalg_qr.default, (r(4, 3), "complete"), {}),
    ("linalg_qr_r", aten.linalg_qr.default, (r(2, 4, 3), "r"), {}),
    ("qr", aten.qr.default, (r(4, 3),), {}),
    ("linalg_svd_values", aten.linalg_svd.default, (r(4, 3), False), {}),
    ("svd_values", aten.svd.default, (r(3, 4),), {}),
    ("linalg_svdvals", aten.linalg_svdvals.default, (r(2, 3, 4),), {}),
    ("linalg_eigvals_via_eig", aten.linalg_eig.default, (spd(3, 3),), {}),
    ("linalg_eigvals", aten.linalg_eigvals.default, (spd(3, 3),), {}),
    ("linalg_eigh_values_upper", aten.linalg_eigh.default, (r(3, 3), "U"), {}),
    ("linalg_eigvalsh_lower_triangle", aten.linalg_eigvalsh.default, (r(3, 3),), {}),
    ("linalg_pinv", aten.linalg_pinv.atol_rtol_float, (r(4, 3),), {"rtol": 0.1}),
    ("linalg_pinv_hermitian", aten.linalg_pinv.atol_rtol_tensor, (r(3, 3),), {"hermitian": True}),
    ("linalg_pinv_rcond", aten.linalg_pinv.default, (r(3, 4), 1e-10), {}),
    ("pinverse", aten.pinverse.default, (r(3, 4),), {}),
    ("linalg_matrix_rank", aten.linalg_matrix_rank.atol_rtol_float, (r(2, 4, 3) @ r(3, 4),), {}),
    ("linalg_matrix_rank_tol", aten.linalg_matrix_rank.tol_tensor, (r(4, 4), torch.tensor(0.5)), {}),
    ("linalg_matrix_rank_float_tol", aten.linalg_matrix_rank.default, (r(4, 4), 0.5), {}),
    ("linalg_matrix_rank_empty", aten.linalg_matrix_rank.atol_rtol_float, (r(2, 0, 3),), {}),
    ("linalg_matrix_power", aten.linalg_matrix_power.default, (r(3, 3), 3), {}),
    ("linalg_multi_dot", aten.linalg_multi_dot.default, ([r(2, 3), r(3, 4), r(4)],), {}),
    ("linalg_matrix_norm_nuc", aten.linalg_matrix_norm.str_ord, (r(2, 3, 4), "nuc"), {}),
    ("linalg_matrix_norm_inf", aten.linalg_matrix_norm.default, (r(3, 4), float("inf")), {"keepdim": True}),
    ("linalg_norm_flat", aten.linalg_norm.default, (r(2, 3, 4),), {}),
    ("linalg_norm_dim", aten.linalg_norm.default, (r(2, 3, 4), 3, [1]), {}),
    ("linalg_norm_fro", aten.linalg_norm.ord_str, (r(2, 3, 4), "fro", [0, 2]), {}),
    ("linalg_cond", aten.linalg_cond.default, (spd(3, 3),), {}),
    ("linalg_cond_str", aten.linalg_cond.p_str, (spd(3, 3), "nuc"), {}),
    ("linalg_cross", aten.linalg_cross.default, (r(2, 3), r(2, 3)), {}),
    ("cross_first_size_3", aten.cross.default, (r(3, 2), r(3, 2)), {}),
    ("linalg_vecdot", aten.linalg_vecdot.default, (r(2, 3), r(2, 3)), {"dim": 0}),
    ("linalg_householder_product", aten.linalg_householder_product.default, (r(4, 3), r(3)), {}),
    ("ormqr", aten.ormqr.default, (r(4, 3), r(3), r(4, 2)), {}),
    ("ormqr_right_transposed", aten.ormqr.default, (r(4, 4), r(4), r(2, 4), False, True), {}),
    ("linalg_lu_factor", aten.linalg_lu_factor.default, (r(2, 3, 3),), {}),
    ("linalg_lu_factor_ex", aten.linalg_lu_factor_ex.default, (r(3, 3),), {}),
    ("lu_with_info", aten._lu_with_info.default, (r(3, 3),), {}),
    ("linalg_lu", aten.linalg_lu.default, (r(3, 4),), {}),
    ("lu_unpack", aten.lu_unpack.default, (LU, PIVOTS), {}),
    ("linalg_lu_solve", aten.linalg_lu_solve.default, (LU, PIVOTS, r(2, 3, 2)), {}),
    ("linalg_lu_solve_right_adjoint", aten.linalg_lu_solve.default, (LU, PIVOTS, r(2, 4, 3)),
     {"left": False, "adjoint": True}),
    ("lu_solve", aten.lu_solve.default, (r(2, 3, 2), LU, PIVOTS), {}),
    ("linalg_solve_triangular", aten.linalg_solve_triangular.default, (spd(3, 3).triu(), r(3, 2)), {"upper": True}),
    ("linalg_solve_triangular_right", aten.linalg_solve_triangular.default, (spd(3, 3).tril(), r(2, 3)),
     {"upper": False, "left": False, "unitriangular": True}),
    ("triangular_solve_transposed", aten.triangular_solve.default, (r(3, 2), spd(3, 3).tril(), False, True), {}),
    ("linalg_tensorinv", aten.linalg_tensorinv.default, (spd(6, 6).reshape(6, 2, 3),), {"ind": 1}),
    ("linalg_tensorsolve_dims", aten.linalg_tensorsolve.default, (spd(6, 6).reshape(2, 3, 6), r(2, 3)), {}),
    ("linalg_vander", aten.linalg_vander.default, (r(2, 3),), {"N": 4}),
    ("linalg_matrix_exp", aten.linalg_matrix_exp.default, (r(2, 3, 3) * 0.3,), {}),
    ("matrix_exp", aten.matrix_exp.default, (r(3, 3) * 0.3,), {}),
    ("trace", aten.trace.default, (r(3, 4),), {}),
    ("kron", aten.kron.default, (r(2, 3), r(3, 2)), {}),
    ("block_diag", aten.block_diag.default, ([r(2, 3), r(1, 2)],), {}),
    ("tensordot_broadcast_one", aten.tensordot.default, (r(1, 1, 1), r(2, 1, 2), [0, 1], [2, 0]), {}),
    ("inner", aten.inner.default, (r(2, 3), r(4, 3)), {}),
    ("cdist_p1", aten._cdist_forward.default, (r(2, 4, 3), r(2, 5, 3), 1.0, None), {}),
    ("cdist", aten.cdist.default, (r(4, 3), r(5, 3)), {}),
    ("pdist", aten._pdist_forward.default, (r(5, 3),), {}),
    # targets after a -1 ignored, a repeated target counted twice (torch's Python decomposition gets both wrong)
    ("multilabel_margin_loss", aten.multilabel_margin_loss.default,
     (r(4, 5), torch.tensor([[0, 3, -1, 1, 1], [1, -1, 0, 0, 0], [4, 2, 0, -1, 3], [2, 2, -1, 0, 0]]), 1), {}),
    ("multilabel_margin_loss_sum_1d", aten.multilabel_margin_loss.default, (r(5), torch.tensor([3, 0, -1, 2, 2]), 2),
     {}),
    ("pdist_p3", aten.pdist.default, (r(5, 3), 3.0), {}),
]
C = torch.complex(r(3, 4), r(3, 4))
CASES += [
    # FFTs (every torch.fft function decomposes into these three) and complex numbers
    ("fft_r2c_onesided_ortho", aten._fft_r2c.default, (r(3, 8), [1], 1, True), {}),
    ("fft_r2c_full_by_n", aten._fft_r2c.default, (r(2, 3, 4), [0, 2], 2, False), {}),
    ("fft_c2c_forward", aten._fft_c2c.default, (C, [0, 1], 0, True), {}),
    ("fft_c2c_inverse_by_n", aten._fft_c2c.default, (C, [1], 2, False), {}),
    ("fft_c2r", aten._fft_c2r.default, (C, [1], 0, 6), {}),
    ("view_as_real", aten.view_as_real.default, (C,), {}),
    ("view_as_complex", aten.view_as_complex.default, (r(3, 2),), {}),
    ("real", aten.real.default, (C,), {}),
    ("imag", aten.imag.default, (C,), {}),
    ("conj_physical", aten.conj_physical.default, (C,), {}),
    ("conj", aten.conj.default, (C,), {}),
    ("conj_view", aten._conj.default, (C,), {}),
    ("conj_physical_private", aten._conj_physical.default, (C,), {}),
    ("complex_broadcast", aten.complex.default, (r(3, 1), r(4)), {}),
    ("polar", aten.polar.default, (pos(4), r(4)), {}),
    ("angle", aten.angle.default, (C,), {}),
    # special functions
    ("i0", aten.i0.default, (r(6) * 3,), {}),
    ("i1e", aten.special_i1e.default, (r(6) * 3,), {}),
    ("bessel_j1", aten.special_bessel_j1.default, (r(6) * 3,), {}),
    ("spherical_bessel_j0", aten.special_spherical_bessel_j0.default, (torch.tensor([0.0, 0.5, -3.0, 10.0]),), {}),
    ("erfcx", aten.special_erfcx.default, (r(6),), {}),
    ("ndtri", aten.special_ndtri.default, (torch.rand(6, generator=G),), {}),
    ("log_ndtr", aten.special_log_ndtr.default, (r(6) * 4,), {}),
    ("entr", aten.special_entr.default, (r(6),), {}),
    ("sinc", aten.sinc.default, (r(6),), {}),
    ("deg2rad", aten.deg2rad.default, (r(6),), {}),
    ("isposinf", aten.isposinf.default, (torch.tensor([1.0, float("inf"), -float("inf")]),), {}),
    ("igamma", aten.igamma.default, (pos(6), pos(6)), {}),
    ("igammac", aten.igammac.default, (pos(6), pos(6)), {}),
    ("zeta", aten.special_zeta.default, (pos(6) + 1, pos(6)), {}),
    ("xlog1py", aten.special_xlog1py.default, (r(6), pos(6)), {}),
    ("xlogy", aten.xlogy.Tensor, (torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0.0, 3.0, 0.5])), {}),
    ("hypot", aten.hypot.default, (r(6), r(6)), {}),
    ("nextafter", aten.nextafter.default, (r(6), r(6)), {}),
    ("copysign", aten.copysign.Tensor, (r(6), r(6)), {}),
    ("heaviside", aten.heaviside.default, (torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([0.5])), {}),
    ("float_power", aten.float_power.Tensor_Tensor, (pos(6), r(6)), {}),
    ("logaddexp2", aten.logaddexp2.default, (r(6), r(6)), {}),
    ("polygamma_0", aten.polygamma.default, (0, r(6) * 3), {}),
    ("polygamma_1_negative", aten.polygamma.default, (1, r(6) * 3), {}),
    ("polygamma_3_negative", aten.polygamma.default, (3, r(6) * 3), {}),
    ("mvlgamma", aten.mvlgamma.default, (pos(6) + 2, 3), {}),
    ("logit_eps", aten.logit.default, (torch.rand(6, generator=G), 0.1), {}),
    ("frexp", aten.frexp.Tensor, (r(6) * 10,), {}),
    ("ldexp", aten.ldexp.Tensor, (r(6), ri(4, 6)), {}),
    ("logcumsumexp", aten.logcumsumexp.default, (r(3, 4), 1), {}),
    ("signbit", aten.signbit.default, (r(6),), {}),
    ("rad2deg", aten.rad2deg.default, (r(6),), {}),
    ("isneginf", aten.isneginf.default, (torch.tensor([1.0, float("inf"), -float("inf")]),), {}),
    ("i0e", aten.special_i0e.default, (r(6) * 3,), {}),
    ("i1", aten.special_i1.default, (r(6) * 3,), {}),
    ("modified_bessel_i0", aten.special_modified_bessel_i0.default, (r(6) * 3,), {}),
    ("modified_bessel_i1", aten.special_modified_bessel_i1.default, (r(6) * 3,), {}),
    ("bessel_j0", aten.special_bessel_j0.default, (r(6) * 3,), {}),
    ("ndtr", aten.special_ndtr.default, (r(6),), {}),
    ("expit", aten.special_expit.default, (r(6),), {}),
]
WITH_NAN = torch.tensor([[1.0, float("nan"), 3.0, -2.0], [0.5, 0.5, float("nan"), float("nan")]])
CASES += [
    # order statistics, binning, writes at computed places
    ("kthvalue", aten.kthvalue.default, (r(3, 5), 2, 0), {}),
    ("median_all", aten.median.default, (r(4, 5),), {}),
    ("median_dim_keepdim", aten.median.dim, (r(4, 6), 1, True), {}),
    ("nanmedian_all", aten.nanmedian.default, (WITH_NAN,), {}),
    ("nanmedian_dim", aten.nanmedian.dim, (WITH_NAN, 1), {}),
    ("topk_smallest_dim0", aten.topk.default, (r(5, 3), 2, 0, False), {}),
    ("cummax", aten.cummax.default, (torch.tensor([[1.0, 3, 3, 2, 5, 5]]), 1), {}),
    ("cummin", aten.cummin.default, (r(3, 4), 0), {}),
    ("searchsorted_rows_right", aten.searchsorted.Tensor, (torch.sort(r(2, 5)).values, r(2, 3)), {"right": True}),
    # sorter: the indices that sort this very sequence (another order is undefined in both)
    ("searchsorted_sorter", aten.searchsorted.Tensor, (torch.tensor([0.3, -1.2, 2.0, 0.1, -0.4, 1.1]), r(4)),
     {"sorter": torch.tensor([1, 4, 3, 0, 5, 2])}),
    ("searchsorted_scalar_int32", aten.searchsorted.Scalar, (torch.arange(5.0), 2.5), {"out_int32": True}),
    ("bucketize", aten.bucketize.Tensor, (r(3, 4), torch.tensor([-1.0, 0.0, 1.0])), {"right": True}),
    ("histc", aten.histc.default, (r(20), 5, -1.0, 1.0), {}),
    ("histc_own_range", aten.histc.default, (r(20), 4), {}),
    ("histogram", aten.histogram.bin_ct, (r(20), 4), {"range": [-2.0, 2.0], "weight": pos(20), "density": True}),
    ("histogramdd", aten.histogramdd.default, (r(25, 2), [3, 4]), {}),
    ("histogramdd_edges", aten.histogramdd.TensorList_bins,
     (r(25, 2), [torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([-2.0, -0.5, 0.5, 1.0])]), {}),
    ("histogramdd_range_weighted", aten.histogramdd.default, (r(5, 4, 3), [2, 3, 2]),
     {"range": [-1.0, 1.0, -2.0, 0.5, 0.0, 2.0], "weight": pos(5, 4), "density": True}),
    ("histogram_edges", aten.histogram.bins_tensor, (r(30), torch.tensor([-1.5, -0.2, 0.0, 0.7, 2.0])), {}),
    ("histogram_edges_weighted", aten.histogram.bins_tensor, (r(30), torch.tensor([-1.0, 0.0, 1.0])),
     {"weight": pos(30), "density": True}),
    ("index_reduce_amax", aten.index_reduce.default, (r(5, 3), 0, ri(5, 6), r(6, 3), "amax"), {}),
    ("index_reduce_mean_excl", aten.index_reduce.default, (r(3, 5), 1, ri(5, 4), r(3, 4), "mean"),
     {"include_self": False}),
    ("put_accumulate", aten.put.default, (r(3, 4), torch.tensor([0, 5, 5, -1]), r(4), True), {}),
    ("take", aten.take.default, (r(3, 4), torch.tensor([[0, 11], [-2, 3]])), {}),
    ("masked_scatter", aten.masked_scatter.default, (r(3, 4), r(4) > 0, r(12)), {}),
    ("unsafe_masked_index", aten._unsafe_masked_index.default,
     (r(4, 5), torch.tensor([[True], [False], [True]]), [torch.tensor([1, 9, 3])], 0.5), {}),
    ("unsafe_masked_index_put_accumulate", aten._unsafe_masked_index_put_accumulate.default,
     (r(4, 2), torch.tensor([[True], [False], [True]]), [torch.tensor([1, 9, 1])], r(3, 2)), {}),
    ("index_put_mask_rows", aten.index_put.default, (r(4, 3), [torch.tensor([True, False, True, True])], r(3, 3)), {}),
    ("index_put_mask_broadcast", aten.index_put.default, (r(4, 3), [r(4, 3) > 0], torch.tensor(2.0), True), {}),
    # pooling indices
    ("max_pool2d_indices", aten.max_pool2d_with_indices.default, (r(2, 3, 7, 7), [3, 3], [2, 2], [1, 1]), {}),
    ("max_pool1d_indices_ties", aten.max_pool1d_with_indices.default, (torch.tensor([[[1.0, 1, 2, 2, 0, 0]]]), [2]), {}),
    ("max_pool3d_indices_ceil", aten.max_pool3d_with_indices.default, (r(1, 1, 5, 5, 5), [2, 2, 2], [2, 2, 2], [0, 0, 0],
                                                                       [1, 1, 1], True), {}),
    ("adaptive_max_pool2d_indices", aten.adaptive_max_pool2d.default, (r(2, 3, 7, 10), [3, 4]), {}),
    ("fractional_max_pool2d", aten.fractional_max_pool2d.default,
     (r(2, 3, 9, 11), [2, 3], [4, 5], torch.rand(2, 3, 2)), {}),
    ("fractional_max_pool2d_unbatched", aten.fractional_max_pool2d.default,
     (r(3, 7, 6), [3, 2], [3, 5], torch.rand(1, 3, 2)), {}),
    ("fractional_max_pool3d", aten.fractional_max_pool3d.default,
     (r(1, 2, 6, 7, 8), [2, 2, 3], [3, 4, 5], torch.rand(1, 2, 3)), {}),
    ("mode", aten.mode.default, (torch.randint(0, 4, (3, 9)).float(),), {}),
    *[(f"segment_reduce_{how}", aten.segment_reduce.default, (r(6, 2), how), {"lengths": torch.tensor([2, 0, 3, 1])})
      for how in ("sum", "mean", "max", "min", "prod")],
    ("segment_reduce_initial", aten.segment_reduce.default, (r(6), "mean"),
     {"lengths": torch.tensor([2, 0, 3, 1]), "initial": 0.5}),
    ("segment_reduce_offsets", aten.segment_reduce.default, (r(6, 3), "max"),
     {"offsets": torch.tensor([0, 2, 2, 6]), "initial": -0.25}),
    ("mode_dim_keepdim", aten.mode.default, (torch.randint(0, 3, (4, 7, 2)).float(), 1, True), {}),
    ("mode_0d", aten.mode.default, (torch.tensor(2.5),), {}),
    ("adaptive_max_pool1d_indices", aten.adaptive_max_pool1d.default, (r(2, 3, 7), [3]), {}),
    ("max_unpool2d", aten.max_unpool2d.default, (*torch.nn.functional.max_pool2d(r(2, 3, 6, 6), 2, return_indices=True),
                                                 [6, 6]), {}),
    ("max_unpool3d", aten.max_unpool3d.default, (*torch.nn.functional.max_pool3d(r(1, 2, 4, 4, 4), 2, return_indices=True),
                                                 [4, 4, 4], [2, 2, 2], [0, 0, 0]), {}),
    ("adaptive_avg_pool3d_private", aten._adaptive_avg_pool3d.default, (r(1, 2, 4, 5, 6), [2, 2, 3]), {}),
    # normalisation statistics
    ("native_layer_norm_stats", aten.native_layer_norm.default, (r(2, 3, 5), [3, 5], r(3, 5), r(3, 5), 1e-5), {}),
    ("native_group_norm", aten.native_group_norm.default, (r(2, 6, 4, 4), r(6), r(6), 2, 6, 16, 3, 1e-5), {}),
    ("native_batch_norm_eval", aten.native_batch_norm.default, (r(2, 3, 4), r(3), r(3), r(3), pos(3), False, 0.1, 1e-5),
     {}),
    ("batch_norm_legit_no_stats_train", aten._native_batch_norm_legit.no_stats, (r(4, 3, 2), r(3), r(3), True, 0.1, 1e-5),
     {}),
    ("batch_norm_legit_eval", aten._native_batch_norm_legit.default, (r(4, 3), r(3), r(3), r(3), pos(3), False, 0.1,
                                                                      1e-5), {}),
]
CASES += [
    ("embedding_bag_offsets_max", aten._embedding_bag.default, (r(10, 3), ri(10, 8), torch.tensor([0, 3, 3, 6]), False, 2),
     {}),
    ("embedding_bag_weights_padding", aten.embedding_bag.padding_idx,
     (r(10, 3), torch.tensor([2, 5, 2, 7, 1, 2, 9, 0]), torch.tensor([0, 4]), False, 0, False, pos(8), False, 2), {}),
    ("embedding_bag_forward_only_last_offset", aten._embedding_bag_forward_only.default,
     (r(10, 3), ri(10, 7), torch.tensor([0, 2, 7]), False, 1, False, None, True), {}),
    ("logspace", aten.logspace.default, (0.0, 2.0, 5), {"base": 2.0}),
    ("nonzero_static", aten.nonzero_static.default, (r(3, 4) > 0,), {"size": 5}),
    ("rrelu_eval", aten.rrelu_with_noise.default, (r(6), torch.zeros(6), 0.1, 0.3, False), {}),
    ("rrelu_op_eval", aten.rrelu.default, (r(6), 0.1, 0.3, False), {}),
    ("native_dropout_off", aten.native_dropout.default, (r(6), 0.5, False), {}),
    ("size_int", aten.size.int, (r(3, 4), 1), {}),
    ("resize_shrinks", aten.resize.default, (r(3, 4), [2, 5]), {}),
]
# the capture's tags of a layer's call (translate/marks.py): identities wherever they are written out
CALL_ARGUMENT, CALL_RESULT = marks.ops()
CASES += [("call_argument", CALL_ARGUMENT, (r(3, 4), "query", "{'need_weights': False}"), {}),
          ("call_result", CALL_RESULT, (r(2, 5), 1), {})]
# uninitialised in torch: compared on shape and dtype (test_uninitialised_ops_make_the_shape_and_dtype)
UNINITIALISED = [("empty_strided", aten.empty_strided.default, ([2, 3], [3, 1]), {}),
                 ("empty_permuted", aten.empty_permuted.default, ([2, 3, 4], [0, 2, 1]), {}),
                 ("new_empty_strided", aten.new_empty_strided.default, (r(2), [3, 2], [2, 1]), {})]
CASES += [(f"polynomial_{name[8:]}", getattr(aten, name).default, (r(8), torch.tensor([0, 1, 2, 3, 4, 5, 7, -1.0])), {})
          for name in ("special_chebyshev_polynomial_t", "special_chebyshev_polynomial_u", "special_chebyshev_polynomial_v",
                       "special_chebyshev_polynomial_w", "special_shifted_chebyshev_polynomial_t",
                       "special_shifted_chebyshev_polynomial_u", "special_shifted_chebyshev_polynomial_v",
                       "special_shifted_chebyshev_polynomial_w", "special_hermite_polynomial_h",
                       "special_hermite_polynomial_he", "special_laguerre_polynomial_l",
                       "special_legendre_polynomial_p")]
# Overloads with a case of their own only where their handler differs; these are exercised by the
# model tests (test_translate*.py): dropout inside modules, tuple outputs, dtype casts of parameters.
BY_MODELS = {"aten.empty", "aten.empty_like", "aten.new_empty",  # torch leaves the values undefined: zeros here
             "aten.dropout", "aten.feature_dropout", "aten.alpha_dropout", "aten.feature_alpha_dropout",
             "getitem", "<built-in function getitem>", "aten.log_sigmoid_forward",
             "aten.multilabel_margin_loss_forward",  # nn.MultiLabelMarginLoss in tests/test_train_optimizers_losses.py
             "transformers.grouped_mm_fallback"}  # test_huggingface_grouped_mm_matches_torch
# Random draws: (id, op, args, kwargs) as above. Given torch's draw (replayed) the translation must
# compute torch's values; drawing on its own, values of torch's distribution.
N = (300, 60)
RANDOM_CASES = [
    ("randn", aten.randn.default, (list(N),), {}),
    ("randn_like", aten.randn_like.default, (r(*N),), {}),
    ("randn_like_float64", aten.randn_like.default, (r(*N),), {"dtype": torch.float64}),
    ("rand", aten.rand.default, (list(N),), {}),
    ("randn_generator", aten.randn.generator, (list(N),), {"generator": torch.Generator().manual_seed(3)}),
    ("rand_generator", aten.rand.generator, (list(N),), {"generator": torch.Generator().manual_seed(4)}),
    ("rand_like", aten.rand_like.default, (r(*N),), {}),
    ("uniform", aten.uniform.default, (r(*N), -2.0, 3.0), {}),
    ("normal_functional", aten.normal_functional.default, (r(*N), 1.5, 2.0), {}),
    ("normal_tensor_float", aten.normal.Tensor_float, (r(*N), 0.5), {}),
    ("normal_float_tensor", aten.normal.float_Tensor, (1.0, pos(*N)), {}),
    ("normal_tensor_tensor", aten.normal.Tensor_Tensor, (r(*N), pos(N[1])), {}),
    ("normal_float_float", aten.normal.float_float, (1.0, 3.0, list(N)), {}),
    ("bernoulli", aten.bernoulli.default, (pos(*N) - 0.5,), {}),
    ("bernoulli_p", aten.bernoulli.p, (r(*N), 0.3), {}),
    ("bernoulli_tensor", aten.bernoulli.Tensor, (r(*N), pos(*N) - 0.5), {}),
    ("randint", aten.randint.default, (7, list(N)), {}),
    ("randint_low", aten.randint.low, (-3, 4, list(N)), {}),
    ("randint_int32", aten.randint.low, (0, 9, list(N)), {"dtype": torch.int32}),
    ("randint_like", aten.randint_like.default, (ri(5, *N), 6), {}),
    ("randint_like_low", aten.randint_like.low_dtype, (ri(5, *N), 2, 6), {}),
    ("exponential", aten.exponential.default, (r(*N), 2.5), {}),
    ("poisson", aten.poisson.default, (3 * pos(*N),), {}),
    ("cauchy", aten.cauchy.default, (r(*N), 0.5, 2.0), {}),
    ("log_normal", aten.log_normal.default, (r(*N), 0.5, 0.4), {}),
    ("geometric", aten.geometric.default, (r(*N), 0.3), {}),
    ("randint_like_float", aten.randint_like.default, (r(*N), 6), {}),
]
REFUSED = {"aten.multinomial", "aten.randperm",  # test_sampling_without_a_translation_says_what_to_do
           "aten.nonzero", "aten.nonzero_numpy", "aten.argwhere", "aten.masked_select", "aten._unique2",
           "aten.unique_consecutive", "aten.unique_dim",
           "aten.chalf", "aten.special_bessel_y0", "aten.special_bessel_y1", "aten.special_modified_bessel_k0",
           "aten.special_modified_bessel_k1", "aten.special_scaled_modified_bessel_k0",
           "aten.special_scaled_modified_bessel_k1", "aten.special_airy_ai", "aten.geqrf", "aten.linalg_ldl_factor_ex",
           "aten.linalg_ldl_factor", "aten.linalg_ldl_solve", "aten.hash_tensor"}  # test_refused_ops_say_why


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_torch(case):
    from flaxport.translate.optest import run_op

    _, target, args, kwargs = case
    got, expected, code = run_op(target, *args, **kwargs)
    assert len(got) == len(expected), code
    for g, e in zip(got, expected):
        if g is None:
            continue
        assert g.shape == e.shape, f"{code}: shape {g.shape} vs torch {e.shape}"
        if e.dtype == bool or np.issubdtype(e.dtype, np.integer):
            np.testing.assert_array_equal(g, e, err_msg=code)
        else:
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(e).max(initial=0))),
                                       err_msg=code)


def test_every_op_in_the_table_has_a_case():
    """A new handler comes with its case above (or a model test that exercises it, BY_MODELS)."""
    from flaxport.translate import ops

    cases = CASES + RANDOM_CASES
    cases += UNINITIALISED
    tested = {str(c[1]).rsplit(".", 1)[0] for c in cases} | {str(c[1]) for c in cases} | REFUSED
    untested = sorted({k for k in ops.OPS if k not in tested and k.rsplit(".", 1)[0] not in tested
                       and k not in BY_MODELS and k.rsplit(".", 1)[0] not in BY_MODELS})
    assert not untested, untested


def test_huggingface_grouped_mm_matches_torch():
    """transformers' mixture-of-experts product (its own op, registered on import): an expert with no
    rows, and rows past the last offset left zero."""
    pytest.importorskip("transformers.integrations.moe")
    from flaxport.translate.optest import run_op

    offs = torch.tensor([2, 2, 5, 6])
    args = (r(8, 3), r(4, 3, 5), offs)
    for g, e in zip(*run_op(torch.ops.transformers.grouped_mm_fallback.default, *args)[:2]):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    assert not np.asarray(g)[6:].any()


@pytest.mark.parametrize("case", RANDOM_CASES, ids=[c[0] for c in RANDOM_CASES])
def test_random_op_given_torchs_draw_computes_torchs_values(case):
    from flaxport.translate.optest import run_op

    _, target, args, kwargs = case
    with jax.enable_x64(True):  # int64 and float64 draws as torch's
        (got,), (expected,), code = run_op(target, *args, replay=True, **kwargs)
    assert "self.noise()" in code, code
    assert got.shape == expected.shape and got.dtype == expected.dtype, (code, got.dtype, expected.dtype)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6, err_msg=code)


@pytest.mark.parametrize("case", RANDOM_CASES, ids=[c[0] for c in RANDOM_CASES])
def test_random_op_draws_from_torchs_distribution(case):
    """Its own draws (18,000 values): mean, spread and deciles within a few standard errors of torch's."""
    from flaxport.translate.optest import run_op

    _, target, args, kwargs = case
    with jax.enable_x64(True):
        (got,), (expected,), code = run_op(target, *args, **kwargs)
    assert got.shape == expected.shape and got.dtype == expected.dtype, code
    assert not np.array_equal(got, expected), code
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    if expected.min() >= 0 and expected.max() <= 1 and np.array_equal(expected, expected.round()):
        assert 0 < got.mean() < 1, code  # 0/1 draws: both values occur
    if case[0] == "cauchy":  # no mean or spread to compare: its deciles, on the scale of its quartiles
        scale = np.quantile(expected, 0.75) - np.quantile(expected, 0.25)
    else:
        scale = expected.std() + 1e-3
        assert abs(got.mean() - expected.mean()) < 0.05 * scale, (code, got.mean(), expected.mean())
        assert abs(got.std() - expected.std()) < 0.05 * scale, (code, got.std(), expected.std())
    step = 1.0 if np.array_equal(expected, expected.round()) else 0.0  # integer deciles may fall one apart
    for q in (0.1, 0.5, 0.9):
        # in probability, not value: a heavy tail (cauchy) moves the 0.9 quantile of 18000 draws by ~0.5
        below = (np.mean(got <= np.quantile(expected, q)), np.mean(got < np.quantile(expected, q)))
        sigma = np.sqrt(2 * q * (1 - q) / got.size)
        assert abs(np.quantile(got, q) - np.quantile(expected, q)) <= 0.05 * scale + step or \
            below[1] - 5 * sigma <= q <= below[0] + 5 * sigma, (code, q, below)


@pytest.mark.parametrize("target,args", [(aten.multinomial.default, (pos(3, 4), 2)),
                                         (aten.randperm.default, (5,))])
def test_sampling_without_a_translation_says_what_to_do(target, args):
    from flaxport.translate.ops import Unsupported
    from flaxport.translate.optest import run_op

    with pytest.raises(Unsupported, match="outside forward and pass"):
        run_op(target, *args)


@pytest.mark.parametrize("target,args,why", [
    (aten.chalf.default, (r(3),), "complex32"),
    (aten.special_bessel_y0.default, (pos(3),), "no counterpart"),
    (aten.special_bessel_y1.default, (pos(3),), "no counterpart"),
    (aten.special_modified_bessel_k0.default, (pos(3),), "no counterpart"),
    (aten.special_modified_bessel_k1.default, (pos(3),), "no counterpart"),
    (aten.special_scaled_modified_bessel_k0.default, (pos(3),), "no counterpart"),
    (aten.special_scaled_modified_bessel_k1.default, (pos(3),), "no counterpart"),
    (aten.special_airy_ai.default, (pos(3),), "no counterpart"),
    (aten.geqrf.default, (r(4, 3),), "JAX keeps it private"),
    (aten.linalg_ldl_factor_ex.default, (r(3, 3) @ r(3, 3).T,), "Bunch-Kaufman"),
    (aten.hash_tensor.default, (r(3),), "jax_enable_x64"),
])
def test_refused_ops_say_why(target, args, why):
    from flaxport.translate.ops import Unsupported
    from flaxport.translate.optest import run_op

    with pytest.raises(Unsupported, match=why):
        run_op(target, *args)


@pytest.mark.parametrize("case", UNINITIALISED, ids=[c[0] for c in UNINITIALISED])
def test_uninitialised_ops_make_the_shape_and_dtype(case):
    from flaxport.translate.optest import run_op

    _, target, args, kwargs = case
    (got,), (expected,), code = run_op(target, *args, **kwargs)
    assert got.shape == expected.shape and got.dtype == expected.dtype, code


@pytest.mark.parametrize("target,args", [(aten.nonzero.default, (r(3, 4) > 0,)), (aten.masked_select.default, (r(3), r(3) > 0)),
                                         (aten._unique2.default, (ri(3, 6),)), (aten.argwhere.default, (r(3) > 0,))])
def test_value_sized_results_are_refused_saying_why(target, args):
    from flaxport.translate.ops import Unsupported
    from flaxport.translate.optest import run_op

    with pytest.raises(Unsupported, match="size depends on tensor values"):
        run_op(target, *args)


@pytest.mark.parametrize("channels_last", [False, True])
def test_tiling_max_pool_sends_the_gradient_to_each_windows_first_maximum_as_torch(channels_last):
    """Windows with ties (ReLU's zeros, repeated values): torch's gradient goes to the first
    maximum of each window; so must the runtime's (its value comes from reduce_window)."""
    import jax
    import jax.numpy as jnp

    from flaxport.runtime.functions import max_pool

    x = torch.tensor(np.random.default_rng(0).integers(-2, 3, (2, 3, 9, 8)).astype(np.float32), requires_grad=True)
    weights = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    (torch.nn.functional.max_pool2d(x, 2) * weights).sum().backward()

    def loss(v):
        if channels_last:
            return jnp.sum(max_pool(v.transpose(0, 2, 3, 1), (2, 2), channels_last=True).transpose(0, 3, 1, 2)
                           * weights.numpy())
        return jnp.sum(max_pool(v, (2, 2)) * weights.numpy())

    value, grad = jax.value_and_grad(loss)(jnp.asarray(x.detach().numpy()))
    np.testing.assert_allclose(value, (torch.nn.functional.max_pool2d(x, 2) * weights).sum().item(), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(grad), x.grad.numpy())


OVERLAPPING = [((2, 3, 9, 8), (3, 3), (2, 2), (1, 1), (1, 1), False),  # ResNet's stem pool
               ((2, 3, 9, 8), (3, 3), (2, 2), (1, 1), (1, 1), True),
               ((1, 2, 11, 10), (3, 2), (1, 2), (1, 0), (2, 1), False),
               ((2, 3, 13), (3,), (2,), (1,), (1,), True),
               ((1, 2, 5, 6, 7), (3, 3, 3), (2, 1, 2), (1, 1, 0), (1, 1, 1), False)]


@pytest.mark.parametrize("values", ["ties", "nan", "minus_inf"])
@pytest.mark.parametrize("case", OVERLAPPING, ids=lambda c: f"{len(c[1])}d-k{c[1]}-s{c[2]}-d{c[4]}-ceil{c[5]}")
def test_overlapping_max_pool_sends_the_gradient_where_torch_does(case, values):
    """Windows that overlap (stride below the kernel), with ties, NaNs and all -inf windows:
    torch's gradient goes to each window's first maximum, to its last NaN, and in an all -inf
    window to its first cell inside the image (never the padding)."""
    import jax
    import jax.numpy as jnp

    from flaxport.runtime.functions import max_pool

    shape, kernel, stride, padding, dilation, ceil_mode = case
    rng = np.random.default_rng(len(shape) + len(values))
    x = rng.integers(-2, 3, shape).astype(np.float32)
    if values == "nan":
        x.flat[rng.integers(0, x.size, 6)] = np.nan
    if values == "minus_inf":
        x[..., :3] = -np.inf
        x[0] = -np.inf
    pool = {1: torch.nn.functional.max_pool1d, 2: torch.nn.functional.max_pool2d,
            3: torch.nn.functional.max_pool3d}[len(kernel)]
    xt = torch.tensor(x, requires_grad=True)
    yt = pool(xt, kernel, stride, padding, dilation, ceil_mode)
    weights = torch.tensor(rng.standard_normal(yt.shape).astype(np.float32))
    (yt * weights).sum().backward()

    def loss(v):
        return jnp.sum(max_pool(v, kernel, stride, padding, dilation, ceil_mode) * weights.numpy())

    np.testing.assert_array_equal(np.asarray(max_pool(jnp.asarray(x), kernel, stride, padding, dilation, ceil_mode)),
                                  yt.detach().numpy())
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(jnp.asarray(x))), xt.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_every_core_aten_overload_has_a_handler():
    """torch's core opset (torch.Tag.core) is in the table, less the backward ops (a train step
    differentiates the forward in JAX, so an exported forward never holds them) and out= overloads;
    an in-place op (`resize_`) is there as the functional op capture rewrites it into. Every
    registered operator is listed (`dir(torch.ops.aten)` holds only those loaded so far)."""
    from flaxport.translate import ops

    core = []
    for registered in torch._C._dispatch_get_all_op_names():
        if not registered.startswith("aten::"):
            continue
        name, _, overload = registered[len("aten::"):].partition(".")
        packet = getattr(torch.ops.aten, name, None)
        overload_op = getattr(packet, overload or "default", None)
        if overload_op is not None and torch.Tag.core in overload_op.tags:
            core.append(f"aten.{name}.{overload or 'default'}")
    assert len(core) > 150
    wanted = [c for c in core if "_backward" not in c and not c.endswith(".out")]

    def in_table(c):
        packet, overload = c.rsplit(".", 1)
        functional = packet[:-1] if packet.endswith("_") and not packet.endswith("__") else packet
        return any(k in ops.OPS for k in (c, packet, f"{functional}.{overload}", functional))

    missing = [c for c in wanted if not in_table(c)]
    assert not missing, missing
