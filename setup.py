import os
import subprocess
import sys
import sysconfig
import tempfile
from glob import glob

from setuptools import Extension, setup

# The JPEG window decode (native/jpeg.c) links libjpeg-turbo, found in this order:
# 1. comma-deps-libjpeg, a build requirement on Python >= 3.12 (pyproject.toml): libjpeg-turbo 3.1
#    with its SIMD, static and position-independent; its symbols are kept out of the extension's
#    exports, so no other library's libjpeg can take their place or be taken over;
# 2. a system libjpeg-turbo >= 1.5 (jpeg_crop_scanline), e.g. Debian's libjpeg62-turbo-dev;
# 3. neither: the extension builds without it and ImageTransform decodes whole JPEGs (simplejpeg).
# RAY_TFRECORD_JPEG=none builds without it on purpose (the fallback's tests).
_PROBE = """#include <stdio.h>
#include <jpeglib.h>
int main(void) { struct jpeg_decompress_struct c; JDIMENSION x = 0, w = 1;
    jpeg_crop_scanline(&c, &x, &w); return (int)jpeg_skip_scanlines(&c, 1); }
"""


def _system_libjpeg_turbo() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(_PROBE)
        try:
            done = subprocess.run([cc, src, "-o", os.path.join(tmp, "probe"), "-ljpeg"], capture_output=True)
        except OSError:
            return False
        return done.returncode == 0


def _jpeg_options() -> dict:
    if os.environ.get("RAY_TFRECORD_JPEG") == "none":
        return {}
    try:
        import libjpeg
    except ImportError:
        libjpeg = None
    if libjpeg is not None:
        return {"define_macros": [("RT_HAVE_JPEG", "1")], "include_dirs": [libjpeg.INCLUDE_DIR],
                "extra_objects": [os.path.join(libjpeg.LIB_DIR, "libjpeg.a")],
                "extra_link_args": ["-Wl,--exclude-libs,ALL"]}
    if _system_libjpeg_turbo():
        return {"define_macros": [("RT_HAVE_JPEG", "1")], "libraries": ["jpeg"]}
    print("ray_tfrecord: no libjpeg-turbo found (Python >= 3.12 brings one; on 3.11 install libjpeg-turbo's "
          "headers, e.g. apt-get install libjpeg62-turbo-dev): ImageTransform will decode whole JPEGs",
          file=sys.stderr)
    return {}


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
            **_jpeg_options(),
        )
    ]
)
