"""The one build step pyproject.toml cannot state stably: calibration's C counting loops.

qconvert/calibrate/counting.py says why they exist. The extension is optional: without a C compiler the
install succeeds and the numpy loops, which give the same counts, run instead. (setuptools' own
`[tool.setuptools.ext-modules]` table is still experimental, hence this file.)
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "qconvert.calibrate._counting",
            sources=["qconvert/calibrate/_counting.c"],
            optional=True,
            extra_compile_args=["-O3", "-fno-trapping-math"],  # the latter lets gcc vectorise the clamps
        )
    ]
)
