/*
 * Fused kernelized linear attention forward (float64 and float32), and windowed softmax attention
 * (winattn_body.h / winattn_entry.h, included here to share the vector exp and the workspace sizes).  C99
 * plus, with GCC or Clang, vector extensions and per-function target attributes; POSIX threads (through
 * parallel.h); no allocation of buffers (the caller passes the workspace); int status return.
 *
 *   int refimpl_linear_attention_f64(out, workspace, q, k, v, key_weight, v_scale, options, BH, N, M, d, e,
 *                                    workspace_len, nthreads)
 *   (and _f32)
 *
 *   out        (BH, N, e)   written completely on success, untouched on a nonzero status
 *   workspace  workspace_len >= refimpl_linear_attention_workspace(BH, M, d, e, nthreads) elements
 *   q (BH, N, d), k (BH, M, d), v (BH, M, e)     BH = batch x heads, packed C order
 *   key_weight   (BH, M) or NULL: w_j multiplies phi(K_j) (RALA Eq. 3's alpha_j)
 *   v_scale      (BH) or NULL: head bh uses v / v_scale[bh] (options->v_scale_divide != 0) or
 *                v * v_scale[bh] in place of v (L2ViT's gain, the definition's rounded v_eff), applied as V
 *                rows are staged
 *   options      struct refimpl_la_options (refimpl_kernels.h), the scalar options:
 *     feature_map  LA_MAP_RELU (0), LA_MAP_ELU1 (1) or LA_MAP_FOCUSED (2)
 *     power        LA_MAP_FOCUSED: the focusing factor p (finite, >= 1); ignored by the other maps
 *     clamp        nonzero: den -> max(den, clamp_min) first (L2ViT Appendix 8)
 *     eps_policy   0: den + eps (skipped when eps == 0), 1: max(den, eps)
 *     clamp_min, eps  the normaliser's constants (used in REAL)
 *     kv_scale     s multiplies KV and the key sum after the sum (1: none; RALA's 1/N token scaling)
 *   nthreads     threads to use (>= 1; capped at LA_MAX_THREADS and at the number of work items)
 *
 * What is computed, and in which order, is described at the top of linattn_body.h.
 *
 *   int refimpl_rala_alpha_f64(alpha, workspace, q, k, feature_map, kappa_q, scale, BH, N, M, d,
 *                              workspace_len, nthreads)   (and _f32)
 *
 *   alpha (BH, M) = M softmax_j(scale Q_g . kappa(K_j)), Q_g the mean of Q (or kappa(Q)) over its N tokens:
 *   RALA's reweighting coefficients, Eq. 4 (rala_body.h, rala_entry.h); the same thread and determinism
 *   rules as the attention kernels.
 *
 *   int refimpl_focused_feature_map_f64(out, x, rows, d, power)   (and _f32)
 *
 *   out (rows, d) = phi_p(x) row by row with the fused kernel's own staging code (LA_MAP_FOCUSED; the
 *   same bits as the map inside the kernel); for tests of the map alone and for callers that need it.
 *
 *   int refimpl_elu1_feature_map_f64(out, x, n)   (and _f32)
 *
 *   out[i] = ELU(x[i]) + 1 for i < n with the kernel's own staging code (the same bits as the map inside
 *   the fused kernel); used by RALA for the alpha logits of Eq. 4, which need kappa(K) outside the kernel.
 *
 * Threading and determinism.  Work is cut into items whose boundaries depend on the problem sizes only,
 * never on the thread count: pass 1 items are (head, chunk of keys) with NC = refimpl_linear_attention_
 * chunks(M) chunks per head, each writing its own partial KV and key sum into the workspace; the partials
 * are reduced in chunk order by one thread between the passes; pass 2 items are (head, block of LA_QB
 * queries), each writing its own rows of out.  The two passes are two phases of the parallel runtime
 * (parallel.h: one team of POSIX threads per call claiming items from an atomic counter, a barrier
 * between phases, a thread that cannot be created claiming nothing).  Which thread runs an item does not
 * matter: every output element sees the same operations in the same order for any thread count, any
 * assignment of items to threads (and any vector level), so the result is bitwise identical across runs
 * and thread counts (tests/test_kernels_linear.py, tests/test_kernels_parallel.py).  Calls too small to
 * pay for the threads (fewer than LA_PARALLEL_MIN multiply-adds) run on the calling thread.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "parallel.h"
#include "refimpl_kernels.h"

#if !defined(__GNUC__) && !defined(__clang__)
#error "ckernels need GCC or Clang (vector extensions); see docs/backends.md"
#endif

#define REFIMPL_INLINE inline __attribute__((always_inline))

#if (defined(__x86_64__) || defined(_M_X64)) && !defined(REFIMPL_NO_ISA_DISPATCH)
#define LA_X86_DISPATCH 1
#else
#define LA_X86_DISPATCH 0
#endif

#define LA_MAP_RELU REFIMPL_LA_MAP_RELU
#define LA_MAP_ELU1 REFIMPL_LA_MAP_ELU1
#define LA_MAP_FOCUSED REFIMPL_LA_MAP_FOCUSED

/* Tokens staged (feature map applied) at a time, per thread. */
#define LA_TB 64
/* Queries per pass-2 work item. */
#define LA_QB 256
/* At most this many key chunks per head (and at least LA_CHUNK_MIN keys per chunk). */
#define LA_MAX_CHUNKS 16
#define LA_CHUNK_MIN 64
#define LA_MAX_THREADS PAR_MAX_THREADS
/* Below this many multiply-adds (BH (N + M) d e) a call runs on one thread: measured here (when each pass
 * had its own pthread create/join round; a second core that other processes often hold), two threads lost
 * at N = 196, d = 64, 3 heads (4.8M: 0.15 ms on one thread, 0.22 ms on two) and won from N = 16384. */
