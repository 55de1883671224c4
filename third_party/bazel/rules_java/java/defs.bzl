"""An offline stand-in for @rules_java (WORKSPACE says why): Bazel 4.2.3 parses its
registered Java toolchains, whose files load these names, even for a C++-only build."""

def java_binary(**kwargs):
    native.java_binary(**kwargs)

def java_import(**kwargs):
    native.java_import(**kwargs)

def java_library(**kwargs):
    native.java_library(**kwargs)

def java_runtime(**kwargs):
    native.java_runtime(**kwargs)

def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)
