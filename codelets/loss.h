/* Loss family (codelets/loss.c, CUDA in loss.cu; per-position arithmetic in loss_math.h):
 * cross-entropy, MSE, argmax hits and soft Dice. */
#ifndef TESSEL_CODELETS_LOSS_H
#define TESSEL_CODELETS_LOSS_H

#include <starpu.h>
#include <stdint.h>

#include "reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tsl_loss_kind {
    TSL_LOSS_CROSS_ENTROPY = 0,
    TSL_LOSS_MSE = 1,
    TSL_LOSS_HITS = 2, /* argmax hits: no loss, no gradient; the count goes into the acc */
    TSL_LOSS_L1 = 3,   /* |x - t| per element, gradient sign(x - t) scale */
} tsl_loss_kind;

/* Whether the kind takes a value per element against a target of x's shape (MSE, L1). */
#define TSL_LOSS_ELEMENTWISE(kind) ((kind) == TSL_LOSS_MSE || (kind) == TSL_LOSS_L1)

typedef struct tsl_loss_args {
    int32_t kind;
    int32_t dtype;         /* of x, target (MSE, L1) and gradient: f32 or f64 */
    int32_t label_dtype;   /* cross-entropy labels: i32, i64 or u8 */
    int32_t channels_last; /* logits stored N D H W C: a position's classes are adjacent */
    int64_t samples;       /* samples in the tile */
    int64_t classes;       /* C (cross-entropy); MSE, L1: elements per sample / inner */
    int64_t inner;         /* positions per sample and class (product of spatial extents) */
    double scale;          /* gradient factor: 1 / positions of the whole tensor */
    double smooth;         /* soft Dice: added to numerator and denominator */
} tsl_loss_args;

/* Add the tile's per-position losses to `acc` exactly (TSL_LOSS_HITS: 1 per position whose
 * first-maximum class is its label); write the gradient if grad != NULL.
 * Labels outside [0, C) count in acc->flagged, add no loss and get a zero gradient. */
void tsl_loss_tile(const tsl_loss_args *args, const void *x, const void *target, void *grad,
                   tsl_acc *acc);

/* The difference loss of two values, each whole in one tile, rows = samples: A (n x fa) and
 * B (n x fb) of dtype f32 or f64. */
typedef struct tsl_diff_args {
    int32_t dtype;
    int32_t pad;
    int64_t n, fa, fb;
} tsl_diff_args;

/* acc (initialised) += sum over (i, j) of Ga[i, j] Gb[i, j], Ga = A A^T and Gb = B B^T (kept in
 * gram: 2 n^2 doubles), each product added exactly: the squared Frobenius norm of A^T B. With da
 * and db, the gradients 2 Gb A and 2 Ga B. */
void tsl_difference_tile(const tsl_diff_args *d, const void *a, const void *b, double *gram,
                         tsl_acc *acc, void *da, void *db);

/* The similarity loss of two values of one shape, each whole in one tile, rows = samples: A and
 * B (n x f, args fa = fb = f), f32 or f64. acc (initialised) += sum over (i, j) of
 * k(a_i, a_j) + k(b_i, b_j) - 2 k(a_i, b_j), each term added exactly, k the Gaussian kernel mixture
 * of tsl_mmd_kernel(): n^2 times the biased estimate of MMD^2 (the caller divides). w (3 n^2
 * doubles) keeps the kernel's derivatives at the pairs (aa, bb, ab). With da and db, the
 * gradients of MMD^2 (tsl_mmd_grad()). */
void tsl_similarity_tile(const tsl_diff_args *d, const void *a, const void *b, double *w,
                         tsl_acc *acc, void *da, void *db);

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (loss.cu): the same arguments and buffers as the CPU
 * functions, launched on the worker's stream. */
void tsl_loss_cuda(void *buffers[], void *cl_arg);
void tsl_dice_stats_cuda(void *buffers[], void *cl_arg);
void tsl_dice_coef_cuda(void *buffers[], void *cl_arg);
void tsl_dice_grad_cuda(void *buffers[], void *cl_arg);
void tsl_difference_cuda(void *buffers[], void *cl_arg);
void tsl_similarity_cuda(void *buffers[], void *cl_arg);
#endif

extern struct starpu_codelet tsl_cl_loss;
/* R a, R b, W gram (2 n^2 f64), W acc, and W da, W db for the gradient */
extern struct starpu_codelet tsl_cl_difference;
/* R a, R b, W w (3 n^2 f64), W acc, and W da, W db for the gradient */
extern struct starpu_codelet tsl_cl_similarity;

/* Soft Dice, per class c over every sample and position: I_c = sum p g, P_c = sum p,
 * G_c = sum g, with p = softmax over classes and g = onehot(label). acc holds 3C
 * accumulators (I, P, G for each class in turn); bad labels count in acc[0].flagged. */
void tsl_dice_stats_tile(const tsl_loss_args *args, const void *x, const void *labels,
                         tsl_acc *acc);
/* From the totals: coef[c] = -2 / (C S_c), coef[C + c] = (2 I_c + smooth) / (C S_c^2) with
 * S_c = P_c + G_c + smooth, so that dloss/dp = coef[c] g + coef[C + c]. */
void tsl_dice_coef(const tsl_loss_args *args, const tsl_acc *acc, double *coef);
/* loss = 1 - mean over classes of (2 I_c + smooth) / S_c. */
double tsl_dice_loss(const tsl_loss_args *args, const tsl_acc *acc);
/* Gradient of the loss with respect to the logits, through the softmax. */
void tsl_dice_grad_tile(const tsl_loss_args *args, const void *x, const void *labels,
                        const double *coef, void *grad);

extern struct starpu_codelet tsl_cl_dice_stats; /* R x, R labels, W acc */
extern struct starpu_codelet tsl_cl_dice_coef;  /* R acc, W coef */
extern struct starpu_codelet tsl_cl_dice_grad;  /* R x, R labels, R coef, W grad */

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_LOSS_H */
