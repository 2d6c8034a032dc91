/* Batch normalization codelets: see batchnorm.h. The kernels are in
 * codelets/batchnorm_stats.c (the sums) and codelets/batchnorm_normalize.c (the elementwise
 * passes and the backward's masked sums). */
#include "batchnorm.h"
#include "codelet.h"

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))
#define NX(i) ((int64_t)STARPU_VECTOR_GET_NX(buffers[i]))
#define ACC_OK(i, a)                                                                               \
    (NX(i) * (int64_t)sizeof(int64_t) == 2 * (a).acc_count * (int64_t)sizeof(tsl_acc) &&           \
     (a).acc_first >= 0 && (a).acc_first + (a).acc_count <= (a).channels)
/* The whole tensor's sums (finalize, running statistics, backward coefficients). */
#define ACC_ALL(i, a) (ACC_OK(i, a) && (a).acc_first == 0 && (a).acc_count == (a).channels)
/* A tile's channels inside its accumulators (stats tasks). */
#define TILE_IN_ACC(a)                                                                             \
    ((a).c0 >= (a).acc_first && (a).c0 + (a).cext <= (a).acc_first + (a).acc_count)

static void bn_stats_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(0) == a.samples * a.cext * a.inner && ACC_OK(1, a) && TILE_IN_ACC(a),
                      "bn stats: sizes");
    tsl_bn_stats_tile(&a, BUF(0), BUF(1));
}

static void bn_finalize_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_ALL(0, a) && NX(1) == 2 * a.channels, "bn finalize: sizes");
    tsl_bn_finalize(&a, BUF(0), BUF(1));
}

static void bn_running_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_ALL(0, a) && NX(1) == a.channels, "bn running statistics: sizes");
    tsl_bn_running(&a, BUF(0), BUF(1));
}

static void bn_normalize_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(4) == a.samples * a.cext * a.inner, "bn normalize: sizes");
    tsl_bn_normalize_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4));
}

static void bn_infer_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(5) == a.samples * a.cext * a.inner, "bn inference: sizes");
    tsl_bn_infer_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), BUF(4), BUF(5));
}

/* Buffers x, dy, the accumulators, then saved, gamma and beta when ReLU is fused. */
static void bn_bwd_stats_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(
        ACC_OK(2, a) && TILE_IN_ACC(a) && NX(0) == a.samples * a.cext * a.inner && NX(1) == NX(0) &&
            (!a.relu || (NX(3) == 2 * a.channels && NX(4) == a.channels && NX(5) == a.channels)),
        "bn backward stats: sizes");
    tsl_bn_backward_stats_tile(&a, BUF(0), BUF(1), a.relu ? BUF(3) : NULL, a.relu ? BUF(4) : NULL,
                               a.relu ? BUF(5) : NULL, BUF(2));
}

static void bn_bwd_coef_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_ALL(0, a) && NX(1) == 2 * a.channels && NX(2) == 2 * a.channels,
                      "bn backward coef: sizes");
    tsl_bn_backward_coef(&a, BUF(0), BUF(1), BUF(2));
}

static void bn_param_grad_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(ACC_ALL(0, a) && NX(1) == 2 * a.channels && NX(2) == a.channels,
                      "bn parameter gradient: sizes");
    tsl_bn_param_grad(&a, BUF(0), BUF(1), BUF(2));
}

/* Buffers x, dy, saved, gamma, coef, dx, then beta when ReLU is fused. */
static void bn_bwd_data_cpu(void *buffers[], void *cl_arg)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(NX(5) == a.samples * a.cext * a.inner && (!a.relu || NX(6) == a.channels),
                      "bn backward data: sizes");
    tsl_bn_backward_data_tile(&a, BUF(0), BUF(1), BUF(2), BUF(3), a.relu ? BUF(6) : NULL, BUF(4),
                              BUF(5));
}

/* The footprint: the tile sizes, the dtype, the fused ReLU, the layout, the statistic or
 * gradient a task updates and the tile's channels. */
static uint32_t bn_variant(struct starpu_task *task)
{
    tsl_bn_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.dtype);
    h = tsl_hash_i64(h, a.relu);
    h = tsl_hash_i64(h, a.channels_last);
    h = tsl_hash_i64(h, a.which);
    return tsl_hash_i64(h, a.cext);
}

TSL_CODELET(tsl_cl_bn_stats, "tsl_bn_stats", bn_stats_cpu, tsl_bn_stats_cuda, bn_variant,
            .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_bn_finalize, "tsl_bn_finalize", bn_finalize_cpu, tsl_bn_finalize_cuda,
            bn_variant, .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_bn_running, "tsl_bn_running", bn_running_cpu, tsl_bn_running_cuda, bn_variant,
            .nbuffers = 2, .modes = {STARPU_R, STARPU_RW});
/* Fused ReLU or not, from the arguments; a sixth buffer, read only to order the task, is
 * ignored. */
TSL_CODELET(tsl_cl_bn_normalize, "tsl_bn_normalize", bn_normalize_cpu, tsl_bn_normalize_cuda,
            bn_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_bn_infer, "tsl_bn_infer", bn_infer_cpu, tsl_bn_infer_cuda, bn_variant,
            .nbuffers = 6, .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_R, STARPU_W});
/* Buffers (and modes, given with each task) differ with a fused ReLU: see bn_bwd_stats_cpu. */
TSL_CODELET(tsl_cl_bn_bwd_stats, "tsl_bn_bwd_stats", bn_bwd_stats_cpu, tsl_bn_bwd_stats_cuda,
            bn_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_bn_bwd_coef, "tsl_bn_bwd_coef", bn_bwd_coef_cpu, tsl_bn_bwd_coef_cuda,
            bn_variant, .nbuffers = 3, .modes = {STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_bn_param_grad, "tsl_bn_param_grad", bn_param_grad_cpu, tsl_bn_param_grad_cuda,
            bn_variant, .nbuffers = 3, .modes = {STARPU_R, STARPU_R, STARPU_W});
/* Buffers differ with a fused ReLU: see bn_bwd_data_cpu. */
TSL_CODELET(tsl_cl_bn_bwd_data, "tsl_bn_bwd_data", bn_bwd_data_cpu, tsl_bn_bwd_data_cuda,
            bn_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