#define LA_PARALLEL_MIN ((int64_t)1 << 23)

/* 1 / pi rounded to double (Python's 1.0 / math.pi). */
#define LA_INV_PI 0x1.45f306dc9c883p-2
/* Internal map (not a public REFIMPL_LA_MAP_*: only refimpl_linear_angular selects it). */
#define LA_MAP_UNIT 16 /* x / max(||x||, eps) per row, ||x|| = m ||x / m||, m = max|x| (Castling's Q^, K^) */

/* The focused map raises r = a / max(a) in [0, 1] to the power p.  For an integer p with
 * 1 <= p <= LA_FOCUSED_MUL_MAX it does so by p - 1 sequential multiplications (r * r * ... * r), otherwise
 * by libm's pow.  Why that is within the error model: refimpl.attention.focused.focused_function_error
 * budgets a relative error of (p + c + 1) u for t = r^p, c = config.ELEMENTARY_FUNCTION_ULPS = 4 (pow's
 * assumed accuracy): p u propagated from r's own rounding (r = a / m, one division; (r(1 + d))^p =
 * r^p (1 + p d + O(u^2))), plus (c + 1) u for evaluating the power.  p - 1 rounded multiplications of
 * exact factors give r^p (1 + theta_{p-1}), |theta_{p-1}| <= gamma_{p-1} = (p - 1) u + O(u^2) (Higham
 * Lemma 3.1), so repeated multiplication fits the budget while p - 1 <= c + 1, i.e. p <= c + 2 = 6.  Above
 * that, pow (about 15-20 ns per call here, against well under 1 ns per multiplication).  Underflow: the
 * p - 1 products round at most p - 1 <= p + c times, inside the (p + c + 4) eta_T the model allows.
 * FLatten uses p = 3: two multiplications.  Keep equal to config.ELEMENTARY_FUNCTION_ULPS + 2 (checked
 * by tests/test_kernels_focused.py). */
#define LA_FOCUSED_MUL_MAX 6

struct la_policy {
    int map;          /* LA_MAP_* */
    double map_eps;   /* LA_MAP_UNIT: the eps of max(||x||, eps) */
    double power;     /* LA_MAP_FOCUSED: the focusing factor p (finite, >= 1) */
    int ipow;         /* LA_MAP_FOCUSED: p if p is an integer in [1, LA_FOCUSED_MUL_MAX] (powers by
                         multiplication), else 0 (pow) */
    int clamp;
    int eps_clamp;
    double clamp_min;
    double eps;
    int castling;     /* 0: num / den_eff.  1: Castling: c_i + (1/pi) num_i [/ (M/2 + (1/pi) q^_i . ksum)] */
    int own;          /* castling: c_i = 1/2 v_i (1) or 1/2 sum_j v_j (0) */
    int simsum;       /* castling: divide by the similarity sum */
    int v_divide;     /* with a V scale s: v / s (1) or v * s (0) */
    int64_t M;
};

int64_t refimpl_linear_attention_chunks(int64_t M)
{
    if (M < 1)
        return 1;
    const int64_t nc = M / LA_CHUNK_MIN;
    return nc < 1 ? 1 : (nc > LA_MAX_CHUNKS ? LA_MAX_CHUNKS : nc);
}

static int64_t la_threads(int64_t nthreads)
{
    return nthreads < 1 ? 1 : (nthreads > LA_MAX_THREADS ? LA_MAX_THREADS : nthreads);
}

