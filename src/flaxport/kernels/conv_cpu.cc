// Direct (implicit-GEMM) NHWC convolution for XLA:CPU, called through the XLA FFI.
//
// Why: XLA:CPU in jaxlib 0.10 lowers a convolution to YNNPACK or to Eigen, both slower
// here than oneDNN's direct convolution in PyTorch; the pure-JAX im2col form spends
// more time writing and reading the patch matrix than multiplying it (README, "CNN
// speed"). These kernels never materialise patches: each output tile keeps its sums in
// vector registers while the 3x3 (any k x k) window streams past.
//
// Two operations, both "valid" (the caller pads) and stride 1, float32:
//   flaxport_conv_fwd: x (N, Hp, Wp, Cin), w (k, k, Cin, Cout) -> y (N, Hp-k+1, Wp-k+1, Cout)
//   flaxport_conv_dw:  x (N, Hp, Wp, Cin), dy (N, Ho, Wo, Cout) -> dw (k, k, Cin, Cout)
// The input gradient is flaxport_conv_fwd of the padded dy with the flipped, transposed
// kernel (done in JAX). Cout must be a multiple of 16 (the caller falls back otherwise).
//
// Vectors are GCC vector extensions, so one source compiles to AVX-512, AVX2 or NEON
// with -march=native. Work is split over XLA's intra-op thread pool.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kLanes = 16;
typedef float vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float vec_u __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));

inline vec load(const float* p) { return *reinterpret_cast<const vec_u*>(p); }

// One float to every lane, straight from memory: `vec{} + *p` makes GCC load a scalar and
// broadcast register to register, a shuffle on the FMA ports (Zen 4); the memory form
// runs on the load ports. With it and 12-wide tiles, the weight gradient of 32-channel
// convs went from ~150 to ~200 GFLOP/s (README, "The DDIM").
inline vec broadcast(const float* p) {
#ifdef __AVX512F__
  return reinterpret_cast<vec>(_mm512_set1_ps(*p));
#else
  return vec{} + *p;
#endif
}
inline void store(float* p, vec v) { *reinterpret_cast<vec_u*>(p) = v; }

