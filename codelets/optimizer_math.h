/* Optimizer element functions (PyTorch's torch.optim.SGD and Adam / AdamW, single-tensor path),
 * in double whatever the parameter's dtype: the per-element math of codelets/optimizer.c's
 * loops and codelets/optimizer.cu's kernels. The CUDA file is compiled without multiply-add
 * contraction (-fmad=false) and CUDA's double sqrt and division round correctly, as the CPU's:
 * the same bits. */
#ifndef TESSEL_CODELETS_OPTIMIZER_MATH_H
#define TESSEL_CODELETS_OPTIMIZER_MATH_H

#include <math.h>

#include "hd.h"
#include "tessel/ops.h"

/* One element of SGD: the new parameter value; *b is the momentum buffer's value (in: the
 * previous one, not read on the first step), when there is one. */
static inline TSL_HD double tsl_sgd_element(const tsl_sgd_config *c, int first, int momentum,
                                            double p, double g, double *b)
{
    g += c->weight_decay * p;
    if (momentum) {
        *b = first ? g : c->momentum * *b + (1.0 - c->dampening) * g;
        g = c->nesterov ? g + c->momentum * *b : *b;
    }
    return p - c->lr * g;
}

/* One element of Adam: the new parameter value; *m and *v are the moments (in: previous).
 * step_size = lr / (1 - beta1^step), bias2_sqrt = sqrt(1 - beta2^step), once per tile. */
static inline TSL_HD double tsl_adam_element(const tsl_adam_config *c, double step_size,
                                             double bias2_sqrt, double p, double g, double *m,
                                             double *v)
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

#endif /* TESSEL_CODELETS_OPTIMIZER_MATH_H */
