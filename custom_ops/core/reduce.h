// Element-wise arithmetic on raw buffers: the server sums pushes with it and the
// worker averages pulled partitions with it. Vectorised per CPU at load time.
#ifndef TF_BPS_CORE_REDUCE_H_
#define TF_BPS_CORE_REDUCE_H_

#include <cstddef>

#include "common.h"

namespace bps {

// dst[i] += src[i] for `count` elements of `dtype`.
void SumInto(DataType dtype, void* dst, const void* src, size_t count);

// dst[i] = a[i] + b[i]: summing two shared-memory inputs reads each once.
void SumOf(DataType dtype, void* dst, const void* a, const void* b, size_t count);

// buf[i] /= divisor; floats multiply by the reciprocal, integer types use floor
// division as numpy and TensorFlow do.
void DivideInPlace(DataType dtype, void* buf, size_t count, int divisor);

}  // namespace bps

#endif  // TF_BPS_CORE_REDUCE_H_
