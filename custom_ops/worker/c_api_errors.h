// How the C API's functions report failure: the Status of the last failed call on
// this thread, which bps_last_error and bps_last_error_kind read.
#ifndef TF_BPS_WORKER_C_API_ERRORS_H_
#define TF_BPS_WORKER_C_API_ERRORS_H_

#include <string>

#include "../common/common.h"

namespace bps {

inline Status& LastCallError() {
  thread_local Status error = Status::OK();
  return error;
}

// Records `status` as this thread's last error; returns the C API's -1.
inline int Fail(const Status& status) {
  LastCallError() = status;
  return -1;
}

inline int Fail(const std::string& message) {
  return Fail(Status::Error(ErrorKind::kInvalidArgument, message));
}

}  // namespace bps

#endif  // TF_BPS_WORKER_C_API_ERRORS_H_
