/* Elementwise tile ops (scale, axpy, add) and placement marks. Plain loops the compiler
 * vectorises. */
#include <stdint.h>

#include "check.h"
#include "tile_ops.h"

#define VEC_PTR(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))

static void scale_cpu(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[0]) == a.count, "scale: tile size");
    if (a.dtype == TSL_F32) {
        float *x = VEC_PTR(0);
        float alpha = (float)a.alpha;
        for (int64_t i = 0; i < a.count; i++)
            x[i] *= alpha;
    } else {
        TSL_CODELET_CHECK(a.dtype == TSL_F64, "scale: dtype");
        double *x = VEC_PTR(0);
        for (int64_t i = 0; i < a.count; i++)
            x[i] *= a.alpha;
    }
}

static void axpy_cpu(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[0]) == a.count &&
                          (int64_t)STARPU_VECTOR_GET_NX(buffers[1]) == a.count,
                      "axpy: tile sizes");
    if (a.dtype == TSL_F32) {
        const float *x = VEC_PTR(0);
        float *y = VEC_PTR(1);
        float alpha = (float)a.alpha;
        for (int64_t i = 0; i < a.count; i++)
            y[i] += alpha * x[i];
    } else {
        TSL_CODELET_CHECK(a.dtype == TSL_F64, "axpy: dtype");
        const double *x = VEC_PTR(0);
        double *y = VEC_PTR(1);
        for (int64_t i = 0; i < a.count; i++)
            y[i] += a.alpha * x[i];
    }
}

static void add_cpu(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(starpu_task_get_current()->nbuffers == 3, "add: three buffers");
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[2]) == a.count, "add: tile size");
    if (a.dtype == TSL_F32) {
        const float *x = VEC_PTR(0), *y = VEC_PTR(1);
        float *z = VEC_PTR(2);
        for (int64_t i = 0; i < a.count; i++)
            z[i] = x[i] + y[i];
    } else {
        TSL_CODELET_CHECK(a.dtype == TSL_F64, "add: dtype");
        const double *x = VEC_PTR(0), *y = VEC_PTR(1);
        double *z = VEC_PTR(2);
        for (int64_t i = 0; i < a.count; i++)
            z[i] = x[i] + y[i];
    }
}

static void mark_cpu(void *buffers[], void *cl_arg)
{
    tsl_mark_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    int32_t *tile = VEC_PTR(0);
    int32_t value = a.rank * 1000 + starpu_worker_get_id();
    for (int64_t i = 0; i < a.count; i++)
        tile[i] = value;
}

static struct starpu_perfmodel scale_model = {.type = STARPU_HISTORY_BASED, .symbol = "tsl_scale"};
static struct starpu_perfmodel axpy_model = {.type = STARPU_HISTORY_BASED, .symbol = "tsl_axpy"};
static struct starpu_perfmodel add_model = {.type = STARPU_HISTORY_BASED, .symbol = "tsl_add"};
static struct starpu_perfmodel mark_model = {.type = STARPU_HISTORY_BASED, .symbol = "tsl_mark"};

struct starpu_codelet tsl_cl_scale = {
    .cpu_funcs = {scale_cpu},
    .cpu_funcs_name = {"scale_cpu"},
    .nbuffers = 1,
    .modes = {STARPU_RW},
    .model = &scale_model,
    .name = "tsl_scale",
};

struct starpu_codelet tsl_cl_axpy = {
    .cpu_funcs = {axpy_cpu},
    .cpu_funcs_name = {"axpy_cpu"},
    .nbuffers = 2,
    .modes = {STARPU_R, STARPU_RW},
    .model = &axpy_model,
    .name = "tsl_axpy",
};

/* Modes come with each task: dst is W, or RW when it aliases an input. */
struct starpu_codelet tsl_cl_add = {
    .cpu_funcs = {add_cpu},
    .cpu_funcs_name = {"add_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &add_model,
    .name = "tsl_add",
};

struct starpu_codelet tsl_cl_mark = {
    .cpu_funcs = {mark_cpu},
    .cpu_funcs_name = {"mark_cpu"},
    .nbuffers = 1,
    .modes = {STARPU_W},
    .model = &mark_model,
    .name = "tsl_mark",
};
