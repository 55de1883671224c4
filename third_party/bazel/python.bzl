"""@local_python: the headers of the Python that PYTHON_BIN_PATH names (default:
python3) and of the pybind11 installed for it, for the binding (_bps_worker). Nothing
is downloaded."""

_QUERY = """
import sysconfig, pybind11
print(sysconfig.get_paths()["include"])
print(pybind11.get_include())
"""

def _local_python_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    found = ctx.execute([python, "-c", _QUERY], quiet = True)
    if found.return_code != 0:
        fail("@local_python: '%s' cannot import pybind11 (set PYTHON_BIN_PATH to an " %
             python + "interpreter that can):\n" + found.stderr)
    python_include, pybind11_include = found.stdout.strip().split("\n")
    ctx.symlink(python_include, "python_include")
    ctx.symlink(pybind11_include, "pybind11_include")
    ctx.file("BUILD", """
cc_library(
    name = "headers",
    hdrs = glob(["python_include/**/*.h", "pybind11_include/**/*.h"]),
    includes = ["python_include", "pybind11_include"],
    visibility = ["//visibility:public"],
)
""")

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
