"""python3 -m hcomm.run -n 8 script.py [args...]: runs the whole script once per rank, one
process per rank (as torchrun does): it starts `mpirun --oversubscribe -np 8` on this same
interpreter (sys.executable; --allow-run-as-root when run as root), and each process is one
rank of the mpi backend. --threads runs the ranks as threads of this one process instead (the
local backend: they share the interpreter lock and torch's global state, such as
torch.manual_seed). Under mpirun (`mpirun -np 2 python3 -m hcomm.run script.py`) this process
is one rank of the job. Inside the script hcomm.world(), get_rank() and init_context() refer
to its rank; each rank gets its own module globals."""
import argparse
import os
import pathlib
import runpy
import shutil
import subprocess
import sys

import hcomm


def _parser():
    ap = argparse.ArgumentParser(prog="python3 -m hcomm.run", description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=None,
                    help="ranks: processes through mpirun (threads with --threads)")
    ap.add_argument("--threads", action="store_true",
                    help="ranks as threads of this process (the local backend)")
    ap.add_argument("--backend", default=None, help="local or mpi (default: mpi under mpirun)")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    return ap


def mpirun_command(nranks, script, args, mpirun="mpirun"):
    """The mpirun command line that runs `script` on nranks processes of this interpreter."""
    cmd = [mpirun, "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["-np", str(nranks), sys.executable, "-m", "hcomm.run", script] + list(args)


def _spawn(ap, a):
    """Starts the processes; returns mpirun's exit status."""
    mpirun = shutil.which("mpirun")
    if mpirun is None or "mpi" not in hcomm.BACKENDS:
        why = "mpirun is not on PATH" if mpirun is None else "this build has no mpi backend"
        ap.exit(2, f"hcomm.run: {why}, so ranks cannot be processes; install Open MPI "
                   f"(Debian: openmpi-bin) or run the ranks as threads with --threads: "
                   f"{sys.executable} -m hcomm.run --threads -n {a.nranks} {a.script}\n")
    env = dict(os.environ)
    # The ranks import this same package, wherever it was found.
    here = str(pathlib.Path(hcomm.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    if os.path.isabs(hcomm._lib.lib._name):  # the very library this process loaded
        env.setdefault("HCOMM_LIBRARY", hcomm._lib.lib._name)
    return subprocess.call(mpirun_command(a.nranks, a.script, a.args, mpirun), env=env)


def main(argv=None):
    ap = _parser()
    a = ap.parse_args(argv)
    mpi = hcomm._world.under_mpirun()
    if a.nranks is None and not mpi:
        ap.error("-n N is required outside mpirun")
    if a.nranks is not None and a.nranks < 1:
        ap.error(f"-n must be >= 1, not {a.nranks}")
    if not mpi and not a.threads and a.backend in (None, "mpi"):
        sys.exit(_spawn(ap, a))
    sys.argv = [a.script] + a.args
    hcomm.launch(lambda: runpy.run_path(a.script, run_name="__main__") and None,
                 nranks=a.nranks, backend="local" if a.threads else a.backend)


if __name__ == "__main__":
    main()
