"""libc's calls that the standard library lacks (prctl, renameat2), through ctypes, where there are any."""

import os

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


_LIBC = {}  # type: dict


def libc(name, argtypes):
    """libc's function `name` through ctypes (its errno kept), once; None where there is none (not Linux, an old
    libc, no ctypes). `argtypes`: a function of the ctypes module giving the argument types."""
    if name not in _LIBC:
        try:
            import ctypes

            fn = getattr(ctypes.CDLL(None, use_errno=True), name)
            fn.argtypes = argtypes(ctypes)
            fn.restype = ctypes.c_int
            _LIBC[name] = fn
        except Exception:
            _LIBC[name] = None
    return _LIBC[name]


def prctl_fn():
    """libc's prctl, or None where there is none."""
    return libc("prctl", lambda c: [c.c_int, c.c_ulong, c.c_ulong, c.c_ulong, c.c_ulong])
_RENAME_EXCHANGE = 2


def exchange(fd_a, name_a, fd_b, name_b):
    """renameat2(RENAME_EXCHANGE): swap two names at once. False where this kernel, libc or file system cannot."""
    import errno

    fn = libc("renameat2", lambda c: [c.c_int, c.c_char_p, c.c_int, c.c_char_p, c.c_uint])
    if fn is None:
        return False
    import ctypes

    if fn(fd_a, os.fsencode(name_a), fd_b, os.fsencode(name_b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), name_b)
