"""What the Python layer adds to a call: hcomm.tp.all_reduce (argument checks, descriptors,
output allocation, error check) against the C call it makes, hcomm_tp_all_reduce through
ctypes with its descriptors built once, in the same run. Blocks of calls alternate between the
two so that load on the machine hits both alike; the figures are medians over blocks of the
time per call, and the overhead is the median of the blocks' paired differences.

    HCOMM_LIBRARY=build PYTHONPATH=python /usr/bin/python3 -m hcomm.run -n 2 \
        examples/python/overhead.py                     # 2 processes (mpirun), the target
    HCOMM_LIBRARY=build PYTHONPATH=python /usr/bin/python3 examples/python/overhead.py
                                                        # threads: 1 and 2 ranks

On the local backend the ranks are threads of one process and share the GIL: what one rank
does in Python delays the other, so the 2-rank figure counts the Python work of both ranks;
the 1-rank line and the mpirun run (one process per rank) show one rank's own cost."""
import ctypes
import statistics
import sys
import time

import numpy as np

try:
    import hcomm
except ImportError:  # run from the source tree without PYTHONPATH
    import pathlib
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    import hcomm
from hcomm import _lib, _tensor, tp


def body(nbytes, blocks, per_block, kind):
    w = hcomm.world()
    x = np.ones(nbytes // 4, np.float32)
    if kind == "torch":
        import torch
        x = torch.from_numpy(x)
    out = _tensor.empty(x, x.shape)
    din, dout = _tensor.desc(x), _tensor.desc(out)
    pin, pout = ctypes.byref(din), ctypes.byref(dout)
    c_call = _lib.raw("hcomm_tp_all_reduce")  # what tp.all_reduce calls
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
            if c_call(w._vp, pin, pout, 0):
                raise _lib.error(1)
        t3 = time.perf_counter_ns()
        py.append((t1 - t0) / per_block / 1e3)
        raw.append((t3 - t2) / per_block / 1e3)
    return (statistics.median(py), statistics.median(raw),
            statistics.median(p - r for p, r in zip(py, raw)))


RUNS = [(8, 41, 500, "numpy"), (8, 41, 200, "torch"), (1 << 20, 21, 20, "numpy")]


def report(res, n, nbytes, blocks, per, kind):
    py, raw, over = res
    print(f"all_reduce {nbytes:>8} B {kind:5}, {n} rank(s): python tp.all_reduce "
          f"{py:8.2f} us, C call {raw:8.2f} us, overhead {over:+.2f} us "
          f"(median of {blocks} blocks of {per})", flush=True)


def main():
    if hcomm._world._rank_state() is not None:  # a rank of python3 -m hcomm.run
        w = hcomm.world()
        for nbytes, blocks, per, kind in RUNS:
            res = body(nbytes, blocks, per, kind)
            if w.rank == 0:
                report(res, f"{w.size} {w.backend}", nbytes, blocks, per, kind)
        return
    mpi = hcomm.under_mpirun()
    for nranks in ((None,) if mpi else (1, 2)):
        for nbytes, blocks, per, kind in RUNS:
            res = hcomm.launch(body, nranks=nranks, args=(nbytes, blocks, per, kind))
            if mpi and hcomm.launch(hcomm.get_rank)[0] != 0:
                continue
            report(res[0], nranks or "mpi", nbytes, blocks, per, kind)


if __name__ == "__main__":  # also as a script of python3 -m hcomm.run
    main()
