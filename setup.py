from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ray_tfrecord._native",
            sources=["ray_tfrecord/_native.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ]
)
