"""Every numerical constant of refimpl, in one place.

Nothing in a kernel, a reference function or a test hard-codes a number that a reader might want to
change or question: it is named here, with the reason for its value.  Sections are grouped by the
module that uses them; each family of attention owns one section.
"""

from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------------------------------------------
# dtype policy (numerics.py)
# ---------------------------------------------------------------------------------------------------

#: The working precision of the reference.  Inputs of lower real floating precision are promoted to it.
DEFAULT_DTYPE = np.float64

#: Real floating dtypes accepted as inputs (promoted to the working precision, never downcast).
ACCEPTED_FLOAT_DTYPES = (np.float16, np.float32, np.float64)

# ---------------------------------------------------------------------------------------------------
# Stable primitives (numerics.py)
# ---------------------------------------------------------------------------------------------------

#: torch.nn.functional.softplus returns x itself above this (beta*x) threshold.  The reference's default
#: softplus uses the overflow-free identity softplus(x) = max(x, 0) + log1p(exp(-|x|)) with no switch;
#: the threshold is used only when a preset mirrors PyTorch's switch explicitly.
SOFTPLUS_TORCH_THRESHOLD = 20.0

#: Default eps of L2 normalisation x / max(||x||, eps) (torch.nn.functional.normalize's default).
L2_NORMALIZE_EPS = 1e-12

#: Default eps of LayerNorm / BatchNorm (PyTorch defaults; timm ViTs use 1e-6, passed explicitly).
LAYER_NORM_EPS = 1e-5
BATCH_NORM_EPS = 1e-5

#: GELU tanh approximation constant sqrt(2/pi) and cubic coefficient (Hendrycks & Gimpel, 2016).
GELU_TANH_COEF = 0.044715
#: Abramowitz & Stegun, Handbook of Mathematical Functions, 7.1.26: erf(x) = 1 - (a1 t + ... + a5 t^5) exp(-x^2),
#: t = 1 / (1 + p x), x >= 0, absolute error <= 1.5e-7.  The "libm" ensemble variant's erf below float64
#: (refimpl.ensemble): the approximation PyTorch's vectorized CPU GELU uses.
ERF_AS_P = 0.3275911
ERF_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)

#: sup |GELU'(x)| = 1 + 2 phi(sqrt 2) ... = 1.12837... attained at x = sqrt(2); rounded up.  Used to carry
#: an input error through GELU in composite bounds (an error e in x moves GELU(x) by at most L e).
GELU_LIPSCHITZ = 1.13

# ---------------------------------------------------------------------------------------------------
# Error model (numerics.py)
# ---------------------------------------------------------------------------------------------------

#: Accuracy assumed for library elementary functions (exp, log, erf, tanh, pow, sqrt is exact-rounded),
#: in units of the unit roundoff u.  glibc's libm documents at most 1-2 ulp for exp/log/erf/tanh/pow in
#: double and float (glibc manual, "Errors in Math Functions"); CUDA's libdevice documents <= 2 ulp for
#: expf/logf/tanhf/erff (CUDA C Programming Guide, Appendix "Mathematical Functions").  One ulp is at most
#: 2u, so 2 ulp <= 4u.  NOT rigorous for every platform: it is the documented figure of the two
#: libraries we run on.
ELEMENTARY_FUNCTION_ULPS = 4

#: The accumulation format the error model assumes for tested code in a given precision T (refimpl.verdict,
#: "Mixed precision").  Sums of float16/bfloat16 data (inner products, convolutions, reductions, the statistics
#: of a normalisation) are accumulated in float32 and each operation's result is rounded to T once.  That is
#: what torch does on CPU (its Half/BFloat16 GEMM, convolution, reduction, layer_norm and softmax kernels
#: accumulate in float) and on CUDA with the default math modes, provided
#: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction and
#: allow_bf16_reduced_precision_reduction are False (their defaults allow cuBLAS split-K partial sums in T;
#: equivalence/conftest.py turns them off).  Code that accumulates in T itself (NumPy's float16 matmul does)
#: is outside this model: its error can exceed the bound, and the verdict then says "diverges", naming the
#: assumption.  Formats not listed accumulate in themselves.
ACCUMULATION_FORMAT = {"float16": "float32", "bfloat16": "float32"}

#: The verdict's false-alarm budget: the probability that a comparison of a correct computation says
#: "diverges" because a rounding error fell outside the probabilistic bound (Higham & Mary 2019), union over
#: every element and rounding factor of the comparison (refimpl.verdict, "lam").  A caller comparing several
#: stages splits it between them.
VERDICT_FALSE_ALARM = 1e-6

