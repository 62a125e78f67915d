// Where a convolution's weight element (o, i, r, c) lives in the caller's layout: torch's
// OIHW (translated files) or HWIO (the workloads' Flax layers). The kernels read weights in
// blocks of output channels (conv_cpu.cc); packing from and unpacking to these layouts is
// done here in C++, where XLA's general transposes of them cost a third of a small-image
// ResNet forward.
#pragma once

#include <cstdint>

namespace flaxport {

enum : int64_t { kOIHW = 0, kHWIO = 1 };

struct WeightLayout {
  int64_t out, in, kh, kw;  // sizes: out channels (all groups), in channels of a group, kernel
  int64_t so, si, sr, sc;   // strides of o, i, r, c in floats

  // dims: the buffer's dimensions in `layout`.
  static bool make(int64_t layout, const int64_t* dims, WeightLayout* w) {
    if (layout == kOIHW) {
      *w = {dims[0], dims[1], dims[2], dims[3], dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
      return true;
    }
    if (layout == kHWIO) {
      *w = {dims[3], dims[2], dims[0], dims[1], 1, dims[3], dims[1] * dims[2] * dims[3], dims[2] * dims[3]};
      return true;
    }
    return false;
  }
  int64_t at(int64_t o, int64_t i, int64_t r, int64_t c) const { return o * so + i * si + r * sr + c * sc; }
};

}  // namespace flaxport
