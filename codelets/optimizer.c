/* Optimizer updates of one parameter tile, following PyTorch's torch.optim.SGD and
 * torch.optim.Adam / AdamW (single-tensor path). Arithmetic per element is in double;
 * results are stored in the parameter's dtype. */
#include <math.h>

#include "check.h"
#include "scalar.h"
#include "nn_ops.h"

static void sgd(const tsl_update_args *a, void *param, const void *grad, void *buf)
{
    const tsl_sgd_config *c = &a->sgd;
    for (int64_t i = 0; i < a->count; i++) {
        double p = tsl_load(a->dtype, param, i);
        double g = tsl_load(a->dtype, grad, i) + c->weight_decay * p;
        if (buf) {
            double b = a->step == 1
                           ? g
                           : c->momentum * tsl_load(a->dtype, buf, i) + (1.0 - c->dampening) * g;
            tsl_store(a->dtype, buf, i, b);
            g = c->nesterov ? g + c->momentum * b : b;
        }
        tsl_store(a->dtype, param, i, p - c->lr * g);
    }
}

static void adam(const tsl_update_args *a, void *param, const void *grad, void *m, void *v)
{
    const tsl_adam_config *c = &a->adam;
    double bias1 = 1.0 - pow(c->beta1, (double)a->step);
    double bias2_sqrt = sqrt(1.0 - pow(c->beta2, (double)a->step));
    double step_size = c->lr / bias1;
    for (int64_t i = 0; i < a->count; i++) {
        double p = tsl_load(a->dtype, param, i);
        double g = tsl_load(a->dtype, grad, i);
        if (c->decoupled)
            p *= 1.0 - c->lr * c->weight_decay;
        else
            g += c->weight_decay * p;
        double mi = c->beta1 * tsl_load(a->dtype, m, i) + (1.0 - c->beta1) * g;
        double vi = c->beta2 * tsl_load(a->dtype, v, i) + (1.0 - c->beta2) * g * g;
        tsl_store(a->dtype, m, i, mi);
        tsl_store(a->dtype, v, i, vi);
        double denom = sqrt(vi) / bias2_sqrt + c->eps;
        tsl_store(a->dtype, param, i, p - step_size * mi / denom);
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

static struct starpu_perfmodel update_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_update",
};

/* RW param, R grad, then RW state tiles: modes come with each task. */
struct starpu_codelet tsl_cl_update = {
    .cpu_funcs = {update_cpu},
    .cpu_funcs_name = {"update_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &update_model,
    .name = "tsl_update",
};