#: The ensemble criterion (refimpl.verdict): the tested output's largest error (in units of each element's
#: magnitude) may be at most this many times the largest of the legitimate evaluations', and its RMS error at
#: most VERDICT_RMS_FACTOR times theirs.  Calibration (docs/verdict.md): leave one legitimate algorithm out,
#: take the ratio of its statistic to the maximum over the rest, over every unit of every registered network
#: (float32, reduced models: 1.98 for the maximum, 1.70 for the RMS, both with the reversed order held out) and
#: every attention module at real size (benchmarks/verdict.py); the factor is twice the largest ratio, rounded
#: up to a half-integer.  Recursive (left-to-right) summation, the least accurate of the standard orders, is
#: always a member and is not held out: against the other members alone it is 6.4x (maximum) and 7.2x (RMS)
#: worse, which is what the ensemble contains it for.
VERDICT_MAX_FACTOR = 4.0
VERDICT_RMS_FACTOR = 3.5

#: The largest leave-one-out RMS ratio of the calibration above (the factor is twice it).
VERDICT_RMS_CALIBRATED_RATIO = 1.70

#: The RMS criterion needs enough elements to be a stable statistic: the mean square of n independent errors
#: of one legitimate algorithm is a scaled chi-square with n degrees of freedom, and two such algorithms of
#: equal accuracy reach the ratio (VERDICT_RMS_FACTOR / VERDICT_RMS_CALIBRATED_RATIO)^2 of mean squares with the
#: probability of an F(n, n) tail.  48 is the smallest n for which that is below VERDICT_FALSE_ALARM (8.6e-7;
#: checked in tests/test_verdict.py).  Smaller outputs are judged by the bound and the maximum criterion.
VERDICT_RMS_MIN_ELEMENTS = 48

#: refimpl.ensemble: the block length of the "blocked" summation order (a typical GEMM micro-kernel depth),
#: and the largest products tensor one re-evaluated contraction forms at a time (elements; 2^24 float32 =
#: 64 MiB).
ENSEMBLE_BLOCK = 32
ENSEMBLE_CHUNK_ELEMENTS = 2**24

# ---------------------------------------------------------------------------------------------------
# Memory guards
# ---------------------------------------------------------------------------------------------------

#: Largest number of float64 elements an explicitly quadratic (N x N per head) path may allocate
#: before it refuses with an error that points to the linear/FFT path.  2**27 elements = 1 GiB.
QUADRATIC_MAX_ELEMENTS = 2**27

# ---------------------------------------------------------------------------------------------------
# Range safety (numerics.pow2_exponent)
# ---------------------------------------------------------------------------------------------------

#: An operand group of a scale-invariant computation (a row of phi(Q), one head's keys, one value column,
#: ...) whose largest magnitude is at most 2^B, B = RANGE_RESCALE_EXPONENT, is used as given; above that it is
#: multiplied by the exact power of two that brings its largest magnitude into [1/2, 1)
#: (numerics.pow2_exponent; below 2^-B, tiny and subnormal groups are scaled up the same way where the
#: caller asks, ``scale_up``: linear attention and RALA's core).  Derivation of B = 256: below 2^B a
#: product of three operands (the linear-attention numerator phi(Q) phi(K)^T V) is at most 2^768 and a sum of
#: fewer than 2^255 of them stays below 2^1023, so nothing overflows: the computation is the unscaled one, bit
#: for bit.  Only float64 holds magnitudes above 2^256 (float32 ends at 2^128), so the lower-precision runs of
#: numerics.precision (the verdict's naive member, which must overflow as the format does) never rescale.
RANGE_RESCALE_EXPONENT = 256

#: refimpl.attention.angular: the most terms of the arcsin series (Castling-ViT Eq. 8) one call sums.  Terms
#: beyond the point where the tail bound makes them negligible in float64 are never summed (arcsin_series), so
#: a larger ``order`` is refused only where |x| is so close to 1 that more than this many terms matter.  A work
#: bound, not a numerical constant: 2048 terms take about 0.6 s (exact coefficients, then Horner); at |x| = 1
#: the tail after K terms is still >= 1/sqrt(pi (K + 3/2)) (about 0.012 at K = 2048), so no order a computer
#: can sum reaches float64 accuracy there anyway.
ARCSIN_SERIES_MAX_TERMS = 2048

# ---------------------------------------------------------------------------------------------------
# Analyses (analysis.py)
# ---------------------------------------------------------------------------------------------------

#: Numerical rank threshold: singular values s_i > RANK_RTOL_FACTOR * max(m, n) * eps_T * s_max count,
#: the convention of numpy.linalg.matrix_rank and LAPACK (Golub & Van Loan, 5.4.1).  The factor 1 is
#: numpy's; it is a parameter so that analyses can state a coarser threshold explicitly.
RANK_RTOL_FACTOR = 1.0

