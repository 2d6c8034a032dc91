/* Activations, forward and backward: plain loops the compiler vectorises. */
#include <math.h>

#include "activation.h"
#include "codelet.h"

#define ACT_FORWARD(T, EXP, TANH, ERFC)                                                            \
    do {                                                                                           \
        const T *in = x;                                                                           \
        T *out = y;                                                                                \
        const T slope = (T)a->slope;                                                               \
        switch ((tsl_activation)a->kind) {                                                         \
        case TSL_ACT_RELU:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = in[i] > 0 ? in[i] : (T)0;                                                 \
            return;                                                                                \
        case TSL_ACT_LEAKY_RELU:                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = in[i] > 0 ? in[i] : slope * in[i];                                        \
            return;                                                                                \
        case TSL_ACT_SIGMOID:                                                                      \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = (T)1 / ((T)1 + EXP(-in[i]));                                              \
            return;                                                                                \
        case TSL_ACT_TANH:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = TANH(in[i]);                                                              \
            return;                                                                                \
        case TSL_ACT_GELU: /* x Phi(x); erfc keeps Phi accurate far into the left tail */          \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = (T)0.5 * in[i] * ERFC(-in[i] * (T)M_SQRT1_2);                             \
            return;                                                                                \
        }                                                                                          \
    } while (0)

void tsl_act_forward(const tsl_act_args *a, const void *x, void *y)
{
    int64_t n = a->count;
    if (a->dtype == TSL_F32)
        ACT_FORWARD(float, expf, tanhf, erfcf);
    else if (a->dtype == TSL_F64)
        ACT_FORWARD(double, exp, tanh, erfc);
    TSL_CODELET_CHECK(0, "activation forward: unknown kind or dtype");
}

#define ACT_BACKWARD(T, EXP, ERFC)                                                                 \
    do {                                                                                           \
        const T *v = in;                                                                           \
        const T *g = dy;                                                                           \
        T *out = dx;                                                                               \
        const T slope = (T)a->slope;                                                               \
        switch ((tsl_activation)a->kind) {                                                         \
        case TSL_ACT_RELU: /* g loaded unconditionally: a select the compiler vectorises */        \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T gi = g[i];                                                                       \
                out[i] = v[i] > 0 ? gi : (T)0;                                                     \
            }                                                                                      \
            return;                                                                                \
        case TSL_ACT_LEAKY_RELU:                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T gi = g[i];                                                                       \
                out[i] = v[i] > 0 ? gi : slope * gi;                                               \
            }                                                                                      \
            return;                                                                                \
        case TSL_ACT_SIGMOID:                                                                      \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = g[i] * v[i] * ((T)1 - v[i]);                                              \
            return;                                                                                \
        case TSL_ACT_TANH:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = g[i] * ((T)1 - v[i] * v[i]);                                              \
            return;                                                                                \
        case TSL_ACT_GELU: /* Phi(x) + x phi(x), from x */                                         \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T xi = v[i];                                                                       \
                T cdf = (T)0.5 * ERFC(-xi * (T)M_SQRT1_2);                                         \
                T pdf = (T)(0.5 * M_2_SQRTPI * M_SQRT1_2) * EXP((T)-0.5 * xi * xi);                \
                out[i] = g[i] * (cdf + xi * pdf);                                                  \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
    } while (0)

void tsl_act_backward(const tsl_act_args *a, const void *in, const void *dy, void *dx)
{
    int64_t n = a->count;
    if (a->dtype == TSL_F32)
        ACT_BACKWARD(float, expf, erfcf);
    else if (a->dtype == TSL_F64)
        ACT_BACKWARD(double, exp, erfc);
    TSL_CODELET_CHECK(0, "activation backward: unknown kind or dtype");
}

#define BUF(i) ((void *)STARPU_VECTOR_GET_PTR(buffers[i]))

static void act_forward_cpu(void *buffers[], void *cl_arg)
{
    tsl_act_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    int last = a.in_place ? 0 : 1;
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[last]) == a.count,
                      "activation: tile size");
    tsl_act_forward(&a, BUF(0), BUF(last));
}

static void act_backward_cpu(void *buffers[], void *cl_arg)
{
    tsl_act_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    int last = a.in_place ? 1 : 2;
    TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[last]) == a.count,
                      "activation backward: tile size");
    tsl_act_backward(&a, BUF(0), BUF(1), BUF(last));
}

/* The footprint: the tile sizes, the activation, the dtype and in-place or not. */
static uint32_t act_variant(struct starpu_task *task)
{
    tsl_act_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.kind);
    h = tsl_hash_i64(h, a.dtype);
    return tsl_hash_i64(h, a.in_place);
}

/* Modes come with each task (in place or not). */
TSL_CODELET(tsl_cl_act_forward, "tsl_act_fwd", act_forward_cpu, NULL, act_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_act_backward, "tsl_act_bwd", act_backward_cpu, NULL, act_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
