// Direct (implicit-GEMM) NHWC convolution for XLA:CPU, called through the XLA FFI.
//
// Why: XLA:CPU in jaxlib 0.10 lowers a convolution to YNNPACK or to Eigen, both slower
// here than oneDNN's direct convolution in PyTorch (grouped ones 10-100x slower); the
// pure-JAX im2col form spends more time writing and reading the patch matrix than
// multiplying it (docs/cpu.md). These kernels never materialise patches: each output
// tile keeps its sums in vector registers while the kh x kw window streams past.
//
// Two operations, float32, any stride, dilation, kernel size and group count:
//   flaxport_conv_fwd: x (N, H, W, Cin), w (G, B, kh, kw, Cin/G, 16V) -> y (N, Ho, Wo, G*Cog),
//                      x zero-padded by the attributes pad_top/bottom/left/right (not copied)
//   flaxport_conv_dw:  x (N, Hp, Wp, Cin), dy (N, Ho, Wo, G*Cog) -> dw (G*Cog, Cin/G, kh, kw),
//                      "valid" (the caller pads x)
// Cog (attribute group_out_channels) is the output channels of a group, held in B blocks of
// V <= 4 vectors (16V channels), zeros past Cog: pack_cpu.cc packs torch's weights so, and
// dw is written in torch's layout (or HWIO, attribute layout). A block's weights are
// contiguous, so a tile streams them in order (with 512 channels in a row, the hardware
// prefetcher lost track of 256 bytes read out of every 2 KB). The input gradient is
// flaxport_conv_fwd of dy with the flipped kernel (in JAX, ffi_conv.py). Work is split over
// XLA's intra-op thread pool.
#include "simd.h"
#include "weights.h"