#: Largest finite values of the low-precision formats audited by analysis.precision_audit
#: (IEEE 754 binary16: (2 - 2^-10) 2^15; bfloat16: (2 - 2^-7) 2^127; binary32: (2 - 2^-23) 2^127).
#: Under round-to-nearest a value overflows to inf once |x| >= max + ulp(max)/2 = 2^emax (2 - u).
FORMAT_MAX_FINITE = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38}

#: Largest exponent emax of each format (the overflow threshold is 2^emax (2 - u)).
FORMAT_EMAX = {"float16": 15, "bfloat16": 127, "float32": 127}

#: Smallest positive normal values (2^emin): below them a format keeps fewer significant bits (gradual
#: underflow); below half the smallest subnormal a value rounds to 0 and loses all information.
FORMAT_MIN_NORMAL = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126}

#: Smallest positive subnormal values (float16 2^-24, bfloat16 2^-133, float32 2^-149, float64 2^-1074).
#: Gradual-underflow terms of error bounds are formed as (count * this) / 2 rather than count * (this / 2):
#: half the float64 subnormal, 2^-1075, is not representable and would round to 0.
FORMAT_MIN_SUBNORMAL = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149,
                        "float64": 2.0 ** -1074}

#: The formats the precision audit checks by default (mixed-precision training: autocast to float16 or
#: bfloat16).
AUDIT_FORMATS = ("float16", "bfloat16")

# ---------------------------------------------------------------------------------------------------
# Swin windows (layers.py)
# ---------------------------------------------------------------------------------------------------

#: Additive value that masked-out logits receive in Swin's shifted-window attention (the Swin paper's
#: released convention is -100, which underflows exp to 0 in float32 after max-subtraction only when
#: the remaining logits are within ~100 of each other; we use -inf semantics by default and keep -100
#: as the "official" value).
SWIN_MASK_VALUE_OFFICIAL = -100.0

# ---------------------------------------------------------------------------------------------------
# Family sections: each attention family adds its own constants below its own header.
# Edit only your family's section.
# ---------------------------------------------------------------------------------------------------

# --- linear attention (attention/linear.py) --------------------------------------------------------

#: Default negative slope of the "leaky_relu" feature map (torch.nn.functional.leaky_relu's default).
#: L2ViT Table 1 compares ReLU with LeakyReLU; the paper does not state the slope it used.
LINEAR_LEAKY_RELU_SLOPE = 0.01

#: eps of the "l1" feature map phi(x) = b(x) / max(||b(x)||_1, eps): the clamp policy and value of
#: torch.nn.functional.normalize(p=1) (whose default eps is 1e-12), so that an all-zero row (a dead ReLU
#: row) maps to 0 instead of 0/0.
LINEAR_L1_EPS = 1e-12

#: Default normaliser eps of generic linear attention: 0, i.e. the paper's Eq. (4) exactly.  A zero
#: normaliser (every feature dead) then gives 0/0 = NaN, honestly; presets pass their own eps/clamp.
LINEAR_DEFAULT_EPS = 0.0

# --- softmax / window attention (attention/softmax.py) ---------------------------------------------

#: Roundings of the exponent's argument assumed in a softmax implementation: s - max (one subtraction) and
#: possibly a multiplication by log2(e) inside exp2-based exps (GPU kernels).  Each turns a relative error
#: u of the argument t into a relative error |t| u of exp(t).  Heuristic (covers both implementations we
#: run; not a proof for every library).
SOFTMAX_EXP_ARG_ROUNDINGS = 2

# --- L2ViT (attention/enhanced.py) -----------------------------------------------------------------

#: Lower bound C_min of the clamped normaliser max(phi(Q_i) . sum_j phi(K_j), C_min) (L2ViT Appendix 8:
#: "we clamp the denominator of Eq. (4) into the range [1e2, +inf)"; Table 10 ablates 1e-6 ... 1e3 and
#: 1e2 is best).  The released code hard-codes the same 1e2.
L2VIT_C_MIN = 1e2

#: Kernel size of the two depthwise convolutions of the local concentration module (Table 13: "LCM
#: kernel 7x7"; Fig. 5 default).  3 is also accepted (any odd size is).
L2VIT_LCM_KERNEL = 7

#: Kernel size of the conditional positional encoding (Appendix 12: "CPE (kernel size 3x3)").
L2VIT_CPE_KERNEL = 3

#: Window size of the local window attention (Table 13: "win. sz. 7x7"; 12 when fine-tuning at 384).
L2VIT_WINDOW = 7
#: LWA window of L2ViT-B fine-tuned at 384 x 384 (Appendix 9: "we also apply 12 x 12 window size in LWA when
#: fine-tuning on ImageNet-1k with 384 x 384 input"; l2vit.BASE_384).
L2VIT_WINDOW_384 = 12

