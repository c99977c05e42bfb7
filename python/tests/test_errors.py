"""C failures map to hcomm.HcommError subclasses carrying the C message; bad Python arguments
are TypeError/ValueError before any communication; a rank's exception reaches the caller."""
import numpy as np
import pytest

import hcomm
from conftest import run
from hcomm import tp


def test_mismatch_carries_c_message():
    def body():
        r = hcomm.get_rank()
        try:
            tp.all_reduce(np.zeros(4 + r, np.float32))
        except hcomm.MismatchError as e:
            return type(e), e.code, e.name, str(e)

    for cls, code, name, msg in run(body, 2):
        assert cls is hcomm.MismatchError and code == 6 and name == "HCOMM_ERR_MISMATCH"
        assert msg.startswith("hcomm_") and "count=4" in msg and "count=5" in msg, msg


def test_shape_error_and_peer():
    def body():
        x = np.zeros((3 if hcomm.get_rank() == 0 else 4,), np.float32)
        try:
            tp.reduce_scatter(x, dim=0)
        except hcomm.HcommError as e:
            return type(e).__name__, str(e)

    (c0, m0), (c1, m1) = run(body, 2)
    assert c0 == "ShapeError" and "hcomm_tp_reduce_scatter" in m0, m0
    assert c1 == "PeerError", (c1, m1)
    assert issubclass(hcomm.ShapeError, ValueError)
    assert issubclass(hcomm.HcommTimeout, TimeoutError)


def test_python_argument_errors():
    def body():
        with pytest.raises(ValueError, match="not contiguous"):  # outputs only; inputs copy
            tp.all_reduce(np.zeros((4, 2), np.float32), out=np.zeros((4, 4), np.float32)[:, ::2])
        with pytest.raises(TypeError, match="complex128"):
            tp.all_reduce(np.zeros(4, np.complex128))
        with pytest.raises(TypeError, match="numpy array or a torch"):
            tp.all_reduce([1.0, 2.0])
        with pytest.raises(ValueError, match="op must be"):
            tp.all_reduce(np.zeros(4), op="mean")
        with pytest.raises(ValueError, match="dim=5"):
            tp.all_gather(np.zeros(4), dim=5)
        return "ok"

    assert run(body, 2) == ["ok", "ok"]


def test_rank_exception_names_rank():
    def body():
        if hcomm.get_rank() == 2:
            raise KeyError("boom")
        tp.all_reduce(np.zeros(2))  # the peers are aborted, not left waiting

    with pytest.raises(KeyError) as info:
        run(body, 4)
    assert info.value.rank == 2
    assert any("rank 2 of 4" in n for n in info.value.__notes__)


def test_launch_bad_nranks():
    with pytest.raises(ValueError, match="nranks"):
        hcomm.launch(lambda: None, nranks=0, backend="local")
    assert hcomm.launch(lambda: 5, nranks=1) == [5]
