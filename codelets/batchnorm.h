/* Batch normalization with exact statistics over all tiles (codelets/batchnorm_stats.c,
 * batchnorm_normalize.c; codelets in codelets/batchnorm.c; CUDA in codelets/batchnorm.cu).
 *
 * Per tile, per channel sums go into exact accumulators (an array of 2C tsl_acc: [2c] the
 * sum of x or dy, [2c + 1] the sum of x^2 or dy * x); a merge tree combines the tiles; a
 * finalize task turns the totals into per-channel values that the elementwise tasks read.
 * Every tile computes the same per-element terms whatever the tiling, and the sums are
 * exact, so statistics and results are identical for every tiling and rank count. The
 * backward's sum(dy * xhat) is invstd * (sum(dy x) - mean sum(dy)), from the two exact sums
 * rounded once each.
 *
 * With a fused ReLU (args relu = 1) the normalize task writes max(y, 0), and the backward
 * tasks use dy where y > 0, 0 elsewhere (ReLU's derivative at 0 is 0), without reading y:
 * from saved, gamma and beta they find the interval of x where the forward's own arithmetic
 * gives y > 0 (same bits), then compare x with its ends. */
#ifndef TESSEL_CODELETS_BATCHNORM_H
#define TESSEL_CODELETS_BATCHNORM_H

#include <starpu.h>
#include <stdint.h>

#include "reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsl_bn_args {
    int32_t dtype;       /* of x, y, dy, dx, gamma, beta, running stats: f32 or f64 */
    int64_t channels;    /* C of the whole tensor */
    int64_t samples;     /* tile extent along N */
    int64_t c0;          /* first channel of the tile */
    int64_t cext;        /* channels in the tile */
    int64_t inner;       /* spatial positions in the tile */
    int64_t per_channel; /* N x spatial positions of the whole tensor: the statistics' count */
    double eps;
    double momentum;
    int64_t acc_first; /* the accumulators hold channels acc_first .. acc_first + acc_count - 1 */
    int64_t acc_count; /* (2 acc_count sums): all C, or a channel tile range's (stats tasks) */
    int32_t which;     /* running statistic (0 mean, 1 variance) or parameter gradient (0 beta,
                          1 gamma) a task updates */
    int32_t relu;      /* 1: ReLU fused after the normalization (normalize, backward tasks) */
    int32_t channels_last; /* tiles stored N D H W C (positions, then channels) */
    int32_t unused;        /* no padding bytes */
} tsl_bn_args;

/* Per tile: accumulate sum x and sum x^2 per channel into acc[2 acc_count] (zeroed first;
 * channel c at acc[2 (c - acc_first)]). */
void tsl_bn_stats_tile(const tsl_bn_args *a, const void *x, tsl_acc *acc);
/* Totals -> saved (2C doubles: mean, then 1 / sqrt(var + eps)). */
void tsl_bn_finalize(const tsl_bn_args *a, const tsl_acc *acc, double *saved);
/* Totals -> running mean (which 0) or variance (which 1) updated with momentum; the
 * running variance takes the unbiased batch variance, as PyTorch. */
void tsl_bn_running(const tsl_bn_args *a, const tsl_acc *acc, void *running);
/* y = (x - mean) * (invstd * gamma) + beta on one tile; max(y, 0) when a->relu. */
void tsl_bn_normalize_tile(const tsl_bn_args *a, const void *x, const double *saved,
                           const void *gamma, const void *beta, void *y);
/* Inference: y = (x - running_mean) * (gamma / sqrt(running_var + eps)) + beta. */
void tsl_bn_infer_tile(const tsl_bn_args *a, const void *x, const void *running_mean,
                       const void *running_var, const void *gamma, const void *beta, void *y);
/* Backward partials: acc[2c] = sum dy, acc[2c + 1] = sum dy * x (c counted from acc_first, 2
 * acc_count sums). When a->relu, dy is masked
 * by y > 0, y recomputed from x, saved, gamma and beta (NULL otherwise). */
void tsl_bn_backward_stats_tile(const tsl_bn_args *a, const void *x, const void *dy,
                                const double *saved, const void *gamma, const void *beta,
                                tsl_acc *acc);
/* Totals and saved -> coef (2C doubles: the means of dy and of dy * xhat). */
void tsl_bn_backward_coef(const tsl_bn_args *a, const tsl_acc *acc, const double *saved,
                          double *coef);
/* Totals and saved -> dbeta (which 0: sum dy) or dgamma (which 1: sum dy * xhat), C values. */
void tsl_bn_param_grad(const tsl_bn_args *a, const tsl_acc *acc, const double *saved, void *grad);
/* dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)) on one tile, dy masked by
 * y > 0 when a->relu (y recomputed as in the stats; beta is read only then). */
void tsl_bn_backward_data_tile(const tsl_bn_args *a, const void *x, const void *dy,
                               const double *saved, const void *gamma, const void *beta,
                               const double *coef, void *dx);

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (batchnorm.cu): the same arguments, buffers and bits as the
 * CPU functions, launched on the worker's stream. */
void tsl_bn_stats_cuda(void *buffers[], void *cl_arg);
void tsl_bn_finalize_cuda(void *buffers[], void *cl_arg);
void tsl_bn_running_cuda(void *buffers[], void *cl_arg);
void tsl_bn_normalize_cuda(void *buffers[], void *cl_arg);
void tsl_bn_infer_cuda(void *buffers[], void *cl_arg);
void tsl_bn_bwd_stats_cuda(void *buffers[], void *cl_arg);
void tsl_bn_bwd_coef_cuda(void *buffers[], void *cl_arg);
void tsl_bn_param_grad_cuda(void *buffers[], void *cl_arg);
void tsl_bn_bwd_data_cuda(void *buffers[], void *cl_arg);
#endif

extern struct starpu_codelet tsl_cl_bn_stats;     /* R x, W acc */
extern struct starpu_codelet tsl_cl_bn_finalize;  /* R acc, W saved */
extern struct starpu_codelet tsl_cl_bn_running;   /* R acc, RW running statistic */
extern struct starpu_codelet tsl_cl_bn_normalize; /* R x, R saved, R gamma, R beta, W y
                                                     [, R any: orders the task after its writer] */
extern struct starpu_codelet tsl_cl_bn_infer;     /* R x, R rmean, R rvar, R g, R b, W y */
/* R x, R dy, W acc, [R saved, R gamma, R beta if relu] */
extern struct starpu_codelet tsl_cl_bn_bwd_stats;
extern struct starpu_codelet tsl_cl_bn_bwd_coef;   /* R acc, R saved, W coef */
extern struct starpu_codelet tsl_cl_bn_param_grad; /* R acc, R saved, W dgamma or dbeta */
/* R x, R dy, R saved, R gamma, R coef, W dx, [R beta if relu] */
extern struct starpu_codelet tsl_cl_bn_bwd_data;

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_BATCHNORM_H */