#: MLP expansion ratio of LGA and LWA blocks (Appendix 12: "MLP (expansion ratio of 4)").
L2VIT_MLP_RATIO = 4.0

# --- FLatten (attention/focused.py) ----------------------------------------------------------------

#: Focusing factor p of f_p (FLatten §5.6: "we choose p = 3 for all models"; Table 5 ablates 2..32).
FLATTEN_FOCUSING_FACTOR = 3.0

#: Kernel size of the DWC rank-restoration branch (Eq. 10-12).  The paper gives no size; 5 is the released
#: modules' default ``kernel_size=5``.
FLATTEN_DWC_KERNEL = 5

#: eps the released module adds to ReLU(q), ReLU(k) before the focused function (official preset only;
#: the paper's Eq. 6 has none).
FLATTEN_OFFICIAL_RELU_EPS = 1e-6

#: eps the released module adds to the mean-of-keys normaliser q . mean_j(k_j) (official preset only).
#: Since the released numerator is q (K^T V) / n, this equals q . sum_j k_j + n * 1e-6 in Eq. (4)'s terms.
FLATTEN_OFFICIAL_NORMALISER_EPS = 1e-6

#: Initial value of the released module's per-channel learnable scale s (features are divided by
#: softplus(s); softplus(0) = ln 2).
FLATTEN_OFFICIAL_SCALE_INIT = 0.0

#: Error model of 1-D linear resampling (the DWC input of PVT with sr > 1): an implementation computes the
#: source coordinate src = (i + 1/2) n_in / n_out - 1/2 in its own precision (PyTorch: opmath = float for
#: float32 input), i.e. the ratio n_in / n_out (1 rounding), the product (1), the two additions (2): at most
#: this many roundings of magnitude <= u (src + 1).  The interpolation weight lambda = src - floor(src)
#: inherits that absolute error.
FLATTEN_RESAMPLE_INDEX_ROUNDINGS = 4

# --- RALA (attention/rala.py) ----------------------------------------------------------------------

#: eps the released RALA code adds to the (mean-scaled) normaliser: 1 / (kappa(Q_i) mean_j(alpha_j
#: kappa(K_j))^T + 1e-6).  The paper's Eq. 2 has no eps (preset "paper": 0).
RALA_OFFICIAL_EPS = 1e-6

#: Base of the 2-D rotary position encoding of the released code: omega_p = base^(-p / (d/4 - 1)),
#: p = 0 .. d/4 - 1 (omega_0 = 1 when d/4 = 1), the RoFormer base.
RALA_ROPE_BASE = 10000.0

#: Kernel of the LePE depthwise conv on V in the released code (5 x 5, 'same' zero padding, with bias).
RALA_OFFICIAL_LEPE_KERNEL = 5

#: Kernel of the CPE depthwise conv of the RAVLT block (paper §3.2: "a simple 3x3 depth-wise
#: convolution with residual connection").
RALA_CPE_KERNEL = 3

#: LayerNorm eps of the released RAVLT block (channels-first LayerNorm with eps 1e-6).  The paper does
#: not state one; preset "paper" uses LAYER_NORM_EPS (PyTorch's default).
RALA_OFFICIAL_NORM_EPS = 1e-6

#: FFN hidden ratio: the paper does not state it (preset "paper" uses the classic Transformer's 4); the
#: released code's registered models (RAVLT-T/S/B/L) all use 3.5.
RALA_PAPER_MLP_RATIO = 4.0
RALA_OFFICIAL_MLP_RATIO = 3.5

#: Accuracy of the float64 RoPE angle table in units of u_64: omega = base ** (-t) costs
#: ELEMENTARY_FUNCTION_ULPS ulps plus ln(base) ~ 9.2 u from the rounding of t; the product p * omega,
#: cos/sin (ELEMENTARY_FUNCTION_ULPS each) and the rounding of t add 3 more.  Used as gamma_k(u_64)
#: (1 + |theta|) for the table entries in the error bound (twins compute the table in float64, then
#: round it once to the tested dtype).  Not rigorous beyond the libm accuracy assumption.
RALA_ROPE_TABLE_ULPS = 2 * ELEMENTARY_FUNCTION_ULPS + 13

# --- Castling-ViT (attention/angular*.py) ----------------------------------------------------------

#: Threshold eps of the auxiliary masked softmax branch, Mask_eps(x) = x if x > eps else 0 (Castling-ViT
#: Eq. 10; Sec. 3.2.2 "e.g. eps = 0.02 in image classification experiments"; the released code's value).
CASTLING_SPARSE_EPS = 0.02

