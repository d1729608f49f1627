"""The one compiled part: the HTML visible-text walk in C (streamdedup/fingerprinting/_html_walk.c).

Optional: where no C compiler is found the build goes on without it, and text.py walks in Python
with the same result (tests/test_html_walk.py holds the two to the same text).
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
        )
    ]
)
