/* Losses of one tile: the per-position losses go into an exact accumulator (so the mean
 * over all tiles is the same for every tiling) and, if asked, the gradient of the mean loss
 * is written in the same pass.
 *
 * Softmax cross-entropy: logits tile (n, C, inner...), labels tile (n, inner...); the loss
 * at a position is logsumexp(x[:]) - x[label]; its gradient softmax(x) - onehot(label),
 * times `scale` (1 / positions in the whole tensor). MSE: (x - t)^2 per element, gradient
 * 2 (x - t) * scale. */
#include <math.h>

#include "check.h"
#include "scalar.h"
#include "loss_ops.h"

static inline int64_t load_label(int dtype, const void *p, int64_t i)
{
    switch ((tsl_dtype)dtype) {
    case TSL_I32:
        return ((const int32_t *)p)[i];
    case TSL_I64:
        return ((const int64_t *)p)[i];
    case TSL_U8:
        return ((const uint8_t *)p)[i];
    default:
        return -1;
    }
}

static void cross_entropy(const tsl_loss_args *a, const void *x, const void *labels, void *grad,
                          tsl_acc *acc)
{
    const int64_t C = a->classes, inner = a->inner;
    for (int64_t s = 0; s < a->samples; s++) {
        for (int64_t v = 0; v < inner; v++) {
            int64_t base = s * C * inner + v; /* x[s, c, v] = base + c * inner */
            int64_t label = load_label(a->label_dtype, labels, s * inner + v);
            double top = -INFINITY;
            for (int64_t c = 0; c < C; c++)
                top = fmax(top, tsl_load(a->dtype, x, base + c * inner));
            double total = 0;
            for (int64_t c = 0; c < C; c++)
                total += exp(tsl_load(a->dtype, x, base + c * inner) - top);
            if (label < 0 || label >= C) {
                acc->flagged++;
                if (grad)
                    for (int64_t c = 0; c < C; c++)
                        tsl_store(a->dtype, grad, base + c * inner, 0.0);
                continue;
            }
            double lse = top + log(total);
            tsl_acc_add(acc, lse - tsl_load(a->dtype, x, base + label * inner));
            if (grad)
                for (int64_t c = 0; c < C; c++) {
                    double p = exp(tsl_load(a->dtype, x, base + c * inner) - lse);
                    tsl_store(a->dtype, grad, base + c * inner, (p - (c == label)) * a->scale);
                }
        }
    }
}

static void mse(const tsl_loss_args *a, const void *x, const void *target, void *grad, tsl_acc *acc)
{
    int64_t n = a->samples * a->classes * a->inner;
    for (int64_t i = 0; i < n; i++) {
        double d = tsl_load(a->dtype, x, i) - tsl_load(a->dtype, target, i);
        tsl_acc_add(acc, d * d);
        if (grad)
            tsl_store(a->dtype, grad, i, 2.0 * d * a->scale);
    }
}

void tsl_loss_tile(const tsl_loss_args *a, const void *x, const void *target, void *grad,
                   tsl_acc *acc)
{
    TSL_CODELET_CHECK(a->dtype == TSL_F32 || a->dtype == TSL_F64, "loss: dtype");
    if (a->kind == TSL_LOSS_CROSS_ENTROPY)
        cross_entropy(a, x, target, grad, acc);
    else
        mse(a, x, target, grad, acc);
}

static void loss_cpu(void *buffers[], void *cl_arg)
{
    tsl_loss_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    unsigned nbuffers = starpu_task_get_current()->nbuffers;
    TSL_CODELET_CHECK(nbuffers == 3 || nbuffers == 4, "loss: buffers");
    tsl_acc *acc = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[2]);
    tsl_acc_init(acc);
    tsl_loss_tile(&a, (const void *)STARPU_VECTOR_GET_PTR(buffers[0]),
                  (const void *)STARPU_VECTOR_GET_PTR(buffers[1]),
                  nbuffers == 4 ? (void *)STARPU_VECTOR_GET_PTR(buffers[3]) : NULL, acc);
    tsl_acc_normalize(acc);
}

static struct starpu_perfmodel loss_model = {
    .type = STARPU_HISTORY_BASED,
    .symbol = "tsl_loss",
};

/* R x, R target, W accumulator, optionally W gradient. */
struct starpu_codelet tsl_cl_loss = {
    .cpu_funcs = {loss_cpu},
    .cpu_funcs_name = {"loss_cpu"},
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .model = &loss_model,
    .name = "tsl_loss",
};