#: Length k of the depthwise (k, 1) conv along the flattened token axis applied to V (the released code's
#: default ``res_kernel_size=9``; the paper gives no size for its DWConv).
CASTLING_CONV_KERNEL = 9

#: eps of the paper-mode L2 normalisation of q and k, x / max(||x||, eps) (torch.nn.functional.normalize's
#: clamp and default).  A zero row then maps to 0, i.e. q^.k^ = 0 and Sim = 1/2 (theta := pi/2, the value
#: Eq. 8 gives at a zero inner product), so the paper mode stays finite.  The official preset has no eps.
CASTLING_QK_NORM_EPS = 1e-12

#: Largest number of float64 elements the explicit tensor-power features of the truncated angular series
#: may allocate (rows x (1 + d + d^3 + ... + d^(2K+1))); 2**26 elements = 512 MiB.
CASTLING_MAX_FEATURE_ELEMENTS = 2**26

#: Precision of the mpmath oracle of the angular series tests (significant decimal digits of the result).
CASTLING_MPMATH_DPS = 50

#: Directions per half-circle of the deterministic random-hyperplane (sign) feature quadrature used to
#: realise the implicit angular feature map of Eq. 6-7: the separated fraction is within 1/M of theta/pi.
CASTLING_HYPERPLANE_DIRECTIONS = 4096

# --- LiSA (toeplitz.py, attention/lisa*.py) --------------------------------------------------------

#: FFT error model (toeplitz.py).  Higham (2002) Thm 24.2: a radix-2 Cooley-Tukey FFT of length n has
#: normwise relative error <= log2(n) eta / (1 - log2(n) eta), eta = mu + gamma_4 (sqrt 2 + mu), mu the
#: twiddle-factor error.  With mu <= u, eta <= (1 + 4 sqrt 2) u + O(u^2) < 7 u per butterfly stage; the same
#: figure bounds one stage of the componentwise (absolute-value) running error of a butterfly, whose
#: complex multiply-add costs u + sqrt(2) gamma_2 + mu < 5 u.  Roundings charged per FFT stage:
FFT_STAGE_ROUNDINGS = 7
#: Roundings of the element-wise spectral product X * W (complex multiply, Higham Lemma 3.5: sqrt(2) gamma_2).
FFT_PRODUCT_ROUNDINGS = 3
#: Roundings of the inverse transform's 1/n scaling (exact when n is a power of two) and the final store.
FFT_SCALE_ROUNDINGS = 2
#: Extra stages per transform: the real-input split/merge pass of rfft/irfft (pocketfft, cuFFT, MKL all
#: compute a length-n real FFT through a half-length complex FFT plus one twiddle pass).
FFT_REAL_SPLIT_STAGES = 1

#: Input tile side T of the tiled FFT convolution the bounds cover when asked (refimpl.bounds "fft": NNPACK's
#: ft8x8 and ft16x16, cuDNN's FFT_TILING 32 x 32; a bound for T covers every smaller power of two).
CONV_FFT_TILE = 32

#: PyTorch's CPU convolution takes NNPACK (Winograd, FFT tiles; refimpl.bounds.covering_conv_algorithms) only for
#: float32 inputs of batch >= 16 with oneDNN off (ATen's ConvParams::use_nnpack; measured on torch 2.13: batch 4
#: errs as a direct convolution, batch 16 as Winograd).
NNPACK_MIN_BATCH = 16

#: FFT counting convention (models/counting.py ``fft_macs``; the MAC tables state FFTs with it).  A
#: length-n complex FFT costs n/2 log2 n complex multiply-accumulates (radix-2 Cooley-Tukey: n/2 butterflies
#: per stage, one twiddle multiplication each, log2 n stages; Cooley & Tukey 1965; a multi-axis transform
#: by rows and columns gives the same n/2 log2 n with n the product of the lengths), the paper's
#: O(N log2 N) of LiSA Table 1 with this constant:
FFT_COMPLEX_MACS_PER_POINT_STAGE = 0.5
#: Real MACs of one complex multiply-accumulate z += x y: 4 real multiplications, each paired with an
#: addition (the convention of LiSANet's spectral products, models/lisanet.py ``macs``).
COMPLEX_MAC_REAL_MACS = 4
#: A real-input transform (rfft / irfft) counts this fraction of the complex one of the same length: a
#: length-n real FFT is a length-n/2 complex FFT plus one O(n) split pass (LiSA §4.2: "we can additionally
#: reduce the complexity by half via RFFT and inverse RFFT").  So a real transform = n log2 n real MACs.
FFT_REAL_INPUT_FACTOR = 0.5

