"""Builds the optional native core (ember._ember_native); metadata lives in pyproject.toml.

The extension is optional: without a C compiler the install still succeeds and ember runs on
its pure numpy/torch fallbacks (see ember/_native/).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # noqa: BLE001  # no compiler / no headers: fall back, don't fail
            print(f"warning: ember native core not built ({e}); using the pure fallbacks")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
            return
        except Exception as e:  # noqa: BLE001
            if OPENMP not in ext.extra_compile_args:
                print(f"warning: {ext.name} not built ({e}); using the pure fallbacks")
                return
            print(f"warning: {ext.name} not built with OpenMP ({e}); building it without (its kernels run on one thread)")
        ext.extra_compile_args = [a for a in ext.extra_compile_args if a != OPENMP]
        ext.extra_link_args = [a for a in ext.extra_link_args if a != OPENMP]
        try:
            super().build_extension(ext)
        except Exception as e:  # noqa: BLE001
            print(f"warning: {ext.name} not built ({e}); using the pure fallbacks")


# The kernels run a call's parts on OpenMP's threads; with GCC the module then needs libgomp.so.1,
# which torch's wheels bring (loaded first, so the two share one runtime: ember/_native/__init__.py)
OPENMP = "-fopenmp"


setup(
    ext_modules=[
        Extension("ember._ember_native", ["ember/_csrc/ember_native.c"], extra_compile_args=["-O3", "-std=c99", "-ffp-contract=off", "-fno-math-errno", OPENMP],
                  extra_link_args=[OPENMP])
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
