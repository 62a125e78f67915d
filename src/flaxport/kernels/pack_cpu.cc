// Packs a convolution's weights for the forward kernel (conv_cpu.cc), through the XLA FFI.
//
//   flaxport_conv_pack: w (torch's O, I, kh, kw or HWIO) -> (G, B, kh', kw', Ci', 16V)
//
// Block b of group g holds output channels [16V b, 16V (b + 1)) of the group, zeros past
// the last. swap = 0 packs the convolution's own weights (Ci' = I, O/G outputs a group);
// swap = 1 those of its input gradient (in and out channels swapped within each group:
// Ci' = O/G, I outputs a group). Kernel tap (a, b) of the result is tap (row_start +
// a * row_step, col_start + b * col_step) of w: negative steps flip the kernel, steps above
// one pick a stride's phase (phases.py).
#include "simd.h"
#include "weights.h"

namespace flaxport {
namespace {

// `after` is not read: the pack waits for it (ffi_conv.pack says why).
ffi::Error Pack(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> w, ffi::AnyBuffer after, ffi::ResultBuffer<ffi::F32> packed,
                int64_t layout, int64_t swap, int64_t row_start, int64_t row_step, int64_t col_start,
                int64_t col_step) {
  auto wd = w.dimensions(), pd = packed->dimensions();
  WeightLayout lw;
  if (wd.size() != 4 || pd.size() != 6 || !WeightLayout::make(layout, wd.begin(), &lw))
    return invalid("flaxport_conv_pack: bad ranks or layout");
  const int64_t groups = pd[0], blocks = pd[1], kh = pd[2], kw = pd[3], ci = pd[4], width = pd[5];
  if (groups < 1 || lw.out % groups != 0) return invalid("flaxport_conv_pack: groups do not divide the channels");
  const int64_t group_out = lw.out / groups;
  const int64_t outs = swap ? lw.in : group_out, ins = swap ? group_out : lw.in;
  const auto inside = [](int64_t first, int64_t step, int64_t count, int64_t size) {
    return count > 0 && first >= 0 && first < size && first + (count - 1) * step >= 0 &&
           first + (count - 1) * step < size;
  };
  if (ci != ins || width % kLanes != 0 || outs > blocks * width || outs <= blocks * width - kLanes ||
      !inside(row_start, row_step, kh, lw.kh) || !inside(col_start, col_step, kw, lw.kw))
    return invalid("flaxport_conv_pack: shapes do not fit");
  const float* src = w.typed_data();
  float* dst = packed->typed_data();
  const int64_t block_size = kh * kw * ci * width;
  const int64_t taps = kh * kw, lane_stride = swap ? lw.si : lw.so;
  std::vector<int64_t> tap_at(taps);
  bool in_order = !swap && lw.si == taps;  // a row of w: (p, tap) in the packed order (torch's OIHW)
  for (int64_t a = 0; a < kh; ++a)
    for (int64_t b = 0; b < kw; ++b) {
      tap_at[a * kw + b] = (row_start + a * row_step) * lw.sr + (col_start + b * col_step) * lw.sc;
      in_order = in_order && tap_at[a * kw + b] == a * kw + b;
    }
  // Packing ResNet-18's 45 MB of weights lane by lane took 18 ms, as long as the forward of
  // its convolutions at 64x64. Where a row of w runs through (p, tap) in the packed order,
  // 16 rows x 16 values are read whole and transposed in registers; elsewhere each vector of
  // 16 output channels is gathered.
  parallel_for(pool, groups * blocks, [&](int64_t gb) {
    const int64_t g = gb / blocks, q0 = (gb % blocks) * width;
    float* block = dst + gb * block_size;
    int64_t k0 = 0;  // (p, tap) pairs packed so far, all lanes
    if (in_order) {
      const int64_t row_length = ci * taps;
      for (int64_t l = 0; l < width; l += kLanes) {
        const float* rows[kLanes];
        for (int r = 0; r < kLanes; ++r) {
          const int64_t q = q0 + l + r;
          rows[r] = q < outs ? src + lw.at(g * group_out + q, 0, 0, 0) : nullptr;
        }
        for (int64_t k = 0, p = 0, t = 0; k + kLanes <= row_length; k += kLanes) {  // (p, t): k's
          vec tile[kLanes];
          for (int r = 0; r < kLanes; ++r) tile[r] = rows[r] ? load(rows[r] + k) : vec{};
          transpose(tile);
          for (int c = 0; c < kLanes; ++c) {
            store(block + (t * ci + p) * width + l, tile[c]);
            if (++t == taps) t = 0, ++p;
          }
        }
      }
      k0 = row_length / kLanes * kLanes;
    }
    for (int64_t k = k0; k < ci * taps; ++k) {
      const int64_t p = k / taps, t = k % taps;
      const float* in =
          src + (swap ? lw.at(g * group_out + p, q0, 0, 0) : lw.at(g * group_out + q0, p, 0, 0)) + tap_at[t];
      float* out = block + (t * ci + p) * width;
      for (int64_t l = 0; l < width; l += kLanes) {
        const int64_t valid = std::min<int64_t>(kLanes, std::max<int64_t>(0, outs - q0 - l));
        store(out + l, gather(in + l * lane_stride, lane_stride, static_cast<int>(valid)));
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace flaxport

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlaxportConvPack, flaxport::Pack,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Attr<int64_t>("layout")
                                  .Attr<int64_t>("swap")
                                  .Attr<int64_t>("row_start")
                                  .Attr<int64_t>("row_step")
                                  .Attr<int64_t>("col_start")
                                  .Attr<int64_t>("col_step"));