namespace flaxport {
namespace {

// Register tile: R pixels (or taps) x CB vectors of accumulators, plus CB weights and a
// broadcast, within 32 vector registers.
template <int CB>
constexpr int kTile = CB == 1 ? 14 : CB == 2 ? 12 : CB == 3 ? 8 : 6;

// y[r, 0:CB*16] = sum over kernel positions p in taken[0:count] and group channels c of
// x[pixel r's window + off[p] + c] * w[p, c, 0:CB*16], for R output pixels r anywhere in
// the batch (a tile may cross rows and images, so small images still fill the registers).
template <int R, int CB, bool Partial>
void fwd_tile(const float* const* xr, const float* w, float* const* yr, const int64_t* off, const int64_t* taken,
              int64_t count, int64_t cig, const Tail& tail, bool streaming) {
  vec acc[R][CB] = {};
  for (int64_t k = 0; k < count; ++k) {
    const int64_t p = taken[k], o = off[p];
    const float* wt = w + p * cig * CB * kLanes;
    for (int64_t c = 0; c < cig; ++c, wt += CB * kLanes) {
      vec wv[CB];
      for (int b = 0; b < CB; ++b) wv[b] = load(wt + b * kLanes);
      for (int r = 0; r < R; ++r) {
        vec xv = broadcast(xr[r] + o + c);
        for (int b = 0; b < CB; ++b) acc[r][b] += xv * wv[b];
      }
    }
  }
  if (!Partial && streaming) {
    for (int r = 0; r < R; ++r)
      for (int b = 0; b < CB; ++b) store_streaming(yr[r] + b * kLanes, acc[r][b]);
    return;
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < CB - 1; ++b) store(yr[r] + b * kLanes, acc[r][b]);
    store_last<Partial>(yr[r] + (CB - 1) * kLanes, acc[r][CB - 1], tail);
  }
}

// Where output pixels live: pixel m of the flattened (n, ho, wo) output has its window at
// rows oy.. and columns ox.. of image img of the unpadded x (oy, ox < 0 in the top and left
// padding) and writes y + y_at(m).
struct PixelMap {
  const float* x;
  float* y;
  int64_t ho, wo, h, w, x_image, x_row, x_col, sh, sw, pad_top, pad_left, kh, kw, dh, dw, cout;
  void origin(int64_t m, int64_t* img, int64_t* oy, int64_t* ox) const {
    const int64_t rest = m % (ho * wo);
    *img = m / (ho * wo);
    *oy = (rest / wo) * sh - pad_top;
    *ox = (rest % wo) * sw - pad_left;
  }
  // The kernel taps [first, last) of one axis whose cells lie in the image.
  static void in_image(int64_t start, int64_t taps, int64_t dilation, int64_t size, int64_t* first, int64_t* last) {
    *first = start >= 0 ? 0 : (-start + dilation - 1) / dilation;
    *last = start >= size ? 0 : std::min(taps, (size - 1 - start) / dilation + 1);
  }
  const float* x_at(int64_t img, int64_t oy, int64_t ox) const { return x + img * x_image + oy * x_row + ox * x_col; }
  float* y_at(int64_t m) const { return y + m * cout; }
};

// The padding is never written out (a copy of every layer's input): a window inside the image
// reads all kernel positions, a window on the image's rim only those whose cell is in the image
// (the padding's products are zeros: torch's oneDNN skips them too, and a 7x7 input gradient of
// a 1x1 map has 48 of every 49 in it). Rim pixels with the same positions share a tile.
template <int CB, bool Partial>
void fwd_pixels(const PixelMap& map, int64_t first, int64_t last, const float* w, const int64_t* off,
                const int64_t* every, int64_t positions, int64_t cig, const Tail& tail, bool streaming) {
  constexpr int R = kTile<CB>;
  const float* xr[R];
  float* yr[R];
  const float* xs[R];
  float* ys[R];
  int tiled = 0, rims = 0;
  int64_t window[4] = {-1, -1, -1, -1}, count = 0;
  // A rim window is read from its first cell in the image, each taken position at its offset
  // from that cell (`shifted`): no pointer ever points outside x.
  thread_local std::vector<int64_t> taken, shifted;
  if (static_cast<int64_t>(taken.size()) < positions) taken.resize(positions), shifted.resize(positions);
  auto flush_tile = [&]() {
    with_size<R + 1>(tiled, [&](auto size) {
      fwd_tile<decltype(size)::value, CB, Partial>(xr, w, yr, off, every, positions, cig, tail, streaming);
    });
    tiled = 0;
  };
  auto flush_rim = [&]() {
    with_size<R + 1>(rims, [&](auto size) {
      fwd_tile<decltype(size)::value, CB, Partial>(xs, w, ys, shifted.data(), taken.data(), count, cig, tail,
                                                   streaming);
    });
    rims = 0;
  };
  for (int64_t m = first; m < last; ++m) {
    int64_t img, oy, ox, taps[4];
    map.origin(m, &img, &oy, &ox);
    PixelMap::in_image(oy, map.kh, map.dh, map.h, &taps[0], &taps[1]);
    PixelMap::in_image(ox, map.kw, map.dw, map.w, &taps[2], &taps[3]);
    if (taps[0] == 0 && taps[1] == map.kh && taps[2] == 0 && taps[3] == map.kw) {
      xr[tiled] = map.x_at(img, oy, ox), yr[tiled] = map.y_at(m);
      if (++tiled == R) flush_tile();
      continue;
    }
    if (rims && !std::equal(taps, taps + 4, window)) flush_rim();
    if (!std::equal(taps, taps + 4, window)) {
      std::copy(taps, taps + 4, window);
      count = 0;
      for (int64_t i = taps[0]; i < taps[1]; ++i)
        for (int64_t j = taps[2]; j < taps[3]; ++j) taken[count++] = i * map.kw + j;
      for (int64_t k = 0; k < count; ++k) shifted[taken[k]] = off[taken[k]] - off[taken[0]];
    }
    // a window wholly in the padding reads nothing (its sum is zero): any cell of x will do
    xs[rims] = count ? map.x_at(img, oy + taps[0] * map.dh, ox + taps[2] * map.dw) : map.x;
    ys[rims] = map.y_at(m);
    if (++rims == R) flush_rim();
  }
  if (tiled) flush_tile();
  if (rims) flush_rim();
}

// The output pixels a weight-gradient sweep reads: `rows` rows of `images` images, each
// pixel's x and dy vectors at the strides below.
struct Sweep {
  int64_t images, rows, wo, x_image, x_row, x_col, dy_image, dy_row, dy_col;
};

// dw[t, 0:CB*16] += sum over the sweep's pixels of x[pixel + off[t]] * dy[pixel, 0:CB*16],
// for R taps t (a tap: a kernel position and a group channel). Not inlined: inlined into
// ConvDw's task, GCC kept the accumulators on the stack and stored them after every pixel
// (the kernel ran at 50-66% of the forward's rate); a masked load in the loop did the same,
// so a partial last vector is packed first (pack_dy).
template <int R, int CB>
__attribute__((noinline)) void dw_tile(const float* x, const float* dy, float* dw, const int64_t* off,
                                       const Sweep& s) {
  vec acc[R][CB] = {};
  for (int64_t m = 0; m < s.images; ++m)
    for (int64_t h = 0; h < s.rows; ++h) {
      const float* xr = x + m * s.x_image + h * s.x_row;
      const float* dyr = dy + m * s.dy_image + h * s.dy_row;
      for (int64_t c = 0; c < s.wo; ++c) {
        vec g[CB];
        for (int b = 0; b < CB; ++b) g[b] = load(dyr + c * s.dy_col + b * kLanes);
        const float* xp = xr + c * s.x_col;
        for (int t = 0; t < R; ++t) {
          vec xv = broadcast(xp + off[t]);
          for (int b = 0; b < CB; ++b) acc[t][b] += xv * g[b];
        }
      }
    }
  for (int t = 0; t < R; ++t)
    for (int b = 0; b < CB; ++b) {
      float* d = dw + (t * CB + b) * kLanes;
      store(d, load(d) + acc[t][b]);
    }
}

template <int CB>
void dw_taps(const float* x, const float* dy, float* dw, const int64_t* off, int64_t taps, const Sweep& s) {
  constexpr int R = kTile<CB>;
  int64_t t = 0;
  for (; t + R <= taps; t += R) dw_tile<R, CB>(x, dy, dw + t * CB * kLanes, off + t, s);
  with_size<R>(taps - t, [&](auto rest) {  // the last taps
    dw_tile<decltype(rest)::value, CB>(x, dy, dw + t * CB * kLanes, off + t, s);
  });
}

// A sweep's dy vectors, channels [0, CB*16) of each pixel (`stride` floats apart), into
// `packed` back to back, the lanes past the tail zero.
template <int CB>
void pack_dy(const float* dy, int64_t pixels, int64_t stride, float* packed, const Tail& tail) {
  for (int64_t p = 0; p < pixels; ++p, dy += stride, packed += CB * kLanes) {
    for (int b = 0; b < CB - 1; ++b) store(packed + b * kLanes, load(dy + b * kLanes));
    store(packed + (CB - 1) * kLanes, load_n(dy + (CB - 1) * kLanes, tail));
  }
}

struct Shapes {
  int64_t n, hp, wp, cin, groups, blocks, kh, kw, cig, vectors, cog, cout, ho, wo, sh, sw, dh, dw;

