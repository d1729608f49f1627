"""The compiled parts, in C: the HTML visible-text walk (streamdedup/fingerprinting/_html_walk.c) and the
word hashes (streamdedup/fingerprinting/_words.c).

Optional: where no C compiler is found the build goes on without them, text.py walks in Python and
the numba kernel hashes the words, with the same results (tests/test_html_walk.py and
tests/test_kernels.py hold them to the same text and the same bits).
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
    ]
)
