// The op tests' tolerance table (tests/unit/backend_ops_*_test.cpp): every bound a backend op is
// held to, derived from the op's arithmetic (fp32 roundings, accumulation depth, the documented
// accuracy of the math library), in one place. Each entry is a coefficient; the test multiplies
// it by a scale its float64 reference computes for that element (a norm of the summed terms, |y|,
// ...), so a bound never depends on the tensor's largest element. Ops that only move or select
// values (copies, embed, kv_write, split_qgate, add, scale, argmax, top-k, fill_random) have no
// entry: they are compared bit for bit.
//
// Accuracy facts used below: fp32 + - * / and sqrt are correctly rounded (error <= u |result|) on
// both backends (the CPU build has -ffp-contract=off, the CUDA kernels use __f*_rn / IEEE ops);
// expf, tanhf, cosf, sinf are within 2 ulp, log1pf within 1 ulp (glibc; CUDA programming guide,
// "Mathematical functions", single precision, no fast-math), i.e. a relative error <= 2 eps.
#pragma once
#include <cmath>
#include <cstdint>

namespace qf::test::tol {

constexpr double kU = 0x1p-24;    // fp32 unit roundoff (round to nearest)
constexpr double kEps = 0x1p-23;  // FLT_EPSILON = 2u = one ulp of 1.0
// The c of c * eps * sqrt(n) (see sum()).
constexpr double kC = 3.0;

// An fp32 sum of n terms t_i in any order (sequential, 16 lanes, warp trees, tensor-core chunks):
//   |error| <= sum(n) * scale,  scale = ||t||_2 for mean-zero terms (every dot product of the
//   tests: seeded mean-zero inputs), scale = sum |t_i| for positive terms (sums of squares,
//   softmax denominators).
// Why: fewer than n roundings, each <= u |partial sum| (<= 2u where a tensor core truncates its
// fp32 accumulator); partial sums of mean-zero terms stay O(||t||_2), of positive terms <= the
// total; the roundings add like a random walk, so the typical error is about u sqrt(n/2) scale
// for a sequential sum and less for trees. kC = 3 sets the bound at 6u sqrt(n) scale. For scale:
// the tensor-core GEMV that chained all MMAs of a row into one accumulator (rejected; 1.6e-5 of
// max|ref| on 248320x5120, docs/experiments/cuda_kernels.md) sits at about 13u sqrt(n) ||t||_2 and
// fails this bound; its per-64-column-chunk accumulators cut the chained error ~6x.
inline double sum(int64_t n) { return kC * kEps * std::sqrt(static_cast<double>(n)); }

// matmul, matmul_group, gemm (K = cols): one K-term dot per output, scale ||t||_2 with
// t_c = W[r,c] x[m,c] (gemm: bf16(x[m,c])). The reference uses the exact weight values (bf16,
// f16 are exact in float64; int4 is q*s + b exactly): a backend's int4 dequantisation rounds
// q*s + b once in fp32 (q*s is exact), a relative u per weight, which adds a random walk
// u ||t||_2, far inside the bound.
inline double matmul(int64_t K) { return sum(K); }

// matmul on int4 weights in a group-affine tensor-core form (CUDA gemv_tc_q4.cu: per group of G
// columns y += s * sum_c q_c x_c + b * sum_c x_c, each x split exactly enough into `pieces` bf16
// parts; pieces = 1 when x holds bf16 values already, as in gemm). Relative to the scale
// ||(|s q| + |b|) o x||_2 (>= every partial sum's terms), the sum of:
//  - the split's residual (pieces = 2): |x - x0 - x1| <= 2^-17 |x| per activation (2^-18 after two
//    roundings; 2^-17 leaves room), signs independent: a walk, kC 2^-17;
//  - the tensor-core sums of exact products (pieces * G / 16 MMAs per group, partial sums
//    truncated: 2u per rounding), pieces * K terms in all: 2 sum(pieces K);
//  - the token sums over G activations, the two roundings of each group's fold and the add over
//    groups and column slices: fewer than K + 2 K / G + 8 roundings, sum(K + 2 K / G + 8).
inline double matmul_int4_tc(int64_t K, int group, int pieces) {
  const double split = pieces == 2 ? kC * 0x1p-17 : 0.0;
  return split + 2 * sum(static_cast<int64_t>(pieces) * K) + sum(K + 2 * K / group + 8);
}

// rmsnorm, add_rmsnorm: y = x w / sqrt(sum x^2 / n + eps), relative to |y|. sum x^2 is a positive
// n-term sum (relative error sum(n)), halved by the square root; then / n, + eps, sqrt, 1 / ., * x,
// * w round once each (6u = 3 eps).
inline double rmsnorm(int n) { return 0.5 * sum(n) + 3 * kEps; }
// rmsnorm_gated: the above times silu(g) = g / (1 + expf(-g)): expf (2 eps, passed on at most
// 1:1 through 1 + e), the add, the division and one more product (u each): + 3.5 eps.
inline double rmsnorm_gated(int n) { return 0.5 * sum(n) + 7 * kEps; }

// sigmoid_mul, swiglu, softcap, relative to |y|: one transcendental (expf or tanhf, 2 eps; its
// error reaches y at most 1:1: d sigmoid / sigmoid = (1 - sigmoid) de / e, d tanh(z) / tanh(z)
// <= dz / z) and at most three correctly rounded operations (1 + e, the division, the product;
// softcap: y / cap, * cap): 2 eps + 3u = 3.5 eps.
constexpr double kActivation = 4 * kEps;

// rope: y = a cos - b sin and b cos + a sin, with the angle computed in fp32 exactly as the
// contract says (pos * inv_freq, inv_freq = 1 / powf(theta, 2i / rot)), which the reference
// repeats. cosf / sinf of that angle: 2 ulp of a value <= 1, <= eps absolute, times |a| or |b|;
// two products and the sum: u (|a| + |b|) each at most. Absolute, scale |a| + |b|: 2 eps.
constexpr double kRope = 3 * kEps;

// attention, per query row and head, in three steps (the reference computes each scale):
//  score s_j = scale (q . k_j): sum(hd) scale ||q o k_j||_2 + u |s_j| (the scale product);
//  p_j = expf(s_j - max): an error common to all scores (the max's) cancels in the normalised
//    output, so p_j's relative error is rho_j = score error + u |s_j - max| + 2 eps (expf);
//  out_d = sum_j p_j v_jd / sum_j p_j: 2 rho A_d (rho = max_j rho_j, A_d = sum_j p^_j |v_jd|, p^ the
//    normalised weights: the numerator's and the normaliser's share), sum(n) B_d for the value
//    sum (mean-zero v, B_d = ||p^ o v_d||_2), and (sum(n) + u) |out_d| for the positive
//    normaliser and the division. An online softmax rescales numerator and normaliser by the
//    same factor at each chunk, which cancels, and adds one rounding per chunk (< n).
inline double attention_score(int hd, double scale, double qk_l2, double s) {
  return sum(hd) * scale * qk_l2 + kU * std::fabs(s);
}
inline double attention_weight(double score_err, double s_minus_max) {
  return score_err + kU * std::fabs(s_minus_max) + 2 * kEps;
}
inline double attention_out(double rho, double A, double B, int n_keys, double out) {
  return 2 * rho * A + sum(n_keys) * B + (sum(n_keys) + kU) * std::fabs(out);
}

// Gated DeltaNet (docs/spec/qwen38.md 3.3), per row and value row i of a head; the reference
// passes the magnitudes of that row. A state row S_i (d_k long) is tracked in 2-norm: the update
// S_i <- g S_i (I - beta k k^T) + beta v_i k^T maps an error e to g e (I - beta k k^T), of 2-norm
// <= g ||e|| (0 < beta < 1, ||k|| = 1), so the bound is B <- g B + this row's new error
// (gdn_state_row), and the state is checked row by row in 2-norm against B.
//
// The conv + silu of one channel: <= K taps (2K u of sum |w x|, deterministic), silu 3.5 eps |u|.
inline double gdn_conv(int K, double conv_abs, double u) { return 2.0 * K * kU * conv_abs + 3.5 * kEps * std::fabs(u); }
// Relative error of the normalised q or k of a key head as a vector: the l2 norm (a positive
// d_k-term sum, halved by the square root) and <= 4 roundings, plus the conv errors of its d_k
// channels (their 2-norm over the raw vector's norm).
inline double gdn_qk(int dk, double conv_err_l2, double raw_norm) { return 0.5 * sum(dk) + 4 * kU + conv_err_l2 / raw_norm; }
struct GdnRowTerms {
  double gS_k_l2;   // ||g S_i o k||_2: the terms of r = (g S_i) . k
  double gS_l2;     // ||g S_i||_2 (before the update)
  double S_new_l2;  // ||S_i'||_2 (after)
  double r, v, delta, ln_g;
  double rho_k;   // gdn_qk of k
  double conv_v;  // gdn_conv of v_i
};
// A state row's new error this row (2-norm):
//   r, a d_k-term dot:                       sum(d_k) ||g S_i o k||
//   k off by rho_k (as a vector):            rho_k (||g S_i|| + 2 |r| + |v_i|)   (d S_i' / dk)
//   v_i off by its conv error:               conv_v
//   g = expf(-expf(A) softplus(a)): the argument's <= 4 roundings and the inner expf (2 eps) are
//     relative errors of ln g, the outer expf 2 eps: (2 + 4 |ln g|) eps ||S_i||
//   beta (sigmoid 3.5 eps), v - r and the product: 5 eps |delta|
//   the elementwise update (g S, delta k_j, the sum): 3u (||g S_i|| + ||S_i'|| + |delta|)
inline double gdn_state_row(int dk, const GdnRowTerms& t) {
  return sum(dk) * t.gS_k_l2 + t.rho_k * (t.gS_l2 + 2 * std::fabs(t.r) + std::fabs(t.v)) + t.conv_v +
         (2 + 4 * std::fabs(t.ln_g)) * kEps * t.gS_l2 + 5 * kEps * std::fabs(t.delta) +
         3 * kU * (t.gS_l2 + t.S_new_l2 + std::fabs(t.delta));
}
// y_i = S_i' . q with ||q||_2 = d_k^-1/2: the state row's error B / sqrt(d_k), the d_k-term dot
// sum(d_k) ||S_i' o q||, q off by rho_q (as a vector): rho_q ||S_i'|| / sqrt(d_k).
inline double gdn_y(int dk, double B, double Sq_l2, double S_new_l2, double rho_q) {
  return (B + rho_q * S_new_l2) / std::sqrt(static_cast<double>(dk)) + sum(dk) * Sq_l2;
}
// gdn_chunked, the chunk-parallel form (docs/spec/qwen38.md 3.4): per row, the pseudo-values V' =
// U - W S come from two triangular solves over up to C rows of the chunk and a d_k-term product,
// and y from a C-term sum and a d_k-term product: on top of the recurrence's errors, a state row
// gains (sum(C) + sum(d_k)) (||g S_i|| + |r| + |v_i|) and y_i gains sum(C) (||S_i'|| / sqrt(d_k) + |y_i|).
inline double gdn_chunked_state_extra(int dk, int C, const GdnRowTerms& t) {
  return (sum(C) + sum(dk)) * (t.gS_l2 + std::fabs(t.r) + std::fabs(t.v));
}
inline double gdn_chunked_y_extra(int dk, int C, double S_new_l2, double y) {
  return sum(C) * (S_new_l2 / std::sqrt(static_cast<double>(dk)) + std::fabs(y));
}

// dyn_conv: out = sum_{t < Kc} (base + D) x over at most Kc taps: per tap the coefficient sum and
// the product round (2u relative to |coef x|), then Kc - 1 additions (u of a partial sum <=
// sum |coef x|): a deterministic 3 Kc u relative to sum_t |coef_t x_t|.
inline double dyn_conv(int Kc) { return 3.0 * Kc * kU; }

// selector_walk scores: s = cand + sum_r (Epre[pred,r] P[r]) Esuc[id,r]; the R-term dot of
// mean-zero terms (sum(R) ||t||_2), the rounded product Epre P (u per term: u ||t||_2 as a walk,
// bounded here by u sum |t|) and the final add (u |s|).
inline double selector_score(int R, double t_l2, double t_l1, double s) {
  return sum(R) * t_l2 + kU * (t_l1 + std::fabs(s));
}

}  // namespace qf::test::tol