// Run body(i) for i in [0, n) on the caller and the pool's threads. Late pool tasks find
// nothing left and return without touching `body`; the caller waits only for items that
// were claimed, so a busy or one-thread pool cannot deadlock.
template <class Body>
void parallel_for(ffi::ThreadPool& pool, int64_t n, const Body& body) {
  const int64_t threads = std::min<int64_t>(std::max<int64_t>(pool.num_threads(), 1), n);
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto state = std::make_shared<State>();
  auto work = [state, n, &body]() {
    for (int64_t i; (i = state->next.fetch_add(1)) < n;) {
      body(i);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < threads; ++t) pool.Schedule([state, work]() { work(); });
  work();
  while (state->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

// Offsets, in floats from a pixel's first channel, of the K = k*k*Cin window taps.
std::vector<int64_t> tap_offsets(int64_t k, int64_t wp, int64_t cin) {
  std::vector<int64_t> off(k * k * cin);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t c = 0; c < cin; ++c) off[(i * k + j) * cin + c] = (i * wp + j) * cin + c;
  return off;
}

// f(std::integral_constant<int, N>{}) for the runtime n, 1 <= n < Max: register tiles
// need their sizes at compile time, row tails and channel blocks know them at run time.
template <int Max, int N = 1, class F>
void with_size(int64_t n, const F& f) {
  if constexpr (N < Max) {
    if (n == N) f(std::integral_constant<int, N>{});
    else with_size<Max, N + 1>(n, f);
  }
}

// y[r, 0:CB*16] = sum_t x[r*cin + off[t]] * w[t, 0:CB*16] for RW consecutive pixels r.
// The taps come in k*k runs of cin consecutive offsets (one per kernel position), so
// the inner loop walks a run with a pointer instead of reading off[t] per tap.
template <int RW, int CB>
void fwd_tile(const float* x, const float* w, float* y, const int64_t* off, int64_t taps,
              int64_t cin, int64_t cout) {
  vec acc[RW][CB] = {};
  for (int64_t t0 = 0; t0 < taps; t0 += cin) {
    const float* xt = x + off[t0];
    const float* wt = w + t0 * cout;
    for (int64_t c = 0; c < cin; ++c, ++xt, wt += cout) {
      vec wv[CB];
      for (int b = 0; b < CB; ++b) wv[b] = load(wt + b * kLanes);
      for (int r = 0; r < RW; ++r) {
        vec xv = broadcast(xt + r * cin);
        for (int b = 0; b < CB; ++b) acc[r][b] += xv * wv[b];
      }
    }
  }
  for (int r = 0; r < RW; ++r)
    for (int b = 0; b < CB; ++b) store(y + r * cout + b * kLanes, acc[r][b]);
}

// Register tile: RW pixels (or taps) x CB vectors of accumulators, plus CB weights and a
// broadcast, within 32 vector registers.
template <int CB>
constexpr int kRowTile = CB == 1 ? 14 : CB == 2 ? 12 : CB == 3 ? 8 : 6;

template <int CB>
void fwd_row(const float* x, const float* w, float* y, const int64_t* off, int64_t taps,
             int64_t cin, int64_t cout, int64_t wo) {
  constexpr int RW = kRowTile<CB>;
  int64_t c = 0;
  for (; c + RW <= wo; c += RW) fwd_tile<RW, CB>(x + c * cin, w, y + c * cout, off, taps, cin, cout);
  with_size<RW>(wo - c, [&](auto tail) {  // the row's last pixels
    fwd_tile<decltype(tail)::value, CB>(x + c * cin, w, y + c * cout, off, taps, cin, cout);
  });
}

// dw[t, 0:CB*16] += sum over pixels p of x[p*cin + off[t]] * dy[p, 0:CB*16], for RT taps t,
// over `rows` output rows of each of `images` consecutive images.
template <int RT, int CB>
void dw_tile(const float* x, const float* dy, float* dw, const int64_t* off, int64_t images, int64_t rows,
             int64_t x_image, int64_t dy_image, int64_t wo, int64_t wp, int64_t cin, int64_t cout) {
  vec acc[RT][CB] = {};
  for (int64_t m = 0; m < images; ++m)
    for (int64_t h = 0; h < rows; ++h) {
      const float* xr = x + m * x_image + h * wp * cin;
      const float* dyr = dy + m * dy_image + h * wo * cout;
      for (int64_t c = 0; c < wo; ++c) {
        vec g[CB];
        for (int b = 0; b < CB; ++b) g[b] = load(dyr + c * cout + b * kLanes);
        const float* xp = xr + c * cin;
        for (int t = 0; t < RT; ++t) {
          vec xv = broadcast(xp + off[t]);
          for (int b = 0; b < CB; ++b) acc[t][b] += xv * g[b];
        }
      }
    }
  for (int t = 0; t < RT; ++t)
    for (int b = 0; b < CB; ++b) {
      float* d = dw + t * cout + b * kLanes;
      store(d, load(d) + acc[t][b]);
    }
}

template <int CB>
void dw_rows(const float* x, const float* dy, float* dw, const int64_t* off, int64_t taps, int64_t images,
             int64_t rows, int64_t x_image, int64_t dy_image, int64_t wo, int64_t wp, int64_t cin, int64_t cout) {
  constexpr int RT = kRowTile<CB>;
  int64_t t = 0;
  for (; t + RT <= taps; t += RT)
    dw_tile<RT, CB>(x, dy, dw + t * cout, off + t, images, rows, x_image, dy_image, wo, wp, cin, cout);
  with_size<RT>(taps - t, [&](auto tail) {  // the last taps
    dw_tile<decltype(tail)::value, CB>(x, dy, dw + t * cout, off + t, images, rows, x_image, dy_image, wo, wp,
                                       cin, cout);
  });
}

// f(c0, std::integral_constant<int, CB>{}) for output channels in groups of CB <= 4
// vectors (64 channels, the widest register tile), as even as possible: 96 channels run
// as 3 + 3 vectors, not 4 + 2.
template <class F>
void for_channel_blocks(int64_t cout, const F& f) {
  const int64_t vectors = cout / kLanes, groups = (vectors + 3) / 4;
  for (int64_t g = 0, c0 = 0; g < groups; ++g) {
    const int64_t blocks = vectors * (g + 1) / groups - vectors * g / groups;
    with_size<5>(blocks, [&](auto cb) { f(c0, cb); });
    c0 += blocks * kLanes;
  }
}

ffi::Error check_shapes(int64_t cout, const char* what) {
  if (cout % kLanes != 0)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      std::string(what) + ": output channels must be a multiple of 16");
  return ffi::Error::Success();
}

ffi::Error ConvFwd(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                   ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 4 || wd.size() != 4 || wd[0] != wd[1] || wd[2] != xd[3])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "flaxport_conv_fwd: bad shapes");
  const int64_t n = xd[0], hp = xd[1], wp = xd[2], cin = xd[3], k = wd[0], cout = wd[3];
  if (auto e = check_shapes(cout, "flaxport_conv_fwd"); e.failure()) return e;
  const int64_t ho = hp - k + 1, wo = wp - k + 1, taps = k * k * cin;
  const std::vector<int64_t> off = tap_offsets(k, wp, cin);
  const float* xs = x.typed_data();
  const float* ws = w.typed_data();
  float* ys = y->typed_data();
  parallel_for(pool, n * ho, [&](int64_t row) {
    const int64_t img = row / ho, h = row % ho;
    const float* xr = xs + (img * hp + h) * wp * cin;
    float* yr = ys + row * wo * cout;
    for_channel_blocks(cout, [&](int64_t c0, auto cb) {
      fwd_row<decltype(cb)::value>(xr, ws + c0, yr + c0, off.data(), taps, cin, cout, wo);
    });
  });
  return ffi::Error::Success();
}

