/* Optimizer updates of one parameter tile, following PyTorch's torch.optim.SGD and
 * torch.optim.Adam / AdamW (single-tensor path). Arithmetic per element is in double;
 * results are stored in the parameter's dtype. */
#include <math.h>

#include "codelet.h"
#include "optimizer.h"

/* One element of SGD: the new parameter value; *b is the momentum buffer's value (in: the
 * previous one, not read on the first step), when there is one. */
static inline double sgd_element(const tsl_sgd_config *c, int first, int momentum, double p,
                                 double g, double *b)
{
    g += c->weight_decay * p;
    if (momentum) {
        *b = first ? g : c->momentum * *b + (1.0 - c->dampening) * g;
        g = c->nesterov ? g + c->momentum * *b : *b;
    }
    return p - c->lr * g;
}

/* One element of Adam: the new parameter value; *m and *v are the moments (in: previous). */
static inline double adam_element(const tsl_adam_config *c, double step_size, double bias2_sqrt,
                                  double p, double g, double *m, double *v)
{
    if (c->decoupled)
        p *= 1.0 - c->lr * c->weight_decay;
    else
        g += c->weight_decay * p;
    *m = c->beta1 * *m + (1.0 - c->beta1) * g;
    *v = c->beta2 * *v + (1.0 - c->beta2) * g * g;
    double denom = sqrt(*v) / bias2_sqrt + c->eps;
    return p - step_size * *m / denom;
}

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
            pf[i] = (float)sgd_element(c, first, momentum, (double)pf[i], (double)gf[i], &b);
            if (momentum)
                bf[i] = (float)b;
        }
        return;
    }
    for (int64_t i = 0; i < a->count; i++) {
        double b = momentum && !first ? tsl_load(a->dtype, buf, i) : 0.0;
        double p = sgd_element(c, first, momentum, tsl_load(a->dtype, param, i),
                               tsl_load(a->dtype, grad, i), &b);
        if (momentum)
            tsl_store(a->dtype, buf, i, b);
        tsl_store(a->dtype, param, i, p);
    }
}

static void adam(const tsl_update_args *a, void *param, const void *grad, void *m, void *v)
{
    const tsl_adam_config *c = &a->adam;
    double bias1 = 1.0 - pow(c->beta1, (double)a->step);
    double bias2_sqrt = sqrt(1.0 - pow(c->beta2, (double)a->step));
    double step_size = c->lr / bias1;
    if (a->dtype == TSL_F32) {
        float *restrict pf = param, *restrict mf = m, *restrict vf = v;
        const float *restrict gf = grad;
        for (int64_t i = 0; i < a->count; i++) {
            double mi = mf[i], vi = vf[i];
            pf[i] = (float)adam_element(c, step_size, bias2_sqrt, (double)pf[i], (double)gf[i], &mi,
                                        &vi);
            mf[i] = (float)mi;
            vf[i] = (float)vi;
        }
        return;
    }
    for (int64_t i = 0; i < a->count; i++) {
        double mi = tsl_load(a->dtype, m, i), vi = tsl_load(a->dtype, v, i);
        double p = adam_element(c, step_size, bias2_sqrt, tsl_load(a->dtype, param, i),
                                tsl_load(a->dtype, grad, i), &mi, &vi);
        tsl_store(a->dtype, m, i, mi);
        tsl_store(a->dtype, v, i, vi);
        tsl_store(a->dtype, param, i, p);
    }
}

void tsl_update(const tsl_update_args *a, void *param, const void *grad, void *state0, void *state1)
{
    TSL_CODELET_CHECK(a->dtype == TSL_F32 || a->dtype == TSL_F64, "update: dtype");
    TSL_CODELET_CHECK(a->step >= 1, "update: step");
    if (a->kind == TSL_OPT_SGD) {
        sgd(a, param, grad, state0);
        return;
    }
    TSL_CODELET_CHECK(a->kind == TSL_OPT_ADAM && state0 && state1, "update: kind or state");
    adam(a, param, grad, state0, state1);
}

static void update_cpu(void *buffers[], void *cl_arg)
{
    tsl_update_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    unsigned nbuffers = starpu_task_get_current()->nbuffers;
    TSL_CODELET_CHECK(nbuffers >= 2 && nbuffers <= 4, "update: buffers");
    for (unsigned b = 0; b < nbuffers; b++)
        TSL_CODELET_CHECK((int64_t)STARPU_VECTOR_GET_NX(buffers[b]) == a.count,
                          "update: tile sizes");
    void *ptr[4] = {NULL, NULL, NULL, NULL};
    for (unsigned b = 0; b < nbuffers; b++)
        ptr[b] = (void *)STARPU_VECTOR_GET_PTR(buffers[b]);
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
TSL_CODELET(tsl_cl_update, "tsl_update", update_cpu, NULL, update_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