#: Eps of the L2 normalisation of LiSA's queries and keys (Eq. 4 "L2-normalized"; x / max(||x||, eps),
#: torch.nn.functional.normalize's default).  The paper gives no value.
LISA_L2_EPS = 1e-12
#: LayerNorm eps of the LiSA block.  The paper does not state it; LiSANet-I-T follows DeiT / ViT
#: ([45], [1] in the paper), whose timm implementation uses 1e-6.
LISA_LN_EPS = 1e-6
#: Default number of latent channels D (paper §5.1: "The latent channel size D is set to 16 as default").
LISA_LATENT_DEFAULT = 16
#: MLP hidden width ratio of the LiSA block (DeiT/ViT convention; Tab. 7 gives only the width).
LISA_MLP_RATIO = 4.0
#: Standard deviation of the random weights used by tests and benchmarks (timm's trunc_normal_ std).
LISA_INIT_STD = 0.02
#: Accelerated LiSA core (refimpl.backends._numba.lisa_fft_core): bytes of spectra per block of channels
#: (block = this / (D * F * complex itemsize) channels, at least 1); the C one (refimpl.backends._c_lisa) takes
#: blocks of heads of about this many bytes of product spectra.  Large enough that the per-block
#: Python and scipy.fft call overhead is small (14x14: all 32 channels of a head in one block), small
#: enough to keep a block's spectra and its inverse transforms cache-resident at 56x56 and above.
LISA_FUSED_BLOCK_BYTES = 1 << 20
#: Accelerated LiSA core: below this much inverse-transform work per call (B h c D prod(L) elements,
#: the Ga half) it runs on one thread whatever ``threads`` says; at and above it, on up to one thread per
#: head (refimpl.backends._numba.lisa_threads).  Results never depend on the thread count (tested).
#: Measured crossover (2 threads against 1, h = 2, D = 16, float64, median of 31 interleaved calls):
#: 7x7 c = 8 (work 12544) 0.44 against 0.34 ms; 7x7 c = 16 (25088) 0.54 against 0.53 ms; 7x7 c = 32
#: (50176) 0.77 against 0.95 ms; 14x14 c = 32 (200704) 1.34 against 2.18 ms.  Starting and joining the
#: second thread costs about 0.1 ms.
LISA_PARALLEL_MIN_WORK = 1 << 15

# --- networks: L2ViT, RAVLT, LiSANet (models/l2vit.py, ravlt.py, lisanet.py, _netparts.py) ---------

#: Random test/benchmark initialisation of these networks (models._netparts.init_params_from_shapes, on
#: top of common.init_from_shapes and NET_INIT_STD_FC below): BatchNorm running variances U(low, high)
#: (positive, O(1)).  Not the papers' training initialisations.
NET_INIT_RUNNING_VAR_LOW = 0.5
NET_INIT_RUNNING_VAR_HIGH = 2.0

#: Lipschitz constant of Swish x sigmoid(x) (RAVLT's head): sup |d/dx| = 1.0998... (at x ~ 2.4), rounded
#: up.  Carries an input error through the activation in the running error bound.
SWISH_LIPSCHITZ = 1.1

#: Lipschitz constant of Hardswish x min(max(x + 3, 0), 6) / 6 (LeViT's activation, Castling-LeViT): the
#: derivative is 0 (x < -3), (2x + 3) / 6 (-3 < x < 3), 1 (x > 3), so sup |d/dx| = 9 / 6 = 1.5 (x -> 3).
HARDSWISH_LIPSCHITZ = 1.5

#: Width of the 1x1 projection before RAVLT's classifier (released code: ``projection=1024`` for every
#: model; the paper describes no head).
RAVLT_HEAD_PROJ_DIM = 1024

#: FFN expansion of the released RAVLT-T/S/B/L (``mlp_ratios=[3.5] * 4``); the paper gives none.
RAVLT_NET_MLP_RATIO = 3.5

#: LayerNorm eps of the LiSANet stems / final norm (the LiSA blocks use LISA_LN_EPS): the paper gives
#: none; DeiT/ViT and PVTv2 (whose embeddings LiSANet follows) use 1e-6.
LISANET_LN_EPS = 1e-6

# --- networks: FLatten-DeiT/Swin, Castling-DeiT (models/flatten.py, castling.py, common.py) ---------

#: LayerNorm eps of the DeiT skeleton (timm's VisionTransformer / DeiT: partial(nn.LayerNorm, eps=1e-6)).
DEIT_LN_EPS = 1e-6

#: LayerNorm eps of the Swin skeleton (Swin's and FLatten's released code: nn.LayerNorm's default 1e-5).
SWIN_LN_EPS = 1e-5

#: Patch sizes: DeiT 16 x 16 (Table 9 of FLatten: 14 x 14 tokens at 224), Swin 4 x 4 ("concat 4 x 4").
DEIT_PATCH = 16
SWIN_PATCH = 4

