// The process-wide entry points of the core: the C API that Python reaches through
// ctypes (c_api.h) and this C++ entry point for framework adapters.
#ifndef TF_BPS_CORE_OPERATIONS_H_
#define TF_BPS_CORE_OPERATIONS_H_

#include <string>

#include "common.h"

namespace bps {

// Sums (or averages) `view.input` across all workers into `view.output`; `done` runs
// once, on some core thread (or inline on an immediate error or the local path).
void EnqueuePushPull(const TensorView& view, const std::string& name, ReduceOp op,
                     DoneCallback done);

}  // namespace bps

#endif  // TF_BPS_CORE_OPERATIONS_H_
