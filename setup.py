"""The one build step pyproject.toml cannot state stably: calibration's two C extensions.

qconvert/calibrate/counting.py says why the counting loops exist, qconvert/calibrate/entropy.py why the
entropy screen does. Both are optional: without a C compiler the install succeeds and the numpy code, which
gives the same results, runs instead. (setuptools' own `[tool.setuptools.ext-modules]` table is still
experimental, hence this file.)
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "qconvert.calibrate._counting",
            sources=["qconvert/calibrate/_counting.c"],
            optional=True,
            extra_compile_args=["-O3", "-fno-trapping-math"],  # the latter lets gcc vectorise the clamps
        ),
        Extension(
            "qconvert.calibrate._entropy_screen",
            sources=["qconvert/calibrate/_entropy_screen.c"],
            optional=True,
            # Its float32 values repeat numpy's operations one for one: no fused multiply-adds. -O3 and
            # -fno-trapping-math (no result changes) let gcc vectorise the loops over Q, logarithms included:
            # with AVX-512 2.6x faster than -O2 and libm's log, with AVX2 1.6x.
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-trapping-math"],
        ),
    ]
)
