"""What the Python layer adds to a call: hcomm.tp.all_reduce (descriptor building, output
allocation, error check) against the same C call, hcomm_tp_all_reduce, made through ctypes with
descriptors built once, in the same run on 2 local ranks. Blocks of calls alternate between
the two so that load on the machine hits both alike; the figure is the median over blocks of
the time per call.  Usage: HCOMM_LIBRARY=build PYTHONPATH=python /usr/bin/python3 examples/python/overhead.py
(or under mpirun -np 2 for one process per rank)."""
import ctypes
import os
import statistics
import sys
import time

import numpy as np

import hcomm
from hcomm import _lib, _tensor, tp


def body(nbytes, blocks, per_block):
    w = hcomm.world()
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    din, dout = _tensor.desc(x), _tensor.desc(out)
    c_call = _lib.lib.hcomm_tp_all_reduce
    py, raw = [], []
    for _ in range(blocks):
        w.barrier()
        t0 = time.perf_counter_ns()
        for _ in range(per_block):
            tp.all_reduce(x, group=w)
        t1 = time.perf_counter_ns()
        w.barrier()
        t2 = time.perf_counter_ns()
        for _ in range(per_block):
            if c_call(w._ptr, ctypes.byref(din), ctypes.byref(dout), 0):
                raise _lib.error(1)
        t3 = time.perf_counter_ns()
        py.append((t1 - t0) / per_block / 1e3)
        raw.append((t3 - t2) / per_block / 1e3)
    return statistics.median(py), statistics.median(raw)


def main():
    for nbytes, blocks, per in ((8, 41, 500), (1 << 20, 21, 20)):
        # Under mpirun each process is a rank (no shared GIL); else 2 threads of this one.
        res = hcomm.launch(body, nranks=2, args=(nbytes, blocks, per))
        if hcomm._world.under_mpirun() and "OMPI_COMM_WORLD_RANK" in os.environ and \
                os.environ["OMPI_COMM_WORLD_RANK"] != "0":
            continue
        py, raw = res[0]
        where = "mpi" if hcomm._world.under_mpirun() else "local"
        print(f"all_reduce {nbytes:>8} B, 2 ranks ({where}): python tp.all_reduce {py:8.2f} us, "
              f"C call via ctypes {raw:8.2f} us, overhead {py - raw:+.2f} us (median of "
              f"{blocks} blocks of {per})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
