"""python3 -m hcomm.run -n 8 script.py [args...]: runs the whole script once per rank, as
hcomm.launch does for a function (threads on the local backend). Under mpirun
(`mpirun -np 2 python3 -m hcomm.run script.py`) this process is one rank of the job. Inside
the script hcomm.world(), get_rank() and init_context() refer to its rank; each rank gets its
own module globals."""
import argparse
import runpy
import sys

import hcomm


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m hcomm.run", description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=None,
                    help="ranks on the local backend (ignored under mpirun)")
    ap.add_argument("--backend", default=None, help="local or mpi (default: mpi under mpirun)")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    if a.nranks is None and not hcomm._world.under_mpirun():
        ap.error("-n N is required outside mpirun")
    sys.argv = [a.script] + a.args
    hcomm.launch(lambda: runpy.run_path(a.script, run_name="__main__") and None,
                 nranks=a.nranks, backend=a.backend)


if __name__ == "__main__":
    main()
