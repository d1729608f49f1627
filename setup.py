"""The compiled parts, in C: the HTML visible-text walk (streamdedup/fingerprinting/_html_walk.c), the
word hashes (streamdedup/fingerprinting/_words.c) and the plain page record's reader
(streamdedup/engine/_records.c).

Optional: where no C compiler is found the build goes on without them, text.py walks in Python and
the numba kernel hashes the words, records are read by orjson and json, with the same results
(tests/test_html_walk.py, tests/test_kernels.py and tests/test_records.py hold them to the same text,
the same bits and the same pages).
"""

import sys

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamdedup.fingerprinting._html_walk",
            ["streamdedup/fingerprinting/_html_walk.c"],
            libraries=["dl"] if sys.platform.startswith("linux") else [],
            extra_compile_args=["-O2"] if sys.platform != "win32" else [],
            optional=True,
        ),
        Extension(
            "streamdedup.fingerprinting._words",
            ["streamdedup/fingerprinting/_words.c"],
            extra_compile_args=["-O2"] if sys.platform != "win32" else [],
            optional=True,
        ),
        Extension(
            "streamdedup.engine._records",
            ["streamdedup/engine/_records.c"],
            extra_compile_args=["-O2"] if sys.platform != "win32" else [],
            optional=True,
        ),
    ]
)
