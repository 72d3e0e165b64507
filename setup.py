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
        except Exception as e:  # noqa: BLE001
            print(f"warning: {ext.name} not built ({e}); using the pure fallbacks")


setup(
    ext_modules=[
        Extension("ember._ember_native", ["ember/_csrc/ember_native.c"], extra_compile_args=["-O3", "-std=c99", "-ffp-contract=off", "-fno-math-errno"])
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
