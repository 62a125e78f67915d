// What the CPU kernels share: 16-float vectors, masked tails, a pool loop, compile-time sizes.
//
// Vectors are GCC vector extensions, so one source compiles to AVX-512, AVX2 or NEON with
// -march=native. A channel count that is not a multiple of 16 ends in a partial vector: it
// is read and written through masks (AVX-512) or lane by lane, never past the buffer.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace flaxport {

namespace ffi = xla::ffi;

constexpr int kLanes = 16;
typedef float vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float vec_u __attribute__((vector_size(kLanes * sizeof(float)), aligned(4)));

inline vec load(const float* p) { return *reinterpret_cast<const vec_u*>(p); }
inline void store(float* p, vec v) { *reinterpret_cast<vec_u*>(p) = v; }

// The channels of a partial last vector (1 <= lanes <= 16), as a mask where AVX-512 has them.
struct Tail {
  int lanes;
#ifdef __AVX512F__
  __mmask16 mask;
  explicit Tail(int n) : lanes(n), mask(static_cast<__mmask16>((1u << n) - 1)) {}
#else
  explicit Tail(int n) : lanes(n) {}
#endif
};

// The tail's lanes of p, zeros in the rest.
inline vec load_n(const float* p, const Tail& t) {
#ifdef __AVX512F__
  return reinterpret_cast<vec>(_mm512_maskz_loadu_ps(t.mask, p));
#else
  vec v = {};
  for (int i = 0; i < t.lanes; ++i) v[i] = p[i];
  return v;
#endif
}

// Writes the tail's lanes of v to p.
inline void store_n(float* p, vec v, const Tail& t) {
#ifdef __AVX512F__
  _mm512_mask_storeu_ps(p, t.mask, reinterpret_cast<__m512>(v));
#else
  for (int i = 0; i < t.lanes; ++i) p[i] = v[i];
#endif
}

// v to p, 64-byte aligned, past the caches (a non-temporal store): an output larger than the
// caches is then written without first being read from memory. Elsewhere a plain store.
inline void store_streaming(float* p, vec v) {
#ifdef __AVX512F__
  _mm512_stream_ps(p, reinterpret_cast<__m512>(v));
#else
  store(p, v);
#endif
}

// Makes a task's non-temporal stores visible before it is counted done.
inline void fence_streaming() {
#ifdef __AVX512F__
  _mm_sfence();
#endif
}

// A last vector that is whole (Partial false: plain loads and stores, no mask in the inner
// loops) or a tail: kernels are instantiated for both and pick per channel block.
template <bool Partial>
inline vec load_last(const float* p, const Tail& t) {
  if constexpr (Partial) return load_n(p, t);
  else return load(p);
}

template <bool Partial>
inline void store_last(float* p, vec v, const Tail& t) {
  if constexpr (Partial) store_n(p, v, t);
  else store(p, v);
}

template <class F>
void with_tail(const Tail& t, const F& f) {
  if (t.lanes == kLanes) f(std::false_type{});
  else f(std::true_type{});
}

// One float to every lane, straight from memory: `vec{} + *p` makes GCC load a scalar and
// broadcast register to register, a shuffle on the FMA ports (Zen 4); the memory form
// runs on the load ports. With it and 12-wide tiles, the weight gradient of 32-channel
// convs went from ~150 to ~200 GFLOP/s (docs/cpu.md, "The DDIM").
inline vec broadcast(const float* p) {
#ifdef __AVX512F__
  return reinterpret_cast<vec>(_mm512_set1_ps(*p));
#else
  return vec{} + *p;
#endif
}

// p[0], p[stride], ..., p[(lanes - 1) * stride], zeros in the other lanes.
inline vec gather(const float* p, int64_t stride, int lanes) {
#ifdef __AVX512F__
  if (lanes == kLanes && stride * kLanes < (int64_t(1) << 31)) {
    const __m512i index = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(static_cast<int>(stride)));
    return reinterpret_cast<vec>(_mm512_i32gather_ps(index, p, 4));
  }
#endif
  vec v = {};
  for (int i = 0; i < lanes; ++i) v[i] = p[i * stride];
  return v;
}

// m[r][c] <- m[c][r] for a 16 x 16 tile, in 4 rounds: each swaps the off-diagonal blocks of
// every 2b x 2b block (b = 8, 4, 2, 1), two rows at a time with one two-vector shuffle a row.
template <int B>
inline void transpose_round(vec (&m)[kLanes]) {
  typedef int ivec __attribute__((vector_size(kLanes * sizeof(int))));
  const ivec low = [] {
    ivec v{};
    for (int c = 0; c < kLanes; ++c) v[c] = (c & B) ? kLanes + c - B : c;
    return v;
  }();
  const ivec high = [] {
    ivec v{};
    for (int c = 0; c < kLanes; ++c) v[c] = (c & B) ? kLanes + c : c + B;
    return v;
  }();
#pragma GCC unroll 16
  for (int i = 0; i < kLanes; ++i) {
    if (i & B) continue;
    const vec a = m[i], z = m[i + B];
    m[i] = __builtin_shuffle(a, z, low);
    m[i + B] = __builtin_shuffle(a, z, high);
  }
}

