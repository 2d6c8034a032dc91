/* Group normalization (and layer normalization, one group) with exact statistics over all
 * tiles (kernels and codelets in codelets/groupnorm.c; per-element arithmetic in
 * codelets/groupnorm_math.h).
 *
 * Each sample's channels are cut into G groups of C / G; a group's mean and variance run over
 * its channels and every spatial position of the sample. Per tile, the sums of x and x^2 of
 * each (sample, group) go into exact accumulators; the tiles of one run of samples (a sample
 * slab: every channel and spatial tile of those samples) merge theirs; a finalize task turns
 * the totals into (mean, 1 / sqrt(var + eps)) per (sample, group). The backward sums dy and
 * dy x exactly per (sample, channel) over the slab's tiles; from those totals, rounded once
 * each, sum(dy xhat) = invstd (sum(dy x) - mean sum(dy)) per (sample, channel), the group
 * means of dy gamma and dy gamma xhat (summed over the group's channels in order), and the
 * parameter gradients (exact sums over every sample). Every result depends on exact sums and
 * a fixed order only, so it is identical for every tiling, layout and rank count. */
#ifndef TESSEL_CODELETS_GROUPNORM_H
#define TESSEL_CODELETS_GROUPNORM_H

#include <starpu.h>
#include <stdint.h>

#include "reduce.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsl_gn_args {
    int32_t dtype;         /* of x, y, dy, dx, gamma, beta, dgamma, dbeta: f32 or f64 */
    int32_t channels_last; /* tiles stored N D H W C (positions, then channels) */
    int64_t channels;      /* C of the whole tensor */
    int64_t groups;        /* G: C / G channels per group */
    int64_t samples;       /* tile extent along N (the slab's samples) */
    int64_t n0;            /* the tile's first sample: its statistics' row in saved */
    int64_t batch;         /* N of the whole tensor: saved holds 2 N G doubles */
    int64_t c0;            /* first channel of the tile */
    int64_t cext;          /* channels in the tile */
    int64_t inner;         /* spatial positions in the tile */
    int64_t per_group;     /* (C / G) x spatial positions of a sample: a statistic's count */
    double eps;
    int32_t which; /* parameter gradient a task writes: 0 beta (sum dy), 1 gamma (sum dy xhat) */
    int32_t relu;  /* 1: ReLU fused after the normalization (normalize, backward sums and data) */
    int32_t saved_stats; /* normalize: stats is the whole batch's saved rows (2 N G doubles, the
                            tile's sample s at row n0 + s), not the slab's (a remade output) */
} tsl_gn_args;

/* Forward sums of one tile: acc[2 (s G + g)] += sum x, acc[2 (s G + g) + 1] += sum x^2 over the
 * tile's elements of sample s (tile-local) and group g; acc has 2 samples G entries, zeroed
 * first. */
void tsl_gn_stats_tile(const tsl_gn_args *a, const void *x, tsl_acc *acc);
/* Totals of a slab (2 samples G accumulators) -> its statistics, 2 samples G doubles:
 * (mean, invstd) of sample s and group g at [2 (s G + g)] and [2 (s G + g) + 1]. The saved
 * statistics of a whole batch are these rows for every sample, row n at 2 n G. */
void tsl_gn_finalize(const tsl_gn_args *a, const tsl_acc *acc, double *stats);
/* y = (x - mean) (invstd gamma) + beta on one tile, stats the slab's (mean, invstd) rows;
 * max(y, 0) when a->relu (NaN gives 0, as the ReLU's forward). */
void tsl_gn_normalize_tile(const tsl_gn_args *a, const void *x, const double *stats,
                           const void *gamma, const void *beta, void *y);
/* Backward sums of one tile: acc[2 (s C + c)] += sum dy and acc[2 (s C + c) + 1] += sum dy x
 * over the tile's positions of sample s (tile-local) and channel c (global); acc has
 * 2 samples C entries, zeroed first. When a->relu, dy counts only where the forward's
 * y > 0 (y recomputed from x, saved, gamma and beta with the forward's arithmetic); saved,
 * gamma and beta are read only then. */
void tsl_gn_backward_sums_tile(const tsl_gn_args *a, const void *x, const void *dy,
                               const double *saved, const void *gamma, const void *beta,
                               tsl_acc *acc);
/* Slab totals (2 samples C accumulators) and saved -> coef (2 samples G doubles: the group means
 * of dy gamma and of dy gamma xhat). */
void tsl_gn_backward_coef(const tsl_gn_args *a, const tsl_acc *acc, const double *saved,
                          const void *gamma, double *coef);
/* Slab totals and saved -> out (2 C accumulators, zeroed first): out[2c] the slab's sum dy,
 * out[2c + 1] its sum of each sample's sum(dy xhat), exactly. */
void tsl_gn_slab_channels(const tsl_gn_args *a, const tsl_acc *acc, const double *saved,
                          tsl_acc *out);
/* Channel totals -> dbeta (which 0) or dgamma (which 1), C values of the dtype. */
void tsl_gn_param_grad(const tsl_gn_args *a, const tsl_acc *acc, void *grad);
/* dx = invstd (dy gamma - m1 - xhat m2) on one tile, (m1, m2) the slab's coef; dy masked by
 * the fused ReLU when a->relu (beta read only then). */
void tsl_gn_backward_data_tile(const tsl_gn_args *a, const void *x, const void *dy,
                               const double *saved, const void *gamma, const void *beta,
                               const double *coef, void *dx);

#ifdef TESSEL_USE_CUDA
/* The codelets' CUDA functions (groupnorm.cu): the same arguments, buffers and bits as the CPU
 * functions, launched on the worker's stream. */
void tsl_gn_stats_cuda(void *buffers[], void *cl_arg);
void tsl_gn_normalize_cuda(void *buffers[], void *cl_arg);
void tsl_gn_bwd_sums_cuda(void *buffers[], void *cl_arg);
void tsl_gn_bwd_data_cuda(void *buffers[], void *cl_arg);
void tsl_gn_finalize_cuda(void *buffers[], void *cl_arg);
void tsl_gn_save_cuda(void *buffers[], void *cl_arg);
void tsl_gn_bwd_coef_cuda(void *buffers[], void *cl_arg);
void tsl_gn_slab_channels_cuda(void *buffers[], void *cl_arg);
void tsl_gn_param_grad_cuda(void *buffers[], void *cl_arg);
#endif

extern struct starpu_codelet tsl_cl_gn_stats;     /* R x, W acc */
extern struct starpu_codelet tsl_cl_gn_finalize;  /* R acc, W stats (the slab's rows) */
extern struct starpu_codelet tsl_cl_gn_save;      /* R acc, RW saved (rows n0 ...) */
extern struct starpu_codelet tsl_cl_gn_normalize; /* R x, R stats, R gamma, R beta, W y */
/* R x, R dy, W acc, [R saved, R gamma, R beta if relu] */
extern struct starpu_codelet tsl_cl_gn_bwd_sums;
extern struct starpu_codelet tsl_cl_gn_bwd_coef;      /* R acc, R saved, R gamma, W coef */
extern struct starpu_codelet tsl_cl_gn_slab_channels; /* R acc, R saved, W channel acc */
extern struct starpu_codelet tsl_cl_gn_param_grad;    /* R acc, W dgamma or dbeta */
/* R x, R dy, R saved, R gamma, R coef, W dx, [R beta if relu] */
extern struct starpu_codelet tsl_cl_gn_bwd_data;

#ifdef __cplusplus
}
#endif

#endif /* TESSEL_CODELETS_GROUPNORM_H */
