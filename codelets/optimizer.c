/* Optimizer updates of one parameter tile, following PyTorch's torch.optim.SGD and
 * torch.optim.Adam / AdamW (single-tensor path). Arithmetic per element is in double (the
 * element functions of optimizer_math.h, which the CUDA kernels of optimizer.cu share);
 * results are stored in the parameter's dtype. */
#include <math.h>

#include "codelet.h"
#include "optimizer.h"
#include "optimizer_math.h"

/* f32 tiles (every model parameter) get loops of their own, which the compiler vectorizes; the
 * arithmetic is the same, so the results are too. */
static void sgd(const tsl_update_args *a, void *param, const void *grad, void *buf)
{
    const tsl_sgd_config *c = &a->sgd;
    const int first = a->step == 1, momentum = buf != NULL;
    if (a->dtype == TSL_F32) {
        float *restrict pf = param, *restrict bf = buf;
        const float *restrict gf = grad;
        for (int64_t i = 0; i < a->count; i++) {
            double b = momentum && !first ? (double)bf[i] : 0.0;
            pf[i] = (float)tsl_sgd_element(c, first, momentum, (double)pf[i], (double)gf[i], &b);
            if (momentum)
                bf[i] = (float)b;
        }
        return;
    }
    for (int64_t i = 0; i < a->count; i++) {
        double b = momentum && !first ? tsl_load(a->dtype, buf, i) : 0.0;
        double p = tsl_sgd_element(c, first, momentum, tsl_load(a->dtype, param, i),
                                   tsl_load(a->dtype, grad, i), &b);
        if (momentum)
            tsl_store(a->dtype, buf, i, b);
        tsl_store(a->dtype, param, i, p);
    }
}

void tsl_adam_bias(const tsl_update_args *a, double *step_size, double *bias2_sqrt)
{
    double bias1 = 1.0 - pow(a->adam.beta1, (double)a->step);
    *bias2_sqrt = sqrt(1.0 - pow(a->adam.beta2, (double)a->step));
    *step_size = a->adam.lr / bias1;
}

static void adam(const tsl_update_args *a, void *param, const void *grad, void *m, void *v)
{
    const tsl_adam_config *c = &a->adam;
    double step_size, bias2_sqrt;
    tsl_adam_bias(a, &step_size, &bias2_sqrt);
    if (a->dtype == TSL_F32) {
        float *restrict pf = param, *restrict mf = m, *restrict vf = v;
        const float *restrict gf = grad;
        for (int64_t i = 0; i < a->count; i++) {
            double mi = mf[i], vi = vf[i];
            pf[i] = (float)tsl_adam_element(c, step_size, bias2_sqrt, (double)pf[i], (double)gf[i],
                                            &mi, &vi);
            mf[i] = (float)mi;
            vf[i] = (float)vi;
        }
        return;
    }
    for (int64_t i = 0; i < a->count; i++) {
        double mi = tsl_load(a->dtype, m, i), vi = tsl_load(a->dtype, v, i);
        double p = tsl_adam_element(c, step_size, bias2_sqrt, tsl_load(a->dtype, param, i),
                                    tsl_load(a->dtype, grad, i), &mi, &vi);
        tsl_store(a->dtype, m, i, mi);
        tsl_store(a->dtype, v, i, vi);
        tsl_store(a->dtype, param, i, p);
    }
}

void tsl_update_check(const tsl_update_args *a, const void *state0, const void *state1)
{
    TSL_CODELET_CHECK(a->dtype == TSL_F32 || a->dtype == TSL_F64, "update: dtype");
    TSL_CODELET_CHECK(a->step >= 1, "update: step");
    TSL_CODELET_CHECK(a->kind == TSL_OPT_SGD || (a->kind == TSL_OPT_ADAM && state0 && state1),
                      "update: kind or state");
}

void tsl_update(const tsl_update_args *a, void *param, const void *grad, void *state0, void *state1)
{
    tsl_update_check(a, state0, state1);
    if (a->kind == TSL_OPT_SGD)
        sgd(a, param, grad, state0);
    else
        adam(a, param, grad, state0, state1);
}

void tsl_update_task(void *buffers[], void *cl_arg, tsl_update_args *a, void *ptr[4])
{
    starpu_codelet_unpack_args(cl_arg, a);
    unsigned nbuffers = starpu_task_get_current()->nbuffers;
    TSL_CODELET_CHECK(nbuffers >= 2 && nbuffers <= 4, "update: buffers");
    for (unsigned b = 0; b < 4; b++) {
        TSL_CODELET_CHECK(b >= nbuffers || (int64_t)STARPU_VECTOR_GET_NX(buffers[b]) == a->count,
                          "update: tile sizes");
        ptr[b] = b < nbuffers ? (void *)STARPU_VECTOR_GET_PTR(buffers[b]) : NULL;
    }
}

static void update_cpu(void *buffers[], void *cl_arg)
{
    tsl_update_args a;
    void *ptr[4];
    tsl_update_task(buffers, cl_arg, &a, ptr);
    tsl_update(&a, ptr[0], ptr[1], ptr[2], ptr[3]);
}

/* The footprint: the tile sizes, the optimizer and its branches (Nesterov, AdamW), the dtype.
 * Whether there is a momentum buffer shows in the buffers. */
static uint32_t update_variant(struct starpu_task *task)
{
    tsl_update_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.kind);
    h = tsl_hash_i64(h, a.dtype);
    return tsl_hash_i64(h, a.kind == TSL_OPT_SGD ? a.sgd.nesterov : a.adam.decoupled);
}

/* RW param, R grad, then RW state tiles: modes come with each task. */
/* The CUDA function (optimizer.cu) fills the CUDA slot only when TESSEL_USE_CUDA is defined. */
TSL_CODELET(tsl_cl_update, "tsl_update", update_cpu, tsl_update_cuda, update_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