#: The resolution at which every paper reports its ImageNet counts and FLOPs (224 x 224); the full-size
#: tests and benchmarks run the networks there.
NET_PAPER_RESOLUTION = (224, 224)

#: MLP expansion ratio of the DeiT and Swin blocks (both papers' baselines).
NET_MLP_RATIO = 4.0

#: Softmax window size of Swin's stages (FLatten Table 14: "win 7 x 7" in stages 3-4).
SWIN_WINDOW = 7

#: Window of FLatten's focused stages of Swin (Table 14 "win 56 x 56"; the released cfgs' WINDOW_SIZE: 56,
#: clamped per stage to the grid by Swin's rule, so 28 x 28 in stage 2 at 224 x 224).
FLATTEN_SWIN_FOCUSED_WINDOW = 56
#: FLatten-Swin-B at 384 x 384 (FLatten Table 8's 384^2 row; flatten.SWIN_B_384): the released
#: cfgs/flatten_swin_b_384.yaml sets WINDOW_SIZE: 96 (the focused stages' window, = the stage-1 grid), and the
#: released flatten_swin.py gives the softmax stages window 12 when WINDOW_SIZE > 56 (Swin-B 384's window).
FLATTEN_SWIN_FOCUSED_WINDOW_384 = 96
SWIN_WINDOW_384 = 12

#: Random test/benchmark initialisation of these networks (models.common.init_from_shapes): every entry with
#: two or more axes (matrices, kernels, and also positional embeddings, the class token and relative-position
#: tables) N(0, 1/fan_in), fan_in = prod(shape[1:]); norm weights 1 + N(0, s^2); biases and other 1-D entries
#: N(0, s^2), s = NET_INIT_STD_FC; FLatten's learnable scale N(0, 0.5^2) (softplus of it in [0.3, 1.3]
#: mostly).  Not the papers' training initialisations.
NET_INIT_STD_FC = 0.1
FLATTEN_NET_SCALE_INIT_STD = 0.5

# --- networks: FLatten-PVT (models/flatten_pvt.py) --------------------------------------------------

#: LayerNorm eps of PVT v1's blocks and final norm (PVT's and FLatten's released factories:
#: ``norm_layer=partial(nn.LayerNorm, eps=1e-6)``).  The patch embeddings' LayerNorm and the attention's
#: spatial-reduction LayerNorm are plain ``nn.LayerNorm`` (LAYER_NORM_EPS, 1e-5).
PVT_LN_EPS = 1e-6

#: PVT v1's patch embeddings (Wang et al. 2021, §3.1; FLatten Tables 10-11): stage 1 a 4 x 4 stride-4
#: convolution (Tables 10-11: "stride=4, 64, LN"), stages 2-4 a 2 x 2 stride-2 convolution ("stride=2"),
#: each followed by a LayerNorm.
PVT_PATCH = 4
PVT_MERGE_PATCH = 2

#: PVT v2's convolutional feed-forward (Wang et al. 2022, "PVT v2", §3.3, Fig. 1b): a 3 x 3 depthwise
#: convolution (zero padding 1, with bias) between the MLP's first linear layer and its GELU.
PVT_V2_MLP_DWCONV_KERNEL = 3

# --- networks: FLatten-CSwin (models/flatten_cswin.py) ---------------------------------------------

#: CSwin's convolutional token embedding (Dong et al. 2022, §3.1: "a 7 x 7 convolution layer with stride 4",
#: after CvT); released flatten_cswin.py ``nn.Conv2d(in_chans, embed_dim, 7, 4, 2)`` (zero padding 2), then
#: LayerNorm.
CSWIN_STEM_KERNEL = 7
CSWIN_STEM_STRIDE = 4
CSWIN_STEM_PADDING = 2

#: CSwin's merging between stages (§3.1: "a convolution layer (3 x 3, stride 2)"); released ``Merge_Block``
#: ``nn.Conv2d(dim, dim_out, 3, 2, 1)`` then LayerNorm.
CSWIN_MERGE_KERNEL = 3

#: LePE (CSwin §3.3): a depthwise 3 x 3 convolution of V added to the attention output; released
#: ``get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)`` (with bias).
CSWIN_LEPE_KERNEL = 3

#: CSwin's stripe widths sw per stage at 224 x 224 (CSwin §3.2 / Table 1: 1, 2, 7, 7; the last stage attends
#: globally); released factories ``split_size=[1, 2, 7, 7]``.
CSWIN_SPLIT_SIZE = (1, 2, 7, 7)

# --- networks: Castling-MViTv2 (models/castling_mvitv2.py) -----------------------------------------

