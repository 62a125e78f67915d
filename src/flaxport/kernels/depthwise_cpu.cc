// Depthwise NHWC convolution (groups = channels, one filter per channel) for XLA:CPU.
//
// Why: XLA:CPU runs a depthwise convolution as a grouped one, at 0.1-3 GFLOP/s here, 10-100x
// slower than PyTorch's oneDNN; MobileNet, EfficientNet and ConvNeXt are made of them. Here
// the channels are the vector lanes: each tile keeps RW output pixels x CB channel vectors
// in registers while the kh x kw window streams past.
//
// Two operations, "valid" (the caller pads), float32, any stride, dilation and kernel size:
//   flaxport_depthwise_fwd: x (N, Hp, Wp, C), w (kh, kw, C16) -> y (N, Ho, Wo, C)
//   flaxport_depthwise_dw:  x (N, Hp, Wp, C), dy (N, Ho, Wo, C) -> dw (kh, kw, C16)
// C16 is C rounded up to a multiple of 16 (the caller pads w, and drops dw's padding lanes).
// The input gradient is flaxport_depthwise_fwd of dy with the flipped kernel (conv.py).
#include "simd.h"

namespace flaxport {
namespace {

// y[r, 0:CB*16] = sum over kernel positions p of x[r*pixel_step + off[p]] * w[p] (lane by
// lane), for R consecutive output pixels r of a row.
template <int R, int CB, bool Partial>
void fwd_tile(const float* x, const float* w, float* y, const int64_t* off, int64_t positions, int64_t pixel_step,
              int64_t cp, int64_t c, const Tail& tail) {
  vec acc[R][CB] = {};
  for (int64_t p = 0; p < positions; ++p) {
    vec wv[CB];
    for (int b = 0; b < CB; ++b) wv[b] = load(w + p * cp + b * kLanes);
    const float* xt = x + off[p];
    for (int r = 0; r < R; ++r) {
      for (int b = 0; b < CB - 1; ++b) acc[r][b] += load(xt + r * pixel_step + b * kLanes) * wv[b];
      acc[r][CB - 1] += load_last<Partial>(xt + r * pixel_step + (CB - 1) * kLanes, tail) * wv[CB - 1];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < CB - 1; ++b) store(y + r * c + b * kLanes, acc[r][b]);
    store_last<Partial>(y + r * c + (CB - 1) * kLanes, acc[r][CB - 1], tail);
  }
}

// Pixels (forward) or taps (weight gradient) per tile: R x CB accumulators, CB weights or
// gradients and a load within 32 registers.
template <int CB>
constexpr int kTile = CB == 1 ? 16 : CB == 2 ? 12 : 6;

template <int CB, bool Partial>
void fwd_row(const float* x, const float* w, float* y, const int64_t* off, int64_t positions, int64_t pixel_step,
             int64_t cp, int64_t c, int64_t wo, const Tail& tail) {
  constexpr int R = kTile<CB>;
  int64_t col = 0;
  for (; col + R <= wo; col += R)
    fwd_tile<R, CB, Partial>(x + col * pixel_step, w, y + col * c, off, positions, pixel_step, cp, c, tail);
  with_size<R>(wo - col, [&](auto rest) {
    fwd_tile<decltype(rest)::value, CB, Partial>(x + col * pixel_step, w, y + col * c, off, positions, pixel_step,
                                                 cp, c, tail);
  });
}

// Stride 1, no dilation: R consecutive pixels of a row read R + KW - 1 consecutive cells of
// each kernel row, so each cell is loaded once and used by the KW taps that read it (a
// third of the loads of fwd_tile for a 3x3 kernel, a seventh for 7x7). One vector of channels.
template <int R, int KW, bool Partial>
void fwd_slide(const float* x, const float* w, float* y, int64_t kh, int64_t row_step, int64_t cp, int64_t c,
               const Tail& tail) {
  vec acc[R] = {};
  for (int64_t i = 0; i < kh; ++i) {
    vec wv[KW];
    for (int j = 0; j < KW; ++j) wv[j] = load(w + (i * KW + j) * cp);
    const float* xr = x + i * row_step;
    // Unrolled whole: the accumulators stay in registers only if every index is a constant.
#pragma GCC unroll 32
    for (int u = 0; u < R + KW - 1; ++u) {
      const vec xv = load_last<Partial>(xr + u * c, tail);
#pragma GCC unroll 8
      for (int j = 0; j < KW; ++j)
        if (u - j >= 0 && u - j < R) acc[u - j] += xv * wv[j];
    }
  }
  for (int r = 0; r < R; ++r) store_last<Partial>(y + r * c, acc[r], tail);
}

template <int KW, bool Partial>
void fwd_slide_row(const float* x, const float* w, float* y, const int64_t* off, int64_t kh, int64_t row_step,
                   int64_t cp, int64_t c, int64_t wo, const Tail& tail) {
  constexpr int R = KW <= 3 ? 16 : 14;
  int64_t col = 0;
  for (; col + R <= wo; col += R) fwd_slide<R, KW, Partial>(x + col * c, w, y + col * c, kh, row_step, cp, c, tail);
  with_size<R>(wo - col, [&](auto rest) {
    fwd_tile<decltype(rest)::value, 1, Partial>(x + col * c, w, y + col * c, off, kh * KW, c, cp, c, tail);
  });
}

// The output pixels a weight-gradient sweep reads: `rows` rows of `images` images.
struct Sweep {
  int64_t images, rows, x_image, dy_image, x_row, x_col, wo, c;
};

// dw[t, 0:CB*16] += sum over the sweep's pixels of x[pixel + off[t]] * dy[pixel] (lane by
// lane), for R kernel positions t.
template <int R, int CB, bool Partial>
void dw_tile(const float* x, const float* dy, float* dw, const int64_t* off, const Sweep& s, int64_t cp,
             const Tail& tail) {
  vec acc[R][CB] = {};
  for (int64_t m = 0; m < s.images; ++m)
    for (int64_t h = 0; h < s.rows; ++h) {
      const float* xr = x + m * s.x_image + h * s.x_row;
      const float* dyr = dy + m * s.dy_image + h * s.wo * s.c;
      for (int64_t col = 0; col < s.wo; ++col) {
        vec g[CB];
        for (int b = 0; b < CB - 1; ++b) g[b] = load(dyr + col * s.c + b * kLanes);
        g[CB - 1] = load_last<Partial>(dyr + col * s.c + (CB - 1) * kLanes, tail);
        const float* xp = xr + col * s.x_col;
        for (int t = 0; t < R; ++t) {
          for (int b = 0; b < CB - 1; ++b) acc[t][b] += load(xp + off[t] + b * kLanes) * g[b];
          acc[t][CB - 1] += load_last<Partial>(xp + off[t] + (CB - 1) * kLanes, tail) * g[CB - 1];
        }
      }
    }
  for (int t = 0; t < R; ++t)
    for (int b = 0; b < CB; ++b) {
      float* d = dw + t * cp + b * kLanes;
      store(d, load(d) + acc[t][b]);
    }
}

template <int CB, bool Partial>
void dw_positions(const float* x, const float* dy, float* dw, const int64_t* off, int64_t positions, const Sweep& s,
                  int64_t cp, const Tail& tail) {
  constexpr int R = kTile<CB> / 2;
  int64_t t = 0;
  for (; t + R <= positions; t += R) dw_tile<R, CB, Partial>(x, dy, dw + t * cp, off + t, s, cp, tail);
  with_size<R>(positions - t, [&](auto rest) {
    dw_tile<decltype(rest)::value, CB, Partial>(x, dy, dw + t * cp, off + t, s, cp, tail);
  });
}

std::vector<int64_t> position_offsets(int64_t kh, int64_t kw, int64_t dh, int64_t dwl, int64_t wp, int64_t c) {
  std::vector<int64_t> off(kh * kw);
  for (int64_t i = 0; i < kh; ++i)
    for (int64_t j = 0; j < kw; ++j) off[i * kw + j] = (i * dh * wp + j * dwl) * c;
  return off;
}

// f(CB, Partial, tail) for channel block [c0, c0 + cb*16) of c channels.
template <class F>
void with_channels(const ChannelBlock& blk, int64_t c, const F& f) {
  const Tail tail(static_cast<int>(std::min<int64_t>(kLanes, c - blk.c0 - (blk.cb - 1) * kLanes)));
  with_block<3>(blk.cb, [&](auto cb) { with_tail(tail, [&](auto partial) { f(cb, partial, tail); }); });
}

ffi::Error DepthwiseFwd(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                        ffi::ResultBuffer<ffi::F32> y, int64_t sh, int64_t sw, int64_t dh, int64_t dwl) {
  auto xd = x.dimensions(), wd = w.dimensions(), yd = y->dimensions();
  if (xd.size() != 4 || wd.size() != 3 || yd.size() != 4 || sh < 1 || sw < 1 || dh < 1 || dwl < 1)
    return invalid("flaxport_depthwise_fwd: bad shapes or window");
  const int64_t n = xd[0], hp = xd[1], wp = xd[2], c = xd[3], kh = wd[0], kw = wd[1], cp = wd[2];
  const int64_t ho = window_out(hp, kh, sh, dh), wo = window_out(wp, kw, sw, dwl);
  if (cp % kLanes != 0 || c > cp || c < 1 || yd[0] != n || yd[1] != ho || yd[2] != wo || yd[3] != c)
    return invalid("flaxport_depthwise_fwd: shapes do not fit");
  if (n * ho * wo == 0) return ffi::Error::Success();
  const std::vector<int64_t> off = position_offsets(kh, kw, dh, dwl, wp, c);
  const float* xs = x.typed_data();
  const float* ws = w.typed_data();
  float* ys = y->typed_data();
  const std::vector<ChannelBlock> blocks = channel_blocks<3>(1, cp / kLanes);
  // Measured: sliding wins for 5x5 and 7x7 (75 and 100 against 66 and 70 GFLOP/s on one core), not 3x3.
  const bool slide = sw == 1 && dwl == 1 && kw >= 5 && kw <= 7;
  parallel_for(pool, n * ho, [&](int64_t row) {
    const int64_t img = row / ho, h = row % ho;
    const float* xr = xs + (img * hp + h * sh) * wp * c;
    float* yr = ys + row * wo * c;
    if (slide) {
      for (int64_t c0 = 0; c0 < cp; c0 += kLanes) {
        const Tail tail(static_cast<int>(std::min<int64_t>(kLanes, c - c0)));
        with_size<8>(kw, [&](auto k) {
          with_tail(tail, [&](auto partial) {
            fwd_slide_row<decltype(k)::value, decltype(partial)::value>(xr + c0, ws + c0, yr + c0, off.data(), kh,
                                                                        dh * wp * c, cp, c, wo, tail);
          });
        });
      }
      return;
    }
    for (const ChannelBlock& blk : blocks)
      with_channels(blk, c, [&](auto cb, auto partial, const Tail& tail) {
        fwd_row<decltype(cb)::value, decltype(partial)::value>(xr + blk.c0, ws + blk.c0, yr + blk.c0, off.data(),
                                                               kh * kw, sw * c, cp, c, wo, tail);
      });
  });
  return ffi::Error::Success();
}

ffi::Error DepthwiseDw(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy,
                       ffi::ResultBuffer<ffi::F32> dw, int64_t sh, int64_t sw, int64_t dh, int64_t dwl) {
  auto xd = x.dimensions(), gd = dy.dimensions(), wd = dw->dimensions();
  if (xd.size() != 4 || gd.size() != 4 || wd.size() != 3 || sh < 1 || sw < 1 || dh < 1 || dwl < 1)
    return invalid("flaxport_depthwise_dw: bad shapes or window");
  const int64_t n = xd[0], hp = xd[1], wp = xd[2], c = xd[3], kh = wd[0], kw = wd[1], cp = wd[2];
  const int64_t ho = gd[1], wo = gd[2], positions = kh * kw, size = positions * cp;
  if (cp % kLanes != 0 || c > cp || c < 1 || gd[0] != n || gd[3] != c || window_out(hp, kh, sh, dh) != ho ||
      window_out(wp, kw, sw, dwl) != wo)
    return invalid("flaxport_depthwise_dw: shapes do not fit");
  if (n * ho * wo == 0) {
    std::memset(dw->typed_data(), 0, size * sizeof(float));
    return ffi::Error::Success();
  }
  const std::vector<int64_t> off = position_offsets(kh, kw, dh, dwl, wp, c);
  const Chunks chunks(n, ho, wo);
  float* out = dw->typed_data();
  std::vector<float> partial(chunks.groups > 1 ? chunks.groups * size : 0, 0.0f);
  if (chunks.groups == 1) std::memset(out, 0, size * sizeof(float));
  const float* xs = x.typed_data();
  const float* gs = dy.typed_data();
  const int64_t x_image = hp * wp * c, dy_image = ho * wo * c, x_row = sh * wp * c;
  // Tasks: a pixel group x a channel block; each dw element is summed by one task, in order.
  const std::vector<ChannelBlock> blocks = channel_blocks<3>(1, cp / kLanes);
  const int64_t per_part = static_cast<int64_t>(blocks.size());
  parallel_for(pool, chunks.groups * per_part, [&](int64_t task) {
    const int64_t part = task / per_part;
    const ChannelBlock& blk = blocks[task % per_part];
    float* acc = (chunks.groups > 1 ? partial.data() + part * size : out) + blk.c0;
    chunks.for_group(part, n, ho, [&](int64_t img, int64_t images, int64_t h0, int64_t rows) {
      const Sweep sweep{images, rows, x_image, dy_image, x_row, sw * c, wo, c};
      const float* xr = xs + img * x_image + h0 * x_row + blk.c0;
      const float* gr = gs + img * dy_image + h0 * wo * c + blk.c0;
      with_channels(blk, c, [&](auto cb, auto partial, const Tail& tail) {
        dw_positions<decltype(cb)::value, decltype(partial)::value>(xr, gr, acc, off.data(), positions, sweep, cp,
                                                                    tail);
      });
    });
  });
  if (chunks.groups > 1) sum_partials(partial, chunks.groups, size, out);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace flaxport

#define FLAXPORT_WINDOW_ATTRS     \
  .Attr<int64_t>("stride_h")      \
      .Attr<int64_t>("stride_w")  \
      .Attr<int64_t>("dilation_h") \
      .Attr<int64_t>("dilation_w")

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlaxportDepthwiseFwd, flaxport::DepthwiseFwd,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>() FLAXPORT_WINDOW_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlaxportDepthwiseDw, flaxport::DepthwiseDw,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>() FLAXPORT_WINDOW_ATTRS);
