/*
 * refimpl C kernels: public declarations.
 *
 * Conventions (stated here, the one place): outputs first, then const inputs, then scalar parameters and
 * sizes; every array is a packed C-contiguous buffer of the stated shape; no kernel allocates memory,
 * touches Python or keeps state; every kernel returns an int status (REFIMPL_OK = 0, nonzero = the
 * arguments were refused and nothing was written).  The Python side (refimpl/backends/_c.py) validates
 * dtype, shape, contiguity and alignment before every call; the status checks here are a second line of
 * defence, not the validation.
 *
 * build_ext.py hands the declarations between the two CFFI-CDEF markers below to cffi's cdef() (with
 * the preprocessor lines dropped), so this header is the single source of the C signatures.  Keep that
 * block free of macros.
 */
#ifndef REFIMPL_KERNELS_H
#define REFIMPL_KERNELS_H

#include <stdint.h>

#define REFIMPL_OK 0
#define REFIMPL_ERR_SIZE 1     /* a size (B, C, H, W, KH, KW, OH, OW) is < 1 */
#define REFIMPL_ERR_STRIDE 2   /* a stride is < 1 */
#define REFIMPL_ERR_PADDING 3  /* a padding is < 0 */
#define REFIMPL_ERR_OVERFLOW 4 /* an element count or index does not fit in ptrdiff_t */
#define REFIMPL_ERR_NULL 5     /* a required buffer pointer is NULL */
#define REFIMPL_ERR_OPTION 6   /* an option is out of range (feature map, eps policy, the focused map's power) */
#define REFIMPL_ERR_WORKSPACE 7 /* the workspace is smaller than the kernel's *_workspace() size */

/* Feature maps of the fused linear attention (ckernels/linattn.c). */
#define REFIMPL_LA_MAP_RELU 0  /* max(x, 0) */
#define REFIMPL_LA_MAP_ELU1 1  /* ELU(x) + 1 = x + 1 (x > 0), exp(x) (x <= 0) */
#define REFIMPL_LA_MAP_FOCUSED 2 /* FLatten's phi_p(x) = f_p(ReLU(x)) per row, focusing factor `power` */

/* Instruction-set levels of the kernels' inner loops (x86-64; elsewhere only BASE exists). */
#define REFIMPL_ISA_BASE 0     /* SSE2 on x86-64: 16-byte vectors */
#define REFIMPL_ISA_AVX2 1     /* x86-64-v3: 32-byte vectors */
#define REFIMPL_ISA_AVX512 2   /* x86-64-v4: 64-byte vectors */

/* Threaded kernels take nthreads (>= 1): the speed changes with it, never a bit (ckernels/parallel.h).
 * refimpl_parallel_selftest (ckernels/parallel.c) is not a kernel: it checks that runtime's contract for
 * tests/test_kernels_parallel.py. */
/* CFFI-CDEF-BEGIN */
int refimpl_dwconv2d_f64(double *out, const double *x, const double *weight, const double *bias,
                         int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                         int64_t B, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                         int64_t OH, int64_t OW);
int refimpl_dwconv2d_f32(float *out, const float *x, const float *weight, const float *bias,
                         int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                         int64_t B, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                         int64_t OH, int64_t OW);
struct refimpl_la_options {
    int feature_map;     /* REFIMPL_LA_MAP_RELU, _ELU1 or _FOCUSED */
    int eps_policy;      /* 0: den + eps (skipped when eps == 0), 1: max(den, eps) */
    int clamp;           /* nonzero: den -> max(den, clamp_min) first (L2ViT Appendix 8) */
    int v_scale_divide;  /* with a v_scale: v / s (nonzero) or v * s (0) */
    double power;        /* REFIMPL_LA_MAP_FOCUSED: the focusing factor p (finite, >= 1); else ignored */
    double clamp_min;
    double eps;
    double kv_scale;     /* s multiplies KV and the key sum after the sum (1: none; RALA's 1/N) */
};
int refimpl_linear_attention_f64(double *out, double *workspace, const double *q, const double *k,
                                 const double *v, const double *key_weight, const double *v_scale,
                                 const struct refimpl_la_options *options, int64_t BH, int64_t N, int64_t M,
                                 int64_t d, int64_t e, int64_t workspace_len, int64_t nthreads);
int refimpl_linear_attention_f32(float *out, float *workspace, const float *q, const float *k,
                                 const float *v, const float *key_weight, const float *v_scale,
                                 const struct refimpl_la_options *options, int64_t BH, int64_t N, int64_t M,
                                 int64_t d, int64_t e, int64_t workspace_len, int64_t nthreads);
