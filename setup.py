from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ray_tfrecord._src.core._native",
            # A unity build: module.c includes the Python-free units (listed as depends) so that the
            # decoder's hot loops inline across them; the fuzz harness compiles them one by one.
            sources=["ray_tfrecord/_src/core/native/module.c"],
            depends=sorted(glob("ray_tfrecord/_src/core/native/*.[ch]")),
            # Functions start on a cache line, so a hot loop's speed does not depend on how much
            # code precedes it in the one translation unit.
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-falign-functions=64"],
        )
    ]
)
