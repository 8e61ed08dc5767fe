"""cffi builder of refimpl's C kernels (out-of-line API mode): ckernels/*.c -> refimpl._native._kernels.

Used two ways:

- by the package build: setup.py passes ``cffi_modules=["build_ext.py:ffibuilder"]`` to setuptools, so
  ``pip install .`` and ``pip install -e .`` compile the kernels (editable installs put the extension
  module next to the sources, in refimpl/_native/);
- by hand, for a development rebuild in place: ``python build_ext.py`` (from the repository root).

The C signatures come from ckernels/refimpl_kernels.h (the block between the CFFI-CDEF markers), so the
header is the single source of truth; cffi's API mode then compiles a real C call to each function,
checked by the C compiler against that header.

Floating-point flags, and why
-----------------------------
The C kernels must compute what the NumPy definition computes, to within the error model, and they
must do so reproducibly.  The flags are chosen for that, and then for speed:

``-std=c99``
    The language the kernels are written in (``restrict``, mixed declarations).  In GCC an ISO mode
    also means ``-fexcess-precision=standard``: on an x87-only target every assignment rounds to the
    declared type (on x86-64 SSE there is no excess precision to begin with).
``-O3``
    Vectorisation and unrolling.  It licenses no value-changing transformation: the IEEE results of
    ``-O0`` and ``-O3`` are identical in the absence of the flags below.
``-fno-fast-math`` (explicit)
    ``-ffast-math`` would allow reassociation (changing the summation order, and so the rounding),
    reciprocal approximations, flush-to-zero of subnormals at load time and the assumption that NaN and
    Inf never occur (which would break NaN/Inf propagation, a tested property).  It is off by default;
    it is spelled out so that a CFLAGS from the environment that adds it is overridden (our flags come
    last on the command line).
``-ffp-contract=off``
    No fused multiply-add contraction.  FMA rounds ``a*b + c`` once instead of twice; that is *more*
    accurate and would still satisfy the error model (whose gamma_n bounds hold for either), so this is
    not about the bound.  It is about reproducibility and about being checkable bit for bit: without
    contraction the kernels perform exactly the roundings the NumPy definition performs, in the same
    order, so the result is the same on every build, at every vector width (see the instruction-set
    dispatch in ckernels/dwconv2d.c) and with or without an FMA unit, and equal to the NumPy definition in the same
    precision (tests/test_backends.py checks this).  GCC's default in its GNU modes is ``fast``
    (contract wherever the target has FMA), so the flag matters.
``-fno-math-errno``
    Only removes the side effect of setting ``errno`` from libm calls (so ``sqrt`` can be one
    instruction).  It changes no value: the same correctly rounded sqrt, the same NaN and Inf.  Nothing
    reads errno after a kernel.  (Unlike ``-ffinite-math-only``, ``-fassociative-math``,
    ``-freciprocal-math`` or ``-funsafe-math-optimizations``, which we never pass.)
No ``-march``
    The build stays portable (a built wheel runs on any x86-64).  Speed comes from per-function target
    attributes in the C source instead: AVX-512, AVX2 and baseline versions of the hot loops, the widest
    one the CPU supports chosen at run time (ckernels/dwconv2d.c).  They return the same bits.

Threads
-------
``-pthread`` (compile and link).  The threaded kernels (ckernels/linattn.c: linear attention, RALA's
alpha, window attention) run their work items through the parallel runtime of ckernels/parallel.h: a team
of POSIX threads created per call, claiming items from an atomic counter, phases separated by a barrier,
the thread count being an argument of each call (``threads=`` in refimpl.backends._c, default
``config.C_KERNEL_THREADS``).  Not OpenMP: a process that also imports torch would then hold two OpenMP
runtimes, and OpenMP's thread count is process-wide state.  The reduction order is fixed by the problem
sizes, never by the thread count (work items with their own partial sums, reduced in item order), so
every thread count returns the same bits.

Plain versions
--------------
ckernels/linattn_plain.c (linear attention, Castling's linear-angular attention and the ELU + 1 and focused
feature maps), rala_plain.c, winattn_plain.c, dwconv2d_plain.c (the depthwise convolution) and lisa_plain.c (LiSA's
spectral product and contraction; checked by tests/test_kernels_lisa_c.py) hold the plain
scalar versions of the fast kernels (one thread, no vector types, no instruction-set dispatch, libm),
compiled with the same flags (so also without fast-math and without FMA contraction) into the same module
and declared in the same header (the CFFI-CDEF block); they are the fast kernels' specification, checked
against the NumPy definitions and against the fast kernels by tests/test_kernels_plain.py
(refimpl.backends._c_plain; not registered as backends).  ``sources`` below is every ckernels/*.c, so they
need no entry of their own, and the sanitizer build below compiles them too.

Sanitizers
----------
``REFIMPL_SANITIZE=1`` builds with ``-fsanitize=address,undefined -fno-sanitize-recover=all
-fno-omit-frame-pointer -g -O1`` (and links the runtimes).  The interpreter itself is not instrumented,
so the ASan runtime has to be preloaded::

    REFIMPL_SANITIZE=1 pip install -e . --no-build-isolation   # or: REFIMPL_SANITIZE=1 python build_ext.py
    LD_PRELOAD="$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 \\
        python -m pytest tests/test_backends.py -p no:cacheprovider

``refimpl.backends.available()["c"].reason`` reports the flags the loaded module was built with.
"""