int refimpl_linear_angular_f64(double *out, double *workspace, const double *q, const double *k,
                               const double *v, double unit_eps, int constant_own, int similarity_sum,
                               int64_t BH, int64_t N, int64_t M, int64_t d, int64_t e, int64_t workspace_len,
                               int64_t nthreads);
int refimpl_linear_angular_f32(float *out, float *workspace, const float *q, const float *k,
                               const float *v, double unit_eps, int constant_own, int similarity_sum,
                               int64_t BH, int64_t N, int64_t M, int64_t d, int64_t e, int64_t workspace_len,
                               int64_t nthreads);
int refimpl_window_attention_f64(double *out, double *workspace, const double *q, const double *k,
                                 const double *v, const double *bias, const unsigned char *mask, double scale,
                                 int64_t BH, int64_t H, int64_t N, int64_t M, int64_t d, int64_t e,
                                 int64_t bias_count, int64_t mask_count, int64_t workspace_len, int64_t nthreads);
int refimpl_window_attention_f32(float *out, float *workspace, const float *q, const float *k,
                                 const float *v, const float *bias, const unsigned char *mask, double scale,
                                 int64_t BH, int64_t H, int64_t N, int64_t M, int64_t d, int64_t e,
                                 int64_t bias_count, int64_t mask_count, int64_t workspace_len, int64_t nthreads);
int refimpl_elu1_feature_map_f64(double *out, const double *x, int64_t n);
int refimpl_elu1_feature_map_f32(float *out, const float *x, int64_t n);
int refimpl_focused_feature_map_f64(double *out, const double *x, int64_t rows, int64_t d, double power);
int refimpl_focused_feature_map_f32(float *out, const float *x, int64_t rows, int64_t d, double power);
int refimpl_rala_alpha_f64(double *alpha, double *workspace, const double *q, const double *k, int feature_map,
                           int kappa_q, double scale, int64_t BH, int64_t N, int64_t M, int64_t d,
                           int64_t workspace_len, int64_t nthreads);
int refimpl_rala_alpha_f32(float *alpha, float *workspace, const float *q, const float *k, int feature_map,
                           int kappa_q, double scale, int64_t BH, int64_t N, int64_t M, int64_t d,
                           int64_t workspace_len, int64_t nthreads);
int64_t refimpl_rala_alpha_workspace(int64_t BH, int64_t N, int64_t M, int64_t d, int64_t nthreads);
int64_t refimpl_window_attention_workspace(int64_t N, int64_t M, int64_t d, int64_t nthreads);
int64_t refimpl_linear_attention_workspace(int64_t BH, int64_t M, int64_t d, int64_t e, int64_t nthreads);
int64_t refimpl_linear_attention_chunks(int64_t M);
const char *refimpl_status_string(int status);
int refimpl_isa_supported(void);
int refimpl_isa_in_use(void);
int refimpl_set_max_isa(int level);
int refimpl_gelu_f64(double *out, const double *x, int64_t n, int approximate, int64_t nthreads);
int refimpl_erf_f64(double *out, const double *x, int64_t n, int impl);
int refimpl_layer_norm_f64(double *out, int64_t *flagged, const double *x, const double *weight,
                           const double *bias, int64_t rows, int64_t n, double eps, int64_t nthreads);
int refimpl_layer_norm_plain_f64(double *out, const double *x, const double *weight, const double *bias,
                                 int64_t rows, int64_t n, double eps);
int refimpl_l2_normalize_f64(double *out, const double *x, int64_t rows, int64_t d, double eps, int policy,
                             int64_t nthreads);
int refimpl_l2_normalize_plain_f64(double *out, const double *x, int64_t rows, int64_t d, double eps, int policy);
int refimpl_range_scan_f64(double *stats, const double *x, int64_t n);
int refimpl_range_scan_plain_f64(double *stats, const double *x, int64_t n);
int refimpl_parallel_selftest(int64_t *runs, int64_t runs_len, const int64_t *items, int64_t nphases,
                              int64_t nthreads, int64_t fail_mask, int64_t *report);
/* The plain versions (ckernels/linattn_plain.c with the two feature maps, rala_plain.c, winattn_plain.c,
 * dwconv2d_plain.c): straight scalar loops, one thread, libm; the specification of the fast kernels above,
 * checked by tests/test_kernels_plain.py (not registered as backends). */
int refimpl_linear_attention_plain_f64(double *out, double *workspace, const double *q, const double *k,
                                       const double *v, const double *key_weight, const double *v_scale,
                                       const struct refimpl_la_options *options, int64_t BH, int64_t N,
                                       int64_t M, int64_t d, int64_t e, int64_t workspace_len);