inline void transpose(vec (&m)[kLanes]) {
  transpose_round<8>(m);
  transpose_round<4>(m);
  transpose_round<2>(m);
  transpose_round<1>(m);
}

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

// f(std::integral_constant<int, N>{}) for the runtime n, 1 <= n < Max: register tiles
// need their sizes at compile time, row tails and channel blocks know them at run time.
template <int Max, int N = 1, class F>
void with_size(int64_t n, const F& f) {
  if constexpr (N < Max) {
    if (n == N) f(std::integral_constant<int, N>{});
    else with_size<Max, N + 1>(n, f);
  }
}

// How a reduction over the n*rows*cols output pixels is cut for the weight gradients: into
// `groups` fixed groups of consecutive chunks, each chunk a few rows of one image or a few
// whole small images (at most ~1024 pixels, so the x and dy they touch stay in L1/L2 while
// every tap and channel block sweeps them). Each group sums its chunks in order into its
// own partial result and the partials are added in order, so the result is the same bits
// whatever the thread count or the scheduling (bit-exact resume and step/scan equality
// depend on it). Small reductions get fewer groups: each group's partial is as large as
// the weights, and a 512x512 3x3 conv on 2x2 images has far more weights than pixels.
struct Chunks {
  static constexpr int64_t kChunkPixels = 256;
  int64_t rows_per_chunk, images_per_chunk, row_chunks, count, groups;

  Chunks(int64_t n, int64_t rows, int64_t cols) {
    const int64_t pixels = n * rows * cols;
    groups = std::max<int64_t>(1, std::min<int64_t>(8, pixels / 1024));
    const int64_t target = std::max<int64_t>(1, std::min<int64_t>(kChunkPixels, pixels / groups));
    rows_per_chunk = std::max<int64_t>(1, std::min<int64_t>(rows, target / std::max<int64_t>(cols, 1)));
    images_per_chunk = rows_per_chunk == rows ? std::max<int64_t>(1, target / (rows * cols)) : 1;
    row_chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    count = ((n + images_per_chunk - 1) / images_per_chunk) * row_chunks;
    groups = std::min(groups, count);
  }

  // chunk(first image, images, first row, rows) for every chunk of group g, in order.
  template <class F>
  void for_group(int64_t g, int64_t n, int64_t rows, const F& chunk) const {
    for (int64_t c = count * g / groups; c < count * (g + 1) / groups; ++c) {
      const int64_t img = (c / row_chunks) * images_per_chunk, h0 = (c % row_chunks) * rows_per_chunk;
      chunk(img, std::min(images_per_chunk, n - img), h0, std::min(rows_per_chunk, rows - h0));
    }
  }
};

// A run of output channels: conv group g, channels [c0, c0 + cb*16) of it.
struct ChannelBlock {
  int64_t group, c0;
  int cb;
};

// The channel blocks of `groups` groups of `vectors` vectors each, at most Widest vectors a
// block, as even as possible: 6 vectors run as 3 + 3 (Widest 4), not 4 + 2.
template <int Widest>
std::vector<ChannelBlock> channel_blocks(int64_t groups, int64_t vectors) {
  std::vector<ChannelBlock> out;
  const int64_t runs = (vectors + Widest - 1) / Widest;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0, c0 = 0; r < runs; ++r) {
      const int64_t blocks = vectors * (r + 1) / runs - vectors * r / runs;
      out.push_back({g, c0, static_cast<int>(blocks)});
      c0 += blocks * kLanes;
    }
  return out;
}

// f(std::integral_constant<int, CB>{}) for a block's runtime cb (1 <= cb <= Widest).
template <int Widest, class F>
void with_block(int cb, const F& f) {
  with_size<Widest + 1>(cb, f);
}

// out[0:size] = sum over groups g of partial[g*size : (g+1)*size], in order of g.
inline void sum_partials(const std::vector<float>& partial, int64_t groups, int64_t size, float* out) {
  std::memcpy(out, partial.data(), size * sizeof(float));
  for (int64_t g = 1; g < groups; ++g)
    for (int64_t i = 0; i < size; ++i) out[i] += partial[g * size + i];
}

inline ffi::Error invalid(const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, what);
}

// The output size of a valid (unpadded) window: (size - dilation*(k-1) - 1) / stride + 1.
inline int64_t window_out(int64_t size, int64_t k, int64_t stride, int64_t dilation) {
  const int64_t span = dilation * (k - 1) + 1;
  return size < span ? 0 : (size - span) / stride + 1;
}

}  // namespace flaxport
