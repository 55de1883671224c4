// Element-wise arithmetic on raw buffers: servers reduce pushes with it and workers
// scale results with it. Vectorised per CPU at load time.
#ifndef TF_BPS_COMMON_REDUCE_H_
#define TF_BPS_COMMON_REDUCE_H_

#include <cstddef>
#include <string>
#include <vector>

#include "common.h"

namespace bps {

// Whether `op` can combine elements of `dtype` (bool has no arithmetic).
bool CanReduce(DataType dtype);

// dst[i] = op(dst[i], src[i]) for `count` elements; Average combines as a sum.
void ReduceInto(ReduceOp op, DataType dtype, void* dst, const void* src, size_t count);

// dst[i] = op(a[i], b[i]): combining two shared-memory inputs reads each once.
void ReduceOf(ReduceOp op, DataType dtype, void* dst, const void* a, const void* b, size_t count);

// dst[i] = op over inputs[*][i] (one input: a copy), reading each input once; `dst`
// is none of them. A server's shared-memory pushes and a host's merge end here.
void ReduceAll(ReduceOp op, DataType dtype, void* dst, const std::vector<const char*>& inputs,
               size_t count);

// buf[i] /= divisor; floats multiply by the reciprocal, integer types use floor
// division as numpy and TensorFlow do.
void DivideInPlace(DataType dtype, void* buf, size_t count, int divisor);

// buf[i] *= factor (prescale / postscale); integers round toward zero, as a cast does.
void ScaleInPlace(DataType dtype, void* buf, size_t count, double factor);

// Whether every element is finite (no NaN, no Inf); integer types always are.
bool AllFinite(DataType dtype, const void* data, size_t count);

// "first [1, 2, 3, ...] sum 6 of 3 elements": what BYTEPS_DEBUG_SAMPLE_TENSOR logs.
std::string SampleText(DataType dtype, const void* data, size_t count);

}  // namespace bps

#endif  // TF_BPS_COMMON_REDUCE_H_
