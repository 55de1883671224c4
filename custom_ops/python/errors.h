// The exception the binding raises: a RuntimeError subclass whose `kind` attribute
// names the core's error kind (bps_error_kind_name: "mismatch", "peer gone", ...), so
// Python code can tell failures apart without parsing messages.
#ifndef TF_BPS_PYTHON_ERRORS_H_
#define TF_BPS_PYTHON_ERRORS_H_

#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "../worker/c_api.h"

namespace bps {

class CoreError : public std::runtime_error {
 public:
  CoreError(int kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  int kind() const { return kind_; }  // bps_error_kind

 private:
  int kind_;
};

// Adds `CoreError` to `module` and translates the C++ exception into it.
inline void RegisterCoreError(pybind11::module_& module) {
  // Created once per module and never freed: the interpreter owns it from here.
  static PyObject* type =
      PyErr_NewException((std::string(PyModule_GetName(module.ptr())) + ".CoreError").c_str(),
                         PyExc_RuntimeError, nullptr);
  module.add_object("CoreError", pybind11::handle(type));
  pybind11::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const CoreError& error) {
      pybind11::object instance =
          pybind11::reinterpret_borrow<pybind11::object>(type)(error.what());
      instance.attr("kind") = bps_error_kind_name(error.kind());
      PyErr_SetObject(type, instance.ptr());
    }
  });
}

}  // namespace bps

#endif  // TF_BPS_PYTHON_ERRORS_H_
