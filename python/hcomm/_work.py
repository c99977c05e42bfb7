"""Work handles of async_op=True calls (torch.distributed's habit): h.wait() returns what the
blocking call returns, h.is_completed() polls. Built on the C nonblocking calls (hcomm_wait,
hcomm_test): a handle owns its C requests and keeps every buffer they touch alive until they
complete."""
import ctypes

from . import _lib, _world
from ._lib import lib


class Work:
    """A pending collective. wait() blocks until it completed and returns its result (again on
    later calls); is_completed() is True once it has (it never blocks). Must be completed on
    the thread that issued it. Completed at the latest when its group's context is destroyed
    or the handle is garbage (a dropped handle waits then, so its buffers stay valid).
    A failed collective raises its hcomm error from wait() (and from every later call)."""

    def __init__(self, group, what, reqs, keep, finish=None, result=None):
        self.group, self._what = group, what
        self._reqs = list(reqs)  # C hcomm_request_t pointers still pending
        self._keep, self._finish, self._result = keep, finish, result
        self._error = None
        handles = getattr(_world._state, "routings", None)
        if handles is not None and self._reqs:  # completed before its group goes away
            handles.add(self)

    def __repr__(self):
        state = "pending" if self._reqs else ("failed" if self._error else "completed")
        return f"<hcomm.Work {self._what} {state}>"

    def _done(self, r):
        if r and self._error is None:
            self._error = self.group.fail(self._what, r) if self.group else _lib.error(r)
        if not self._reqs:
            self._keep = None
            if self._error is None and self._finish is not None:
                try:
                    self._result = self._finish()
                except BaseException as e:  # noqa: B036 -- kept and raised by wait()
                    self._error = e
                self._finish = None

    def wait(self, timeout=None):
        """Blocks until the collective completed; returns the blocking call's result.
        timeout: accepted for torch.distributed's signature; the group's timeout applies."""
        while self._reqs:
            r = lib.hcomm_wait(self._reqs.pop(0))
            self._done(r)
        if self._error is not None:
            raise self._error
        return self._result

    def is_completed(self):
        """True once the collective completed (successfully or not); never blocks."""
        done = ctypes.c_int()
        while self._reqs:
            r = lib.hcomm_test(self._reqs[0], ctypes.byref(done))
            if not done.value:
                return False
            self._reqs.pop(0)
            self._done(r)
        return True

    def result(self):
        return self.wait()

    def free(self):
        """Completes the collective (a context being destroyed, or garbage); errors stay for
        wait()."""
        try:
            self.wait()
        except BaseException:  # noqa: B036 -- raised again by wait()
            pass

    def __del__(self):
        if getattr(self, "_reqs", None):
            self.free()


def done(result, group=None, what="call"):
    """A handle that is already complete (a call whose C form blocks)."""
    return Work(group, what, (), None, result=result)


def issue(fn, args, group, what):
    """Calls C nonblocking `fn(*args, &req)`; returns the request pointer or raises."""
    req = ctypes.c_void_p()
    r = fn(*args, ctypes.byref(req))
    if r:
        raise group.fail(what, r)
    return req
