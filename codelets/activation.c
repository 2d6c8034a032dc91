/* Activations, forward and backward: plain loops the compiler vectorises, over the element
 * functions of activation_math.h. The CUDA functions are in activation.cu. */
#include "activation.h"
#include "activation_math.h"
#include "codelet.h"

/* The loops call the element functions of activation_math.h (tsl_relu_fwd_f32, ...), which
 * the CUDA kernels of activation.cu share. */
#define ACT_FORWARD(T, SFX)                                                                        \
    do {                                                                                           \
        const T *in = x;                                                                           \
        T *out = y;                                                                                \
        const T slope = (T)a->slope;                                                               \
        switch ((tsl_activation)a->kind) {                                                         \
        case TSL_ACT_RELU:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_relu_fwd_##SFX(in[i]);                                                \
            return;                                                                                \
        case TSL_ACT_LEAKY_RELU:                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_leaky_relu_fwd_##SFX(in[i], slope);                                   \
            return;                                                                                \
        case TSL_ACT_SIGMOID:                                                                      \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_sigmoid_fwd_##SFX(in[i]);                                             \
            return;                                                                                \
        case TSL_ACT_TANH:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_tanh_fwd_##SFX(in[i]);                                                \
            return;                                                                                \
        case TSL_ACT_GELU:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_gelu_fwd_##SFX(in[i]);                                                \
            return;                                                                                \
        case TSL_ACT_SILU:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_silu_fwd_##SFX(in[i]);                                                \
            return;                                                                                \
        }                                                                                          \
    } while (0)

TSL_VECTOR_KERNEL
void tsl_act_forward(const tsl_act_args *a, const void *x, void *y)
{
    int64_t n = a->count;
    if (a->dtype == TSL_F32)
        ACT_FORWARD(float, f32);
    else if (a->dtype == TSL_F64)
        ACT_FORWARD(double, f64);
    TSL_CODELET_CHECK(0, "activation forward: unknown kind or dtype");
}

#define ACT_BACKWARD(T, SFX)                                                                       \
    do {                                                                                           \
        const T *v = in;                                                                           \
        const T *g = dy;                                                                           \
        T *out = dx;                                                                               \
        const T slope = (T)a->slope;                                                               \
        switch ((tsl_activation)a->kind) {                                                         \
        case TSL_ACT_RELU:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_relu_bwd_##SFX(v[i], g[i]);                                           \
            return;                                                                                \
        case TSL_ACT_LEAKY_RELU:                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_leaky_relu_bwd_##SFX(v[i], g[i], slope);                              \
            return;                                                                                \
        case TSL_ACT_SIGMOID:                                                                      \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_sigmoid_bwd_##SFX(v[i], g[i]);                                        \
            return;                                                                                \
        case TSL_ACT_TANH:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_tanh_bwd_##SFX(v[i], g[i]);                                           \
            return;                                                                                \
        case TSL_ACT_GELU:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_gelu_bwd_##SFX(v[i], g[i]);                                           \
            return;                                                                                \
        case TSL_ACT_SILU:                                                                         \
            for (int64_t i = 0; i < n; i++)                                                        \
                out[i] = tsl_silu_bwd_##SFX(v[i], g[i]);                                           \
            return;                                                                                \
        }                                                                                          \
    } while (0)

TSL_VECTOR_KERNEL
void tsl_act_backward(const tsl_act_args *a, const void *in, const void *dy, void *dx)
{
    int64_t n = a->count;
    if (a->dtype == TSL_F32)
        ACT_BACKWARD(float, f32);
    else if (a->dtype == TSL_F64)
        ACT_BACKWARD(double, f64);
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

/* Modes come with each task (in place or not). The CUDA functions (activation.cu) fill the
 * CUDA slot only when TESSEL_USE_CUDA is defined. */
TSL_CODELET(tsl_cl_act_forward, "tsl_act_fwd", act_forward_cpu, tsl_act_forward_cuda, act_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_act_backward, "tsl_act_bwd", act_backward_cpu, tsl_act_backward_cuda,
            act_variant, .nbuffers = STARPU_VARIABLE_NBUFFERS);