from __future__ import annotations

import glob
import os
import re
import sys

from cffi import FFI

MODULE_NAME = "refimpl._native._kernels"

_ROOT = os.path.dirname(os.path.abspath(__file__))
_CKERNELS = os.path.join(_ROOT, "ckernels")
_HEADER = os.path.join(_CKERNELS, "refimpl_kernels.h")

#: Optimisation and floating-point flags (see the module docstring for each).
FP_FLAGS = ["-std=c99", "-O3", "-fno-fast-math", "-ffp-contract=off", "-fno-math-errno"]
WARNING_FLAGS = ["-Wall", "-Wextra", "-Wno-unused-parameter"]
#: POSIX threads for the multi-threaded kernels (ckernels/parallel.h; see "Threads" in the docstring).
THREAD_FLAGS = ["-pthread"]
#: Added when REFIMPL_SANITIZE=1 (AddressSanitizer + UndefinedBehaviorSanitizer; -O1 -g for usable reports).
SANITIZE_COMPILE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
                    "-g", "-O1"]
SANITIZE_LINK = ["-fsanitize=address,undefined"]


def sanitize_requested() -> bool:
    """True when the environment asks for the sanitizer build (REFIMPL_SANITIZE=1)."""
    return os.environ.get("REFIMPL_SANITIZE", "0").strip() not in ("", "0", "false", "no")


def _rel(path: str, absolute: bool) -> str:
    # setuptools wants source paths relative to the project root (the working directory of a build);
    # ffi.compile() works inside its tmpdir and needs absolute ones.
    rel = os.path.relpath(path)
    return path if absolute or rel.startswith("..") else rel


def _cdef() -> str:
    text = open(_HEADER, encoding="utf-8").read()
    m = re.search(r"/\* CFFI-CDEF-BEGIN \*/(.*?)/\* CFFI-CDEF-END \*/", text, re.S)
    if m is None:
        raise RuntimeError(f"{_HEADER}: no CFFI-CDEF-BEGIN/END block")
    return "\n".join(line for line in m.group(1).splitlines() if not line.lstrip().startswith("#"))


def _make_builder(absolute: bool = False) -> FFI:
    compile_args = FP_FLAGS + WARNING_FLAGS + THREAD_FLAGS
    link_args: list[str] = list(THREAD_FLAGS)
    if sanitize_requested():
        compile_args = compile_args + SANITIZE_COMPILE  # later -O1 overrides -O3
        link_args = link_args + SANITIZE_LINK
    flags = " ".join(compile_args + link_args)
    builder = FFI()
    builder.cdef(_cdef() + "\nconst char *refimpl_build_flags(void);\n")
    builder.set_source(
        MODULE_NAME,
        '#include "refimpl_kernels.h"\n'
        f"static const char refimpl_build_flags_str[] = {flags!r};\n".replace("'", '"') +
        "const char *refimpl_build_flags(void) { return refimpl_build_flags_str; }\n",
        sources=sorted(_rel(p, absolute) for p in glob.glob(os.path.join(_CKERNELS, "*.c"))),
        include_dirs=[_rel(_CKERNELS, absolute)],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        libraries=["m"] if sys.platform != "win32" else [],
    )
    return builder


ffibuilder = _make_builder()

if __name__ == "__main__":
    # In-place development build: refimpl/_native/_kernels*.so under the repository root.  Older builds
    # of the module are removed first: Python prefers a ".cpython-3XX-*.so" over an ".abi3.so" (what
    # `pip install -e .` writes), so a stale one would silently shadow a fresh build.
    import shutil

    ffibuilder = _make_builder(absolute=True)
    built = ffibuilder.compile(tmpdir=os.path.join(_ROOT, "build", "cffi"), verbose=True)
    native = os.path.join(_ROOT, "refimpl", "_native")
    for old in glob.glob(os.path.join(native, "_kernels*.so")) + glob.glob(os.path.join(native, "_kernels*.pyd")):
        os.remove(old)
    dest = os.path.join(native, os.path.basename(built))
    shutil.copyfile(built, dest)
    print(f"installed {os.path.relpath(dest, _ROOT)}")