ffi::Error ConvDw(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy,
                  ffi::ResultBuffer<ffi::F32> dw) {
  auto xd = x.dimensions(), gd = dy.dimensions(), wd = dw->dimensions();
  if (xd.size() != 4 || gd.size() != 4 || wd.size() != 4 || xd[0] != gd[0] || wd[2] != xd[3] ||
      wd[3] != gd[3] || xd[1] - wd[0] + 1 != gd[1] || xd[2] - wd[1] + 1 != gd[2])
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "flaxport_conv_dw: bad shapes");
  const int64_t n = xd[0], hp = xd[1], wp = xd[2], cin = xd[3], k = wd[0], cout = wd[3];
  if (auto e = check_shapes(cout, "flaxport_conv_dw"); e.failure()) return e;
  const int64_t ho = gd[1], wo = gd[2], taps = k * k * cin, size = taps * cout;
  if (n * ho * wo == 0) {  // an empty batch or image: the sum over no pixels
    std::memset(dw->typed_data(), 0, size * sizeof(float));
    return ffi::Error::Success();
  }
  const std::vector<int64_t> off = tap_offsets(k, wp, cin);
  // Chunks of at most 1024 output pixels (a few rows of one image, or a few whole small
  // images): the x and dy they touch stay in L1/L2 while every tap and channel block
  // sweeps them. The chunks form kGroups fixed groups; a group's chunks are summed in
  // order into the group's own copy of dw and the copies are added in order, so the
  // result is the same bits whatever the thread count or the scheduling (bit-exact
  // resume and step/scan equality depend on it).
  constexpr int64_t kGroups = 8;
  const int64_t target = std::max<int64_t>(1, std::min<int64_t>(1024, n * ho * wo / kGroups));
  const int64_t rows_per_chunk = std::max<int64_t>(1, std::min<int64_t>(ho, target / std::max<int64_t>(wo, 1)));
  const int64_t images_per_chunk = rows_per_chunk == ho ? std::max<int64_t>(1, target / (ho * wo)) : 1;
  const int64_t row_chunks = (ho + rows_per_chunk - 1) / rows_per_chunk;
  const int64_t chunks = ((n + images_per_chunk - 1) / images_per_chunk) * row_chunks;
  const int64_t groups = std::min(kGroups, chunks);
  std::vector<float> partial(groups * size, 0.0f);
  const float* xs = x.typed_data();
  const float* gs = dy.typed_data();
  const int64_t x_image = hp * wp * cin, dy_image = ho * wo * cout;
  parallel_for(pool, groups, [&](int64_t group) {
    float* acc = partial.data() + group * size;
    for (int64_t chunk = chunks * group / groups; chunk < chunks * (group + 1) / groups; ++chunk) {
      const int64_t img = (chunk / row_chunks) * images_per_chunk, h0 = (chunk % row_chunks) * rows_per_chunk;
      const int64_t images = std::min(images_per_chunk, n - img), rows = std::min(rows_per_chunk, ho - h0);
      const float* xr = xs + img * x_image + h0 * wp * cin;
      const float* gr = gs + img * dy_image + h0 * wo * cout;
      for_channel_blocks(cout, [&](int64_t c0, auto cb) {
        dw_rows<decltype(cb)::value>(xr, gr + c0, acc + c0, off.data(), taps, images, rows, x_image, dy_image,
                                     wo, wp, cin, cout);
      });
    }
  });
  float* out = dw->typed_data();
  std::memcpy(out, partial.data(), size * sizeof(float));
  for (int64_t g = 1; g < groups; ++g)
    for (int64_t i = 0; i < size; ++i) out[i] += partial[g * size + i];
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlaxportConvFwd, ConvFwd,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(FlaxportConvDw, ConvDw,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