#: MViTv2's patch embedding (Li et al. 2022, MViTv2; released mvit ``PatchEmbed``, configs/MVITv2_*.yaml
#: ``PATCH_KERNEL: [7, 7]``, ``PATCH_STRIDE: [4, 4]``, ``PATCH_PADDING: [3, 3]``): a 7 x 7 stride-4 conv with bias.
MVITV2_PATCH_KERNEL = 7
MVITV2_PATCH_STRIDE = 4
MVITV2_PATCH_PADDING = 3

#: MViTv2's pooling kernel (configs ``POOL_KVQ_KERNEL: [3, 3]``): the depthwise query-pooling conv (padding 1) and
#: the skip path's max pooling (kernel stride + 1 = 3, padding 1) at the stride-2 blocks.
MVITV2_POOL_KERNEL = 3

#: LayerNorm eps of MViTv2 (released mvit_model.py ``norm_layer = partial(nn.LayerNorm, eps=1e-6)``), used by
#: the blocks, the query pooling's norm and the final norm.
MVITV2_LN_EPS = 1e-6

# --- kernels and backends (backends/, ckernels/) ---------------------------------------------------

#: Alignment in bytes of output and workspace buffers handed to C and Numba kernels (one cache line;
#: also the AVX-512 vector width).
KERNEL_BUFFER_ALIGNMENT = 64

#: Backend used when none was selected with refimpl.backends.use(): the NumPy reference, so that what a
#: reference function returns never depends on which optional accelerator happens to be installed.
#: The environment variable REFIMPL_BACKEND (numpy | numba | c | auto) overrides it at import time.
DEFAULT_BACKEND = "numpy"

#: Order "auto" tries when refimpl/backends/auto_table.json (written by benchmarks/run.py) has no entry
#: for an operation: the first available backend that has a kernel for it wins.
AUTO_FALLBACK_ORDER = ("c", "numba", "numpy")

#: Whether Numba kernels may be compiled with fastmath (reassociation, no NaN/Inf, approximate
#: division).  False: the kernels must compute the NumPy definition's operations in its order, and
#: NaN/Inf must propagate; fastmath would void both, and the error model's bounds with them.
NUMBA_FASTMATH = False

#: Threads a multi-threaded C kernel uses when the call does not say (``threads=``): the CPUs this
#: process may run on (os.sched_getaffinity), capped at this number.  The result does not depend on it
#: (fixed reduction order, ckernels/linattn.c); only the speed does.
C_KERNEL_THREADS_MAX = 2

#: The verify tool locates a reference stage with no submodule of its own (FLatten's features and attention) by
#: value: the foreign tensor that, in the best of its layouts (heads split or merged, axes permuted), is within
#: the stage's own bound (the last of those), else the closest to the teacher-forced reference
#: (refimpl.verify.locate.locate), provided its relative (Frobenius) distance is at most this.  A
#: locating threshold, not a tolerance: the located tensor is then judged by the verdict against the stage's
#: bound, and a stage with no tensor this close, where its inputs were located, is where the module diverges
#: (any correct evaluation is within a few hundred u_T of the reference: 2e-3 relative in bfloat16).
VERIFY_LOCATE_GATE = 0.05

#: Gradient verification (``refimpl verify --grad``, docs/verify.md "Gradients"): the factor F_bwd on the forward's
#: propagated relative bound in a gradient's bound.  Source: the backward of y = f(x) evaluates, for each forward
#: operation, its transpose (the same products summed over the other index) and the derivatives of its
#: nonlinearities at the forward's computed intermediates; to first order the gradient's error is therefore the
#: forward intermediates' own errors carried through the transposed Jacobians (at most the forward's relative
#: bound) plus the backward operations' roundings (the forward's operations transposed: at most the forward's
#: rounding depth again), i.e. at most twice the forward's running bound.  The last inner product of each
#: gradient (a weight gradient's sum over the batch and tokens) is bounded separately by gamma_n on the
#: magnitudes of its terms (refimpl.verify.gradients.GradientBound).
VERIFY_GRAD_BACKWARD_FACTOR = 2.0

#: The terminal summary of a network's units and their parts (``refimpl verify``, docs/verify.md "The report"):
#: up to this many rows (units and parts together) it lists them all; beyond, the ones that do not match and a
#: count of those that do.  A display choice, not a tolerance: the Markdown report (``--report``) and the JSON
#: list every unit and part.
VERIFY_SUMMARY_ROWS = 12

#: The bar height of a stage whose error over bound is 0 (or a matching stage with no number) in the report's
#: plot (``--report``'s error-over-bound chart, a log axis, which cannot draw 0).  A display choice, not a
#: tolerance: it is drawn only, never read by a verdict or written to the JSON report.
VERIFY_PLOT_RATIO_FLOOR = 1e-6
