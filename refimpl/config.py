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

#: The tested code may be at most this many times less accurate than a naive same-precision NumPy
#: computation of the same operation (max error over the output, see numerics.compare).
NAIVE_ERROR_RATIO_MAX = 2.0

#: Pure ULP floor of the naive-ratio check, in ulps of max|reference| in the tested dtype: when the naive
#: computation happens to be exact, the tested code is still allowed this many ulps of its own.
NAIVE_ULP_FLOOR = 1

# ---------------------------------------------------------------------------------------------------
# Memory guards
# ---------------------------------------------------------------------------------------------------

#: Largest number of float64 elements an explicitly quadratic (N x N per head) path may allocate
#: before it refuses with an error that points to the linear/FFT path.  2**27 elements = 1 GiB.
QUADRATIC_MAX_ELEMENTS = 2**27

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

#: Smallest positive subnormal values (float16 2^-24, bfloat16 2^-133, float32 2^-149).
FORMAT_MIN_SUBNORMAL = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149}

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

#: Float16 / bfloat16 limits used by the precision audit of docs/flatten.md (IEEE 754 binary16: largest
#: finite 65504, smallest normal 2^-14, smallest subnormal 2^-24; bfloat16: 3.3895e38, 2^-126, 2^-133).
FLOAT16_MAX = 65504.0
FLOAT16_TINY = 2.0 ** -14
FLOAT16_SUBNORMAL_MIN = 2.0 ** -24
BFLOAT16_MAX = 3.3895313892515355e38

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
#: released code's default is 3.
RALA_PAPER_MLP_RATIO = 4.0
RALA_OFFICIAL_MLP_RATIO = 3.0

#: Accuracy of the float64 RoPE angle table in units of u_64: omega = base ** (-t) costs
#: ELEMENTARY_FUNCTION_ULPS ulps plus ln(base) ~ 9.2 u from the rounding of t; the product p * omega,
#: cos/sin (ELEMENTARY_FUNCTION_ULPS each) and the rounding of t add 3 more.  Used as gamma_k(u_64)
#: (1 + |theta|) for the table entries in the error bound (twins compute the table in float64, then
#: round it once to the tested dtype).  Not rigorous beyond the libm accuracy assumption.
RALA_ROPE_TABLE_ULPS = 2 * ELEMENTARY_FUNCTION_ULPS + 13

# --- Castling-ViT (attention/angular.py) -----------------------------------------------------------

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

# --- LiSA (toeplitz.py, attention/lisa.py) ---------------------------------------------------------

# --- kernels and backends (backends/, ckernels/) ---------------------------------------------------

#: Alignment in bytes of output and workspace buffers handed to C and Numba kernels (one cache line;
#: also the AVX-512 vector width).
KERNEL_BUFFER_ALIGNMENT = 64
