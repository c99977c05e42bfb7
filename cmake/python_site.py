"""Prints where `cmake --install` puts the Python package, relative to the install prefix
(argv[1]): the first of this interpreter's site directories in <prefix>/lib* (Debian's
/usr/bin/python3 with prefix /usr/local: lib/python3.11/dist-packages, which it imports from
with no environment variable), else its posix_prefix scheme's purelib for that prefix."""
import os
import site
import sys
import sysconfig

prefix = os.path.normpath(sys.argv[1])
dirs = site.getsitepackages() + [sysconfig.get_path("purelib")]
for d in dirs:
    rel = os.path.relpath(os.path.normpath(d), prefix)
    if rel.startswith("lib"):  # /usr: lib/python3/dist-packages, not local/lib/...
        print(rel)
        break
else:
    lib = sysconfig.get_path("purelib", "posix_prefix", vars={"base": prefix})
    print(os.path.relpath(lib, prefix))
