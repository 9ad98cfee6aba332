"""Run a command with no network sockets: a seccomp filter, then exec (edgekit's offline toolchain runs).

``python -I -S seccomp_exec.py -- PROGRAM ARGS...``. Not part of the ``edge`` package API: started by
:func:`edge.toolchains.offline.offline_popen` where no network namespace is available. Standard library only.

The filter (classic BPF, installed with ``PR_SET_NO_NEW_PRIVS`` so no setuid program can drop it) refuses
``socket()`` for every address family but ``AF_UNIX`` and ``AF_NETLINK`` (EACCES), and ``io_uring_setup``
(an io_uring can create sockets itself); a system call of another ABI (i386 ``int 0x80``, x32) is refused
too. The kernel applies it to this process and everything it starts, whatever the language: native code,
``python -I`` children, curl. Local IPC keeps working.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

# per architecture: (AUDIT_ARCH_*, socket, io_uring_setup)
_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}
_AF_ALLOWED = (1, 16)  # AF_UNIX, AF_NETLINK
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_ALLOW, _KILL = 0x7FFF0000, 0x80000000
_DENY = 0x00050000 | errno.EACCES  # SECCOMP_RET_ERRNO


def program() -> bytes:
    """The filter for this machine's architecture (struct sock_filter[], packed)."""
    arch, nr_socket, nr_uring = _ARCH[platform.machine()]
    ins = [
        (_LD, 0, 0, 4),  # seccomp_data.arch
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _KILL),  # another ABI's system call numbers mean other calls: refuse them all
        (_LD, 0, 0, 0),  # seccomp_data.nr
        (_JGE, 0, 1, 0x40000000),  # x32 system calls
        (_RET, 0, 0, _DENY),
        (_JEQ, 3, 0, nr_socket),
        (_JEQ, 0, 1, nr_uring),
        (_RET, 0, 0, _DENY),
        (_RET, 0, 0, _ALLOW),
        (_LD, 0, 0, 16),  # socket(): args[0], the address family (low 32 bits, little-endian)
        (_JEQ, 2, 0, _AF_ALLOWED[0]),
        (_JEQ, 1, 0, _AF_ALLOWED[1]),
        (_RET, 0, 0, _DENY),
        (_RET, 0, 0, _ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *i) for i in ins)


def install() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    prog = program()
    buf = ctypes.create_string_buffer(prog, len(prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(38, 1, None, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: seccomp_exec.py -- PROGRAM ARGS...", file=sys.stderr)
        return 2
    try:
        install()
    except (OSError, KeyError) as e:
        print(f"edgekit: cannot install the seccomp filter: {e}", file=sys.stderr)
        return 126
    os.execvp(argv[2], argv[2:])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
