/* Elementwise tile ops (scale, axpy, add, multiply) and placement marks. Plain loops the compiler
 * vectorises, over the element functions of elementwise_math.h, which the CUDA kernels
 * (elementwise.cu) share. */
#include <stdint.h>

#include "codelet.h"
#include "elementwise.h"
#include "elementwise_math.h"

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
            x[i] = tsl_scale_f32(x[i], alpha);
    } else {
        TSL_CODELET_CHECK(a.dtype == TSL_F64, "scale: dtype");
        double *x = VEC_PTR(0);
        for (int64_t i = 0; i < a.count; i++)
            x[i] = tsl_scale_f64(x[i], a.alpha);
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
            y[i] = tsl_axpy_f32(y[i], alpha, x[i]);
    } else {
        TSL_CODELET_CHECK(a.dtype == TSL_F64, "axpy: dtype");
        const double *x = VEC_PTR(0);
        double *y = VEC_PTR(1);
        for (int64_t i = 0; i < a.count; i++)
            y[i] = tsl_axpy_f64(y[i], a.alpha, x[i]);
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
        float alpha = (float)a.alpha;
        for (int64_t i = 0; i < a.count; i++)
            z[i] = tsl_add_f32(x[i], y[i], alpha);
    } else {
        TSL_CODELET_CHECK(a.dtype == TSL_F64, "add: dtype");
        const double *x = VEC_PTR(0), *y = VEC_PTR(1);
        double *z = VEC_PTR(2);
        for (int64_t i = 0; i < a.count; i++)
            z[i] = tsl_add_f64(x[i], y[i], a.alpha);
    }
}

static void mul_cpu(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(starpu_task_get_current()->nbuffers == 3, "mul: three buffers");
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[2]) == a.count, "mul: tile size");
    if (a.dtype == TSL_F32) {
        const float *x = VEC_PTR(0), *y = VEC_PTR(1);
        float *z = VEC_PTR(2);
        for (int64_t i = 0; i < a.count; i++)
            z[i] = tsl_mul_f32(x[i], y[i]);
    } else {
        TSL_CODELET_CHECK(a.dtype == TSL_F64, "mul: dtype");
        const double *x = VEC_PTR(0), *y = VEC_PTR(1);
        double *z = VEC_PTR(2);
        for (int64_t i = 0; i < a.count; i++)
            z[i] = tsl_mul_f64(x[i], y[i]);
    }
}

static void dropout_cpu(void *buffers[], void *cl_arg)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    TSL_CODELET_CHECK(starpu_task_get_current()->nbuffers == 3, "dropout: three buffers");
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[2]) == a.count &&
                          (int64_t)STARPU_VECTOR_GET_NX(buffers[1]) >= a.count,
                      "dropout: tile size");
    TSL_CODELET_CHECK(a.dtype == TSL_F32, "dropout: dtype");
    const float *x = VEC_PTR(0), *u = VEC_PTR(1);
    float *z = VEC_PTR(2);
    for (int64_t i = 0; i < a.count; i++)
        z[i] = tsl_dropout_f32(x[i], u[i], a.alpha);
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

/* The footprint: the tile sizes and the dtype. */
static uint32_t elementwise_variant(struct starpu_task *task)
{
    tsl_elementwise_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    return tsl_hash_i64(starpu_task_data_footprint(task), a.dtype);
}

/* The CUDA functions (elementwise.cu) fill the CUDA slots only when TESSEL_USE_CUDA is
 * defined. */
TSL_CODELET(tsl_cl_scale, "tsl_scale", scale_cpu, tsl_scale_cuda, elementwise_variant,
            .nbuffers = 1, .modes = {STARPU_RW});
TSL_CODELET(tsl_cl_axpy, "tsl_axpy", axpy_cpu, tsl_axpy_cuda, elementwise_variant, .nbuffers = 2,
            .modes = {STARPU_R, STARPU_RW});
/* Modes come with each task: dst is W, or RW when it aliases an input. */
TSL_CODELET(tsl_cl_add, "tsl_add", add_cpu, tsl_add_cuda, elementwise_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_mul, "tsl_mul", mul_cpu, tsl_mul_cuda, elementwise_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_dropout, "tsl_dropout", dropout_cpu, tsl_dropout_cuda, elementwise_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
/* On a CUDA worker too: the mark records the worker that ran the task, and the tile need not
 * come to the host for it. */
TSL_CODELET(tsl_cl_mark, "tsl_mark", mark_cpu, tsl_mark_cuda, NULL, .nbuffers = 1,
            .modes = {STARPU_W});