  // Offsets, in floats from a window's first cell, of each kernel position (i, j).
  std::vector<int64_t> positions() const {
    std::vector<int64_t> off(kh * kw);
    for (int64_t i = 0; i < kh; ++i)
      for (int64_t j = 0; j < kw; ++j) off[i * kw + j] = (i * dh * wp + j * dw) * cin;
    return off;
  }
};

// f(V, Partial, tail), V and Partial as compile-time constants, for the block of channels
// [c0, c0 + 16V) of a group, with the tail of its last vector.
template <class F>
void with_channels(const Shapes& s, int64_t c0, const F& f) {
  const Tail tail(static_cast<int>(std::min<int64_t>(kLanes, s.cog - c0 - (s.vectors - 1) * kLanes)));
  with_block<4>(s.vectors, [&](auto cb) { with_tail(tail, [&](auto partial) { f(cb, partial, tail); }); });
}

// The shapes of x (N, Hp, Wp, Cin), w or dw (G, B, kh, kw, Cin/G, 16V) and y or dy (N, Ho, Wo,
// G*Cog) with the window attributes, or why they do not fit together.
ffi::ErrorOr<Shapes> shapes(const char* op, ffi::Span<const int64_t> xd, ffi::Span<const int64_t> wd,
                            ffi::Span<const int64_t> yd, int64_t sh, int64_t sw, int64_t dh, int64_t dwl,
                            int64_t cog) {
  if (xd.size() != 4 || wd.size() != 6 || yd.size() != 4 || sh < 1 || sw < 1 || dh < 1 || dwl < 1)
    return ffi::Unexpected(invalid(std::string(op) + ": bad ranks or window"));
  Shapes s{xd[0], xd[1], xd[2], xd[3], wd[0], wd[1], wd[2], wd[3], wd[4], wd[5] / kLanes, cog, yd[3], yd[1], yd[2],
           sh, sw, dh, dwl};
  if (s.cig * s.groups != s.cin || wd[5] % kLanes != 0 || s.vectors < 1 || s.vectors > 4 || cog < 1 ||
      cog > s.blocks * wd[5] || cog <= s.blocks * wd[5] - kLanes || s.groups * cog != s.cout || yd[0] != s.n ||
      window_out(s.hp, s.kh, sh, dh) != s.ho || window_out(s.wp, s.kw, sw, dwl) != s.wo)
    return ffi::Unexpected(invalid(std::string(op) + ": shapes do not fit"));
  return s;
}

ffi::Error ConvFwd(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                   ffi::ResultBuffer<ffi::F32> y, int64_t sh, int64_t sw, int64_t dh, int64_t dwl, int64_t cog,
                   int64_t pad_top, int64_t pad_bottom, int64_t pad_left, int64_t pad_right) {
  auto xd = x.dimensions();
  if (xd.size() != 4 || pad_top < 0 || pad_bottom < 0 || pad_left < 0 || pad_right < 0)
    return invalid("flaxport_conv_fwd: bad ranks or padding");
  const int64_t padded[4] = {xd[0], xd[1] + pad_top + pad_bottom, xd[2] + pad_left + pad_right, xd[3]};
  auto checked = shapes("flaxport_conv_fwd", ffi::Span<const int64_t>(padded, 4), w.dimensions(), y->dimensions(),
                        sh, sw, dh, dwl, cog);
  if (checked.has_error()) return checked.error();
  const Shapes s = checked.value();
  const int64_t pixels = s.n * s.ho * s.wo, h = xd[1], width = xd[2];
  if (pixels == 0) return ffi::Error::Success();
  std::vector<int64_t> off(s.kh * s.kw), every(s.kh * s.kw);  // each position's offset in a window
  for (int64_t i = 0; i < s.kh; ++i)
    for (int64_t j = 0; j < s.kw; ++j) off[i * s.kw + j] = (i * s.dh * width + j * s.dw) * s.cin;
  for (int64_t p = 0; p < s.kh * s.kw; ++p) every[p] = p;
  const int64_t positions = s.kh * s.kw, block_weights = positions * s.cig * s.vectors * kLanes;
  const PixelMap map{x.typed_data(), y->typed_data(), s.ho, s.wo, h, width, h * width * s.cin, width * s.cin,
                     s.cin, s.sh, s.sw, pad_top, pad_left, s.kh, s.kw, s.dh, s.dw, s.cout};
  // Tasks: ~256 output pixels of one block of channels. With large weights a block's tasks
  // are consecutive, so they reuse its weights from L2 (a 512x512 3x3 conv's weights are
  // 9 MB); with weights that fit in L2 a pixel range's blocks are, so its input is read from
  // memory once (a 1x1 convolution from 64 to 256 channels, as blocks of 64, read it 4 times).
  constexpr int64_t kTaskPixels = 256, kSmallWeightBytes = 512 * 1024;
  const int64_t pixel_tasks = (pixels + kTaskPixels - 1) / kTaskPixels, all_blocks = s.groups * s.blocks;
  const bool pixels_first = all_blocks * block_weights * int64_t(sizeof(float)) <= kSmallWeightBytes;
  // An output of 4 MB or more (twice the L2 of this 2-core CPU) is streamed to memory: written
  // through the caches, each of its lines was first read from memory (a 1x1 convolution from
  // 64 to 256 channels at 56x56, batch 8, 26 MB of output: 4.2 -> 2.7 ms; torch 2.4).
  constexpr int64_t kStreamBytes = 4 << 20;
  float* const y0 = y->typed_data();
  const bool streaming = pixels * s.cout * int64_t(sizeof(float)) >= kStreamBytes && s.cog % kLanes == 0 &&
                         s.cout % kLanes == 0 && reinterpret_cast<uintptr_t>(y0) % 64 == 0;
  parallel_for(pool, all_blocks * pixel_tasks, [&](int64_t task) {
    const int64_t block = pixels_first ? task % all_blocks : task / pixel_tasks;
    const int64_t pixel_task = pixels_first ? task / all_blocks : task % pixel_tasks;
    const int64_t g = block / s.blocks, c0 = (block % s.blocks) * s.vectors * kLanes;
    const int64_t first = pixel_task * kTaskPixels, last = std::min(pixels, first + kTaskPixels);
    PixelMap block_map = map;
    block_map.x += g * s.cig;
    block_map.y += g * s.cog + c0;
    const float* wb = w.typed_data() + block * block_weights;
    with_channels(s, c0, [&](auto cb, auto partial, const Tail& tail) {
      fwd_pixels<decltype(cb)::value, decltype(partial)::value>(block_map, first, last, wb, off.data(),
                                                                every.data(), positions, s.cig, tail, streaming);
    });
    if (streaming) fence_streaming();
  });
  return ffi::Error::Success();
}

ffi::Error ConvDw(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy,
                  ffi::ResultBuffer<ffi::F32> dw, int64_t sh, int64_t sw, int64_t dh, int64_t dwl, int64_t cog,
                  int64_t layout, int64_t groups, int64_t vectors) {
  auto od = dw->dimensions();
  WeightLayout lw;
  if (od.size() != 4 || !WeightLayout::make(layout, od.begin(), &lw) || groups < 1 || vectors < 1 || vectors > 4 ||
      (cog + kLanes - 1) / kLanes % vectors != 0)
    return invalid("flaxport_conv_dw: bad weight layout or blocks");
  const int64_t blocks = (cog + kLanes - 1) / kLanes / vectors, width = vectors * kLanes;
  const int64_t packed_dims[6] = {groups, blocks, lw.kh, lw.kw, lw.in, width};
  auto checked = shapes("flaxport_conv_dw", x.dimensions(), ffi::Span<const int64_t>(packed_dims, 6),
                        dy.dimensions(), sh, sw, dh, dwl, cog);
  if (checked.has_error()) return checked.error();
  const Shapes s = checked.value();
  if (lw.out != s.groups * cog) return invalid("flaxport_conv_dw: shapes do not fit");
  const int64_t positions = s.kh * s.kw, taps = positions * s.cig, block_size = taps * width;
  const int64_t size = s.groups * s.blocks * block_size;
  float* out = dw->typed_data();
  if (s.n * s.ho * s.wo == 0) {  // an empty batch or image: the sum over no pixels
    std::memset(out, 0, lw.out * lw.in * lw.kh * lw.kw * sizeof(float));
    return ffi::Error::Success();
  }
  const std::vector<int64_t> pos = s.positions();
  std::vector<int64_t> off(taps);
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t c = 0; c < s.cig; ++c) off[p * s.cig + c] = pos[p] + c;
  const Chunks chunks(s.n, s.ho, s.wo);
  // One partial sum per pixel group, in the kernel's blocks.
  std::vector<float> partial(chunks.groups * size, 0.0f);
  // Tasks: a pixel group x a range of ~96 taps of one conv group, all its blocks of channels.
  // Each dw element is summed by one task, over its group's chunks in order.
  const int64_t tap_ranges = (taps + 95) / 96, tasks_per_part = s.groups * tap_ranges;
  const float* xs = x.typed_data();
  const float* gs = dy.typed_data();
  const int64_t x_image = s.hp * s.wp * s.cin, dy_image = s.ho * s.wo * s.cout, x_row = s.sh * s.wp * s.cin;
  parallel_for(pool, chunks.groups * tasks_per_part, [&](int64_t task) {
    const int64_t part = task / tasks_per_part, g = (task % tasks_per_part) / tap_ranges, r = task % tap_ranges;
    const int64_t t0 = taps * r / tap_ranges, t1 = taps * (r + 1) / tap_ranges;
    float* acc = partial.data() + part * size + g * s.blocks * block_size;
    thread_local std::vector<float> packed;
    chunks.for_group(part, s.n, s.ho, [&](int64_t img, int64_t images, int64_t h0, int64_t rows) {
      const float* xr = xs + img * x_image + h0 * x_row + g * s.cig;
      const float* gr = gs + img * dy_image + h0 * s.wo * s.cout + g * s.cog;
      for (int64_t b = 0; b < s.blocks; ++b) {
        const int64_t c0 = b * width;
        with_channels(s, c0, [&](auto cb, auto partial, const Tail& tail) {
          constexpr int V = decltype(cb)::value;
          Sweep sweep{images, rows, s.wo, x_image, x_row, s.sw * s.cin, dy_image, s.wo * s.cout, s.cout};
          const float* dyb = gr + c0;
          if constexpr (decltype(partial)::value) {
            const int64_t pixels = images * rows * s.wo;
            if (static_cast<int64_t>(packed.size()) < pixels * width) packed.resize(pixels * width);
            pack_dy<V>(dyb, pixels, s.cout, packed.data(), tail);
            sweep.dy_col = V * kLanes, sweep.dy_row = s.wo * sweep.dy_col, sweep.dy_image = rows * sweep.dy_row;
            dyb = packed.data();
          }
          dw_taps<V>(xr, dyb, acc + b * block_size + t0 * V * kLanes, off.data() + t0, t1 - t0, sweep);
        });
      }
    });
  });
  // The partials added in order, out of the blocks into the caller's layout, 16 output
  // channels at a time in the order of torch's rows (channel, then kernel position): each
  // of the 16 rows is written front to back. Walking the blocks' order instead wrote OIHW
  // with a stride of a whole row (Cin*kh*kw floats): a TLB miss per element, 5x the sums'
  // own time for ResNet's 512-channel convolutions on a 2x2 map.
  parallel_for(pool, s.groups * s.blocks, [&](int64_t gb) {
    const int64_t g = gb / s.blocks, q0 = (gb % s.blocks) * width, outs = std::min(width, cog - q0);
    const float* in = partial.data() + gb * block_size;
    for (int64_t l0 = 0; l0 < outs; l0 += kLanes) {
      const int64_t lanes = std::min<int64_t>(kLanes, outs - l0);
      for (int64_t c = 0; c < s.cig; ++c)
        for (int64_t p = 0; p < positions; ++p) {
          const float* src = in + (p * s.cig + c) * width + l0;
          const int64_t r = p / s.kw, col = p % s.kw;
          for (int64_t l = 0; l < lanes; ++l) {
            float sum = src[l];
            for (int64_t part = 1; part < chunks.groups; ++part) sum += src[part * size + l];
            out[lw.at(g * cog + q0 + l0 + l, c, r, col)] = sum;
          }
        }
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace flaxport

#define FLAXPORT_CONV_ATTRS                 \
  .Attr<int64_t>("stride_h")                \
      .Attr<int64_t>("stride_w")            \
      .Attr<int64_t>("dilation_h")          \
      .Attr<int64_t>("dilation_w")          \
      .Attr<int64_t>("group_out_channels")

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlaxportConvFwd, flaxport::ConvFwd,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>() FLAXPORT_CONV_ATTRS
                                  .Attr<int64_t>("pad_top")
                                  .Attr<int64_t>("pad_bottom")
                                  .Attr<int64_t>("pad_left")
                                  .Attr<int64_t>("pad_right"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlaxportConvDw, flaxport::ConvDw,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::F32>>()
                                  .Ret<xla::ffi::Buffer<xla::ffi::F32>>() FLAXPORT_CONV_ATTRS
                                  .Attr<int64_t>("layout")
                                  .Attr<int64_t>("groups")
                                  .Attr<int64_t>("block_vectors"));