int refimpl_linear_attention_plain_f32(float *out, float *workspace, const float *q, const float *k,
                                       const float *v, const float *key_weight, const float *v_scale,
                                       const struct refimpl_la_options *options, int64_t BH, int64_t N,
                                       int64_t M, int64_t d, int64_t e, int64_t workspace_len);
int64_t refimpl_linear_attention_plain_workspace(int64_t d, int64_t e);
int refimpl_linear_angular_plain_f64(double *out, double *workspace, const double *q, const double *k,
                                     const double *v, double unit_eps, int constant_own, int similarity_sum,
                                     int64_t BH, int64_t N, int64_t M, int64_t d, int64_t e, int64_t workspace_len);
int refimpl_linear_angular_plain_f32(float *out, float *workspace, const float *q, const float *k,
                                     const float *v, double unit_eps, int constant_own, int similarity_sum,
                                     int64_t BH, int64_t N, int64_t M, int64_t d, int64_t e, int64_t workspace_len);
int64_t refimpl_linear_angular_plain_workspace(int64_t d, int64_t e);
int refimpl_rala_alpha_plain_f64(double *alpha, double *workspace, const double *q, const double *k,
                                 int feature_map, int kappa_q, double scale, int64_t BH, int64_t N, int64_t M,
                                 int64_t d, int64_t workspace_len);
int refimpl_rala_alpha_plain_f32(float *alpha, float *workspace, const float *q, const float *k,
                                 int feature_map, int kappa_q, double scale, int64_t BH, int64_t N, int64_t M,
                                 int64_t d, int64_t workspace_len);
int64_t refimpl_rala_alpha_plain_workspace(int64_t d);
int refimpl_window_attention_plain_f64(double *out, double *workspace, const double *q, const double *k,
                                       const double *v, const double *bias, const unsigned char *mask,
                                       double scale, int64_t BH, int64_t H, int64_t N, int64_t M, int64_t d,
                                       int64_t e, int64_t bias_count, int64_t mask_count, int64_t workspace_len);
int refimpl_window_attention_plain_f32(float *out, float *workspace, const float *q, const float *k,
                                       const float *v, const float *bias, const unsigned char *mask,
                                       double scale, int64_t BH, int64_t H, int64_t N, int64_t M, int64_t d,
                                       int64_t e, int64_t bias_count, int64_t mask_count, int64_t workspace_len);
int64_t refimpl_window_attention_plain_workspace(int64_t M);
int refimpl_elu1_feature_map_plain_f64(double *out, const double *x, int64_t n);
int refimpl_elu1_feature_map_plain_f32(float *out, const float *x, int64_t n);
int refimpl_focused_feature_map_plain_f64(double *out, const double *x, int64_t rows, int64_t d, double power);
int refimpl_focused_feature_map_plain_f32(float *out, const float *x, int64_t rows, int64_t d, double power);
/* ckernels/dwconv2d_plain.c: the plain depthwise conv2d, the specification of refimpl_dwconv2d above. */
int refimpl_dwconv2d_plain_f64(double *out, const double *x, const double *weight, const double *bias,
                               int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                               int64_t B, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                               int64_t OH, int64_t OW);
int refimpl_dwconv2d_plain_f32(float *out, const float *x, const float *weight, const float *bias,
                               int64_t stride_h, int64_t stride_w, int64_t pad_top, int64_t pad_left,
                               int64_t B, int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW,
                               int64_t OH, int64_t OW);
/* ckernels/lisa.c: LiSA's spectral product and contraction (the C parts of "lisa_fft_core"); lisa_plain.c: their
 * plain versions. */
int refimpl_lisa_spectral_f64(double *out, const double *xf, const double *kf, int64_t M, int64_t C, int64_t D,
                              int64_t F, int shared, int64_t nthreads);
int refimpl_lisa_contract_f64(double *st, double *yt, const double *qt, const double *ga, const double *gb,
                              const double *ba, const double *bb, int64_t M, int64_t N, int64_t C, int64_t D,
                              int64_t nthreads);
int refimpl_lisa_spectral_plain_f64(double *out, const double *xf, const double *kf, int64_t M, int64_t C,
                                    int64_t D, int64_t F, int shared);
int refimpl_lisa_contract_plain_f64(double *st, double *yt, const double *qt, const double *ga, const double *gb,
                                    const double *ba, const double *bb, int64_t M, int64_t N, int64_t C, int64_t D);
/* CFFI-CDEF-END */

#endif /* REFIMPL_KERNELS_H */
