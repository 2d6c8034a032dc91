/* Activations, forward and backward: plain loops the compiler vectorises. */
#include <math.h>

#include "check.h"
#include "nn_ops.h"

#define ACT_FORWARD(T, EXP, TANH)                                                                  \
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
        }                                                                                          \
    } while (0)

void tsl_act_forward(const tsl_act_args *a, const void *x, void *y)
{
    int64_t n = a->count;
    if (a->dtype == TSL_F32)
        ACT_FORWARD(float, expf, tanhf);
    else if (a->dtype == TSL_F64)
        ACT_FORWARD(double, exp, tanh);
    TSL_CODELET_CHECK(0, "activation forward: unknown kind or dtype");
}

#define ACT_BACKWARD(T)                                                                            \
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
        }                                                                                          \
    } while (0)

void tsl_act_backward(const tsl_act_args *a, const void *in, const void *dy, void *dx)
{
    int64_t n = a->count;
    if (a->dtype == TSL_F32)
        ACT_BACKWARD(float);
    else if (a->dtype == TSL_F64)
        ACT_BACKWARD(double);
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

static struct starpu_perfmodel act_forward_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_act_fwd",
};
static struct starpu_perfmodel act_backward_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_act_bwd",
};

/* Modes come with each task (in place or not). */
struct starpu_codelet tsl_cl_act_forward = {
    .cpu_funcs = {act_forward_cpu},
    .cpu_funcs_name = {"act_forward_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &act_forward_model,
    .name = "tsl_act_fwd",
};

struct starpu_codelet tsl_cl_act_backward = {
    .cpu_funcs = {act_backward_cpu},
    .cpu_funcs_name = {"act_backward_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &act_backward_model,
    .name = "tsl_act_bwd",
};
