"""The compiled PlainBuffer reader and record layout (native/); everything else is in pyproject.toml.

``optional=True``: without a C compiler and the Python headers the install still succeeds and the
pure-Python reader is used (``cdc.backends.tablestore.plainbuffer.COMPILED`` says which one runs).
``make native`` rebuilds it in place after an edit (native/build.py).
"""

from setuptools import Extension, setup

PLAINBUFFER = Extension(
    "cdc.backends.tablestore._plainbuffer",
    ["native/plainbuffer.c", "native/layout.c"],
    depends=["native/plainbuffer.h"],
    extra_compile_args=["-O2", "-std=c99", "-Wall"],
    optional=True,
)

if __name__ == "__main__":
    setup(ext_modules=[PLAINBUFFER])
