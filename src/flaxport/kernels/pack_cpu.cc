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

ffi::Error Pack(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> packed, int64_t layout,
                int64_t swap, int64_t row_start, int64_t row_step, int64_t col_start, int64_t col_step) {
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
  // Per input channel p, lane by lane: a lane's kernel taps are close together in torch's
  // layout, and the kh' * kw' lines of the block they land in stay in L1 for the next lane.
  parallel_for(pool, groups * blocks, [&](int64_t gb) {
    const int64_t g = gb / blocks, q0 = (gb % blocks) * width;
    float* block = dst + gb * block_size;
    for (int64_t p = 0; p < ci; ++p)
      for (int64_t l = 0; l < width; ++l) {
        const int64_t q = q0 + l;  // output channel of the group
        float* out = block + p * width + l;
        if (q >= outs) {
          for (int64_t t = 0; t < kh * kw; ++t) out[t * ci * width] = 0.0f;
          continue;
        }
        const float* in = src + (swap ? lw.at(g * group_out + p, q, 0, 0) : lw.at(g * group_out + q, p, 0, 0));
        for (int64_t a = 0; a < kh; ++a)
          for (int64_t b = 0; b < kw; ++b)
            out[(a * kw + b) * ci * width] = in[(row_start + a * row_step) * lw.sr + (col_start + b * col_step) * lw.sc];
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
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Attr<int64_t>("layout")
                                  .Attr<int64_t>("swap")
                                  .Attr<int64_t>("row_start")
                                  .Attr<int64_t>("row_step")
                                  .Attr<int64_t>("col_start")
                                  .Attr<int64_t>("col_step"));
