/*
 * Depthwise conv2d forward (float64 and float32).  C99 plus, with GCC or Clang, vector extensions and
 * per-function target attributes; no allocation; int status return.
 *
 *   int refimpl_dwconv2d_f64(out, x, weight, bias, stride_h, stride_w, pad_top, pad_left,
 *                            B, C, H, W, KH, KW, OH, OW)      (and _f32 with float)
 *
 *   out    (B, C, OH, OW)  written completely on success, untouched on a nonzero status
 *   x      (B, C, H, W)
 *   weight (C, KH, KW)     any KH, KW >= 1, odd or even
 *   bias   (C,) or NULL
 *   PyTorch zero-padding semantics: pad_top rows above and pad_left columns to the left; the bottom and
 *   right padding are implied by OH and OW (they may differ from the top/left: asymmetric padding).
 *
 * The mapping to the NumPy definition, the exact order of operations and why the result is bitwise that
 * definition evaluated in the same precision are described at the top of dwconv2d_body.h.
 * Single-threaded: (b, c) planes are independent, so threading them (ckernels/parallel.h) could not
 * change a bit.  The plain version, its specification, is ckernels/dwconv2d_plain.c.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "refimpl_kernels.h"
#include "dwconv2d_check.h"

#if !defined(__GNUC__) && !defined(__clang__)
#error "ckernels need GCC or Clang (vector extensions); see docs/backends.md"
#endif

#define REFIMPL_INLINE inline __attribute__((always_inline))

/* Longest input row segment an edge tile stages ((VLEN-1) stride_w + KW elements; wider kernels take the
 * element-by-element path), and how many input rows ((tile rows - 1) stride_h + KH) it stages at once. */
#define RI_BUF 128
#define RI_EDGE_ROWS 32
/* The staged path's zero-padded plane buffer (on the stack of the plane loop): planes whose padded size
 * exceeds it take the tile-by-tile path. */
#define RI_STAGE_BYTES 65536


/*
 * Instruction-set dispatch.  On x86-64 the plane loop is compiled three times, for AVX-512
 * (x86-64-v4), AVX2 (x86-64-v3) and the baseline (SSE2), and the widest one the CPU supports is used,
 * so one portable build (no -march) runs at the machine's vector width.  The versions differ only in
 * how many output columns one instruction handles: no FMA contraction (-ffp-contract=off) and no
 * reassociation (no -ffast-math), so all of them return the same bits (tests/test_backends.py runs
 * every level the CPU has and compares).  refimpl_set_max_isa() caps the level, for those tests.
 */
#if (defined(__x86_64__) || defined(_M_X64)) && !defined(REFIMPL_NO_ISA_DISPATCH)
#define REFIMPL_X86_DISPATCH 1
#else
#define REFIMPL_X86_DISPATCH 0
#endif
#if REFIMPL_X86_DISPATCH
#include <immintrin.h>
#endif

static int ri_max_isa = REFIMPL_ISA_AVX512;

int refimpl_isa_supported(void)
{
#if REFIMPL_X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw"))
        return REFIMPL_ISA_AVX512;
    if (__builtin_cpu_supports("avx2"))
        return REFIMPL_ISA_AVX2;
#endif
    return REFIMPL_ISA_BASE;
}

int refimpl_set_max_isa(int level)
{
    ri_max_isa = level < REFIMPL_ISA_BASE ? REFIMPL_ISA_BASE : level;
    return refimpl_isa_in_use();
}

int refimpl_isa_in_use(void)
{
    const int have = refimpl_isa_supported();
    return have < ri_max_isa ? have : ri_max_isa;
}

#define REAL double
#define SUF base_f64
#define VBYTES 16
#define RI_ROWS 4
#define RI_TARGET
#include "dwconv2d_body.h"
#undef SUF
#undef VBYTES
#undef RI_ROWS
#undef RI_TARGET
#if REFIMPL_X86_DISPATCH
#define SUF avx2_f64
#define VBYTES 32
#define RI_ROWS 4
#define RI_TARGET __attribute__((target("avx2")))
#include "dwconv2d_body.h"
#undef SUF
#undef VBYTES
#undef RI_ROWS
#undef RI_TARGET
#define SUF avx512_f64
#define VBYTES 64
#define RI_ROWS 8
#define RI_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw")))
#include "dwconv2d_body.h"
#undef SUF
#undef VBYTES
#undef RI_ROWS
#undef RI_TARGET
#endif
#define TSUF f64
#include "dwconv2d_entry.h"
#undef TSUF
#undef REAL

#define REAL float
#define SUF base_f32
#define VBYTES 16
#define RI_ROWS 4
#define RI_TARGET
#include "dwconv2d_body.h"
#undef SUF
#undef VBYTES
#undef RI_ROWS
#undef RI_TARGET
#if REFIMPL_X86_DISPATCH
#define SUF avx2_f32
#define VBYTES 32
#define RI_ROWS 4
#define RI_TARGET __attribute__((target("avx2")))
#include "dwconv2d_body.h"
#undef SUF
#undef VBYTES
#undef RI_ROWS
#undef RI_TARGET
#define SUF avx512_f32
#define VBYTES 64
#define RI_ROWS 8
#define RI_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw")))
#include "dwconv2d_body.h"
#undef SUF
#undef VBYTES
#undef RI_ROWS
#undef RI_TARGET
#endif
#define TSUF f32
#include "dwconv2d_entry.h"
#undef TSUF
#undef REAL

const char *refimpl_status_string(int status)
{
    switch (status) {
    case REFIMPL_OK:
        return "ok";
    case REFIMPL_ERR_SIZE:
        return "a size (B, C, H, W, KH, KW, OH or OW) is < 1";
    case REFIMPL_ERR_STRIDE:
        return "a stride is < 1";
    case REFIMPL_ERR_PADDING:
        return "a padding is < 0";
    case REFIMPL_ERR_OVERFLOW:
        return "an element count or index does not fit in ptrdiff_t";
    case REFIMPL_ERR_NULL:
        return "a required buffer pointer is NULL";
    case REFIMPL_ERR_OPTION:
        return "an option is out of range (feature map, eps policy, the focused map's power)";
    case REFIMPL_ERR_WORKSPACE:
        return "the workspace is smaller than the kernel's *_workspace() size";
    default:
        return "unknown status";
    }
}