int64_t refimpl_linear_attention_workspace(int64_t BH, int64_t M, int64_t d, int64_t e, int64_t nthreads)
{
    if (BH < 1 || M < 1 || d < 1 || e < 1)
        return -1;
    const int64_t lim = PTRDIFF_MAX / 8;
    const int64_t nc = refimpl_linear_attention_chunks(M);
    if (d > lim / (e + 2) || d * (e + 2) > lim / nc || d * (e + 2) * nc > lim / BH || d + e > lim / (LA_TB + 1))
        return -1;
    const int64_t part = BH * nc * (d * (e + 1) + e);
    const int64_t scratch = la_threads(nthreads) * (LA_TB * (d + e) + LA_TB);
    return part > lim - scratch ? -1 : part + scratch;
}

/* RALA's alpha (rala_entry.h): per head ncq d partial sums of Q, d of Q_g, nck chunk maxima and nck chunk
 * sums; per thread a staging buffer of LA_TB tokens (LA_TB d). */
int64_t refimpl_rala_alpha_workspace(int64_t BH, int64_t N, int64_t M, int64_t d, int64_t nthreads)
{
    if (BH < 1 || N < 1 || M < 1 || d < 1)
        return -1;
    const int64_t lim = PTRDIFF_MAX / 8;
    const int64_t ncq = refimpl_linear_attention_chunks(N), nck = refimpl_linear_attention_chunks(M);
    if (d > lim / (LA_MAX_CHUNKS + 1) || BH > lim / ((ncq + 1) * d + 2 * nck) || d > lim / (LA_TB * LA_MAX_THREADS))
        return -1;
    const int64_t part = BH * ((ncq + 1) * d + 2 * nck);
    const int64_t scratch = la_threads(nthreads) * LA_TB * d;
    return part > lim - scratch ? -1 : part + scratch;
}

int64_t refimpl_window_attention_workspace(int64_t N, int64_t M, int64_t d, int64_t nthreads)
{
    const int64_t lim = PTRDIFF_MAX / 8;
    if (N < 1 || M < 1 || d < 1 || d > lim / 8 || N > lim / 8 || M > lim / 8 || d + N + 1 > lim / (M + d + 1))
        return -1;
    const int64_t per = d * M + N * M + N * d + M + N;
    const int64_t t = la_threads(nthreads);
    return per > lim / t ? -1 : per * t;
}

/* ----- per-type, per-ISA work items ----- */
#define REAL double
#define LA_SINT int64_t   /* the signed integer of REAL's width (vector comparison masks) */
#define LA_EXP exp
#define SUF base_f64
#define VBYTES 16
#define LA_TARGET
#include "linattn_body.h"
#include "winattn_body.h"
#include "rala_body.h"
#undef SUF
#undef VBYTES
#undef LA_TARGET
#if LA_X86_DISPATCH
#define SUF avx2_f64
#define VBYTES 32
#define LA_TARGET __attribute__((target("avx2")))
#include "linattn_body.h"
#include "winattn_body.h"
#include "rala_body.h"
#undef SUF
#undef VBYTES
#undef LA_TARGET
#define SUF avx512_f64
#define VBYTES 64
#define LA_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw")))
#include "linattn_body.h"
#include "winattn_body.h"
#include "rala_body.h"
#undef SUF
#undef VBYTES
#undef LA_TARGET
#endif
#define TSUF f64
#include "linattn_entry.h"
#include "winattn_entry.h"
#include "rala_entry.h"
#undef TSUF
#undef LA_EXP
#undef REAL
#undef LA_SINT

#define REAL float
#define LA_SINT int32_t
#define LA_EXP expf
#define SUF base_f32
#define VBYTES 16
#define LA_TARGET
#include "linattn_body.h"
#include "winattn_body.h"
#include "rala_body.h"
#undef SUF
#undef VBYTES
#undef LA_TARGET
#if LA_X86_DISPATCH
#define SUF avx2_f32
#define VBYTES 32
#define LA_TARGET __attribute__((target("avx2")))
#include "linattn_body.h"
#include "winattn_body.h"
#include "rala_body.h"
#undef SUF
#undef VBYTES
#undef LA_TARGET
#define SUF avx512_f32
#define VBYTES 64
#define LA_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw")))
#include "linattn_body.h"
#include "winattn_body.h"
#include "rala_body.h"
#undef SUF
#undef VBYTES
#undef LA_TARGET
#endif
#define TSUF f32
#include "linattn_entry.h"
#include "winattn_entry.h"
#include "rala_entry.h"
#undef TSUF
#undef LA_EXP
#undef REAL
#undef LA_SINT
