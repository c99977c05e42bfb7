"""`pip install --no-build-isolation ./python` (setuptools only, offline): the package, with
libhcomm-c.so bundled next to it when the build finds one, so that `import hcomm` needs no
HCOMM_LIBRARY. Looked for, in order: $HCOMM_LIBRARY (the .so or its directory), the source
tree's build/, then where `cmake --install` puts it by default (/usr/local/lib, /usr/lib*).
Without one the package installs alone and finds the library at import (hcomm/_lib.py)."""
import os
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent
NAME = "libhcomm-c.so"


def find_library():
    env = os.environ.get("HCOMM_LIBRARY")
    if env:
        p = pathlib.Path(env)
        return p / NAME if p.is_dir() else p
    cands = [HERE.parent / "build" / NAME]
    for prefix in ("/usr/local", "/usr"):
        for lib in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
            cands.append(pathlib.Path(prefix) / lib / NAME)
    return next((c for c in cands if c.is_file()), None)


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = find_library()
        if lib is not None and lib.is_file():
            dest = pathlib.Path(self.build_lib) / "hcomm" / NAME
            shutil.copyfile(lib.resolve(), dest)  # the file, not a symlink to it
            print(f"hcomm: bundled {lib.resolve()} as {dest}")
        else:
            print("hcomm: no libhcomm-c.so found to bundle; import finds an installed one")


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for this platform, not py3-none-any."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
