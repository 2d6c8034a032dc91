/* Losses of one tile: the per-position losses go into an exact accumulator (so the mean
 * over all tiles is the same for every tiling) and, if asked, the gradient of the mean loss
 * is written in the same pass.
 *
 * Softmax cross-entropy: logits tile (n, C, inner...), labels tile (n, inner...); the loss
 * at a position is logsumexp(x[:]) - x[label]; its gradient softmax(x) - onehot(label),
 * times `scale` (1 / positions in the whole tensor). MSE: (x - t)^2 per element, gradient
 * 2 (x - t) * scale. */
#include <math.h>

#include "codelet.h"
#include "loss.h"
#include "loss_math.h"

#define CLASS_STRIDE(a) tsl_loss_class_stride(a)
#define LOGIT_BASE(a, s, v) tsl_loss_logit_base((a), (s), (v))

/* Positions a block of the vectorised cross-entropy takes, and the most classes it handles
 * (its logits live in a local block of CE_BLOCK x CE_MAX_CLASSES doubles, 16 KiB). */
#define CE_BLOCK 64
#define CE_MAX_CLASSES 32

/* Cross-entropy of the positions v0 .. v0 + n - 1 of sample s (n <= CE_BLOCK, classes <=
 * CE_MAX_CLASSES): the operations of tsl_loss_cross_entropy_at() on each position, in loops
 * over the positions that the compiler vectorises (tessel's exp and the log of a normal number
 * have no branches); the same bits. The good positions' losses go to loss[], their count is
 * returned; bad labels are flagged, their gradient zero. */
TSL_VECTOR_KERNEL
static int64_t cross_entropy_block(const tsl_loss_args *a, const void *x, const void *labels,
                                   void *grad, int64_t s, int64_t v0, int64_t n, double *loss,
                                   tsl_acc *acc)
{
    const int64_t C = a->classes, stride = tsl_loss_class_stride(a);
    const int plain_f32 = a->dtype == TSL_F32 && !a->channels_last; /* positions contiguous */
    double xs[CE_MAX_CLASSES][CE_BLOCK], top[CE_BLOCK], sum[CE_BLOCK], lse[CE_BLOCK];
    int64_t label[CE_BLOCK], base[CE_BLOCK], bad[CE_BLOCK];
    for (int64_t j = 0; j < n; j++) {
        base[j] = tsl_loss_logit_base(a, s, v0 + j);
        label[j] = tsl_loss_label(a->label_dtype, labels, s * a->inner + v0 + j);
        bad[j] = (uint64_t)label[j] >= (uint64_t)C; /* below 0 or C and above */
    }
    for (int64_t c = 0; c < C; c++) {
        if (plain_f32) {
            const float *xc = (const float *)x + base[0] + c * stride;
            for (int64_t j = 0; j < n; j++)
                xs[c][j] = (double)xc[j];
        } else {
            for (int64_t j = 0; j < n; j++)
                xs[c][j] = tsl_loss_load(a->dtype, x, base[j] + c * stride);
        }
    }
    /* the largest logit (NaNs ignored, as fmax from -inf does) and the sum of exp(x - top) */
    for (int64_t j = 0; j < n; j++) {
        top[j] = -INFINITY;
        sum[j] = 0;
    }
    for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < n; j++)
            top[j] = xs[c][j] > top[j] ? xs[c][j] : top[j];
    for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < n; j++)
            sum[j] = tsl_hd_add(sum[j], tsl_hd_exp(tsl_hd_sub(xs[c][j], top[j])));
    int special = 0;
    for (int64_t j = 0; j < n; j++) {
        int ok = tsl_hd_log_normal_ok(sum[j]);
        special |= !ok;
        lse[j] = tsl_hd_add(top[j], tsl_hd_log_normal(ok ? sum[j] : 1.0));
    }
    if (special) /* NaN or infinite logits */
        for (int64_t j = 0; j < n; j++)
            if (!tsl_hd_log_normal_ok(sum[j]))
                lse[j] = tsl_hd_add(top[j], tsl_hd_log(sum[j]));
    int64_t good = 0;
    for (int64_t j = 0; j < n; j++) {
        if (bad[j]) {
            acc->flagged++;
            continue;
        }
        loss[good++] = tsl_hd_sub(lse[j], xs[label[j]][j]);
    }
    if (!grad)
        return good;
    /* the gradients, in place of the logits, then stored (zero at a bad label) */
    for (int64_t c = 0; c < C; c++)
        for (int64_t j = 0; j < n; j++) {
            double p = tsl_hd_exp(tsl_hd_sub(xs[c][j], lse[j]));
            double g = tsl_hd_mul(tsl_hd_sub(p, label[j] == c ? 1.0 : 0.0), a->scale);
            xs[c][j] = bad[j] ? 0.0 : g;
        }
    for (int64_t c = 0; c < C; c++) {
        if (plain_f32) {
            float *gc = (float *)grad + base[0] + c * stride;
            for (int64_t j = 0; j < n; j++)
                gc[j] = (float)xs[c][j];
        } else {
            for (int64_t j = 0; j < n; j++)
                tsl_loss_store(a->dtype, grad, base[j] + c * stride, xs[c][j]);
        }
    }
    return good;
}

static void cross_entropy(const tsl_loss_args *a, const void *x, const void *labels, void *grad,
                          tsl_acc *acc)
{
    if (a->classes <= CE_MAX_CLASSES) {
        double loss[CE_BLOCK];
        for (int64_t s = 0; s < a->samples; s++)
            for (int64_t v0 = 0; v0 < a->inner; v0 += CE_BLOCK) {
                int64_t n = a->inner - v0 < CE_BLOCK ? a->inner - v0 : CE_BLOCK;
                int64_t good = cross_entropy_block(a, x, labels, grad, s, v0, n, loss, acc);
                for (int64_t j = 0; j < good; j++)
                    tsl_acc_add(acc, loss[j]);
            }
        return;
    }
    for (int64_t s = 0; s < a->samples; s++) {
        for (int64_t v = 0; v < a->inner; v++) {
            int64_t base = LOGIT_BASE(a, s, v); /* x[s, c, v] = base + c * CLASS_STRIDE(a) */
            int64_t label = tsl_loss_label(a->label_dtype, labels, s * a->inner + v);
            if (label < 0 || label >= a->classes) {
                acc->flagged++;
                if (grad)
                    tsl_loss_zero_at(a, base, grad);
                continue;
            }
            tsl_acc_add(acc, tsl_loss_cross_entropy_at(a, x, base, label, grad));
        }
    }
}

static void mse(const tsl_loss_args *a, const void *x, const void *target, void *grad, tsl_acc *acc)
{
    int64_t n = a->samples * a->classes * a->inner;
    for (int64_t i = 0; i < n; i++)
        tsl_acc_add(acc, tsl_loss_mse_at(a, x, target, i, grad));
}

static void l1(const tsl_loss_args *a, const void *x, const void *target, void *grad, tsl_acc *acc)
{
    int64_t n = a->samples * a->classes * a->inner;
    for (int64_t i = 0; i < n; i++)
        tsl_acc_add(acc, tsl_loss_l1_at(a, x, target, i, grad));
}

/* Positions whose first maximum over classes is the label; bad labels are flagged. */
static void argmax_hits(const tsl_loss_args *a, const void *x, const void *labels, tsl_acc *acc)
{
    int64_t hits = 0;
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t v = 0; v < a->inner; v++) {
            int64_t label = tsl_loss_label(a->label_dtype, labels, s * a->inner + v);
            if (label < 0 || label >= a->classes) {
                acc->flagged++;
                continue;
            }
            hits += tsl_loss_hit_at(a, x, LOGIT_BASE(a, s, v), label);
        }
    tsl_acc_add(acc, (double)hits);
}

void tsl_loss_tile(const tsl_loss_args *a, const void *x, const void *target, void *grad,
                   tsl_acc *acc)
{
    TSL_CODELET_CHECK(a->dtype == TSL_F32 || a->dtype == TSL_F64, "loss: dtype");
    if (a->kind == TSL_LOSS_CROSS_ENTROPY)
        cross_entropy(a, x, target, grad, acc);
    else if (a->kind == TSL_LOSS_HITS)
        argmax_hits(a, x, target, acc);
    else if (a->kind == TSL_LOSS_L1)
        l1(a, x, target, grad, acc);
    else
        mse(a, x, target, grad, acc);
}

/* Softmax over classes at one position into p[C] (the bits of tsl_dice_p: exp(x - top) /
 * total, each exponential computed once); returns 0 for a bad label. */
static int softmax_at(const tsl_loss_args *a, const void *x, const void *labels, int64_t s,
                      int64_t v, double *p, int64_t *label)
{
    const int64_t C = a->classes, inner = a->inner, base = LOGIT_BASE(a, s, v);
    *label = tsl_loss_label(a->label_dtype, labels, s * inner + v);
    double top = -INFINITY, total = 0;
    for (int64_t c = 0; c < C; c++)
        top = fmax(top, tsl_loss_load(a->dtype, x, base + c * CLASS_STRIDE(a)));
    for (int64_t c = 0; c < C; c++) {
        p[c] = tsl_hd_exp(tsl_hd_sub(tsl_loss_load(a->dtype, x, base + c * CLASS_STRIDE(a)), top));
        total = tsl_hd_add(total, p[c]);
    }
    for (int64_t c = 0; c < C; c++)
        p[c] = tsl_hd_div(p[c], total);
    return *label >= 0 && *label < C;
}

#define DICE_MAX_CLASSES 1024

void tsl_dice_stats_tile(const tsl_loss_args *a, const void *x, const void *labels, tsl_acc *acc)
{
    double p[DICE_MAX_CLASSES];
    TSL_CODELET_CHECK(a->classes <= DICE_MAX_CLASSES, "dice: too many classes");
    for (int64_t k = 0; k < 3 * a->classes; k++)
        tsl_acc_init(&acc[k]);
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t v = 0; v < a->inner; v++) {
            int64_t label;
            if (!softmax_at(a, x, labels, s, v, p, &label)) {
                acc[0].flagged++;
                continue;
            }
            for (int64_t c = 0; c < a->classes; c++)
                tsl_acc_add(&acc[3 * c + 1], p[c]);
            tsl_acc_add(&acc[3 * label], p[label]);
            tsl_acc_add(&acc[3 * label + 2], 1.0);
        }
    for (int64_t k = 0; k < 3 * a->classes; k++)
        tsl_acc_normalize(&acc[k]);
}

void tsl_dice_coef(const tsl_loss_args *a, const tsl_acc *acc, double *coef)
{
    for (int64_t c = 0; c < a->classes; c++)
        tsl_dice_coef_class(tsl_acc_round(&acc[3 * c]), tsl_acc_round(&acc[3 * c + 1]),
                            tsl_acc_round(&acc[3 * c + 2]), a->smooth, (double)a->classes, &coef[c],
                            &coef[a->classes + c]);
}

double tsl_dice_loss(const tsl_loss_args *a, const tsl_acc *acc)
{
    double mean = 0;
    for (int64_t c = 0; c < a->classes; c++) {
        double inter = tsl_acc_round(&acc[3 * c]);
        double S = tsl_acc_round(&acc[3 * c + 1]) + tsl_acc_round(&acc[3 * c + 2]) + a->smooth;
        mean += (2.0 * inter + a->smooth) / S;
    }
    return 1.0 - mean / (double)a->classes;
}

void tsl_dice_grad_tile(const tsl_loss_args *a, const void *x, const void *labels,
                        const double *coef, void *grad)
{
    double p[DICE_MAX_CLASSES];
    TSL_CODELET_CHECK(a->classes <= DICE_MAX_CLASSES, "dice: too many classes");
    const int64_t C = a->classes, inner = a->inner;
    for (int64_t s = 0; s < a->samples; s++)
        for (int64_t v = 0; v < inner; v++) {
            int64_t label, base = LOGIT_BASE(a, s, v);
            if (!softmax_at(a, x, labels, s, v, p, &label)) {
                tsl_loss_zero_at(a, base, grad);
                continue;
            }
            /* dloss/dp_c, then through the softmax: dz_c = p_c (dp_c - sum_k p_k dp_k). */
            double dot = 0;
            for (int64_t c = 0; c < C; c++)
                dot = tsl_hd_add(dot, tsl_hd_mul(p[c], tsl_dice_dp(coef, C, c, label)));
            for (int64_t c = 0; c < C; c++)
                tsl_store(a->dtype, grad, base + c * CLASS_STRIDE(a),
                          tsl_hd_mul(p[c], tsl_hd_sub(tsl_dice_dp(coef, C, c, label), dot)));
        }
}

static void dice_stats_cpu(void *buffers[], void *cl_arg)
{
    tsl_loss_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_dice_stats_tile(&a, (const void *)STARPU_VECTOR_GET_PTR(buffers[0]),
                        (const void *)STARPU_VECTOR_GET_PTR(buffers[1]),
                        (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[2]));
}

static void dice_coef_cpu(void *buffers[], void *cl_arg)
{
    tsl_loss_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_dice_coef(&a, (const tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[0]),
                  (double *)STARPU_VECTOR_GET_PTR(buffers[1]));
}

static void dice_grad_cpu(void *buffers[], void *cl_arg)
{
    tsl_loss_args a;
    starpu_codelet_unpack_args(cl_arg, &a);
    tsl_dice_grad_tile(&a, (const void *)STARPU_VECTOR_GET_PTR(buffers[0]),
                       (const void *)STARPU_VECTOR_GET_PTR(buffers[1]),
                       (const double *)STARPU_VECTOR_GET_PTR(buffers[2]),
                       (void *)STARPU_VECTOR_GET_PTR(buffers[3]));
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

void tsl_difference_tile(const tsl_diff_args *d, const void *a, const void *b, double *gram,
                         tsl_acc *acc, void *da, void *db)
{
    const int64_t n = d->n;
    double *ga = gram, *gb = gram + n * n;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            ga[i * n + j] = tsl_diff_gram(d->dtype, a, d->fa, i, j);
            gb[i * n + j] = tsl_diff_gram(d->dtype, b, d->fb, i, j);
        }
    for (int64_t e = 0; e < n * n; e++)
        tsl_acc_add(acc, tsl_hd_mul(ga[e], gb[e]));
    for (int64_t i = 0; da && i < n; i++)
        for (int64_t k = 0; k < d->fa; k++)
            tsl_loss_store(d->dtype, da, i * d->fa + k,
                           tsl_diff_grad(d->dtype, a, n, d->fa, gb, i, k));
    for (int64_t i = 0; db && i < n; i++)
        for (int64_t k = 0; k < d->fb; k++)
            tsl_loss_store(d->dtype, db, i * d->fb + k,
                           tsl_diff_grad(d->dtype, b, n, d->fb, ga, i, k));
}

/* pair_cpu: the buffers and sizes (scratch doubles per n^2). */
static int pair_buffers_ok(void *buffers[], unsigned nbuffers, const tsl_diff_args *d,
                           int64_t scratch)
{
    return (nbuffers == 4 || nbuffers == 6) && (d->dtype == TSL_F32 || d->dtype == TSL_F64) &&
           d->n >= 0 && d->fa >= 0 && d->fb >= 0 &&
           (int64_t)STARPU_VECTOR_GET_NX(buffers[0]) >= d->n * d->fa &&
           (int64_t)STARPU_VECTOR_GET_NX(buffers[1]) >= d->n * d->fb &&
           (int64_t)STARPU_VECTOR_GET_NX(buffers[2]) >= scratch * d->n * d->n;
}

void tsl_similarity_tile(const tsl_diff_args *d, const void *a, const void *b, double *w,
                         tsl_acc *acc, void *da, void *db)
{
    const int64_t n = d->n, f = d->fa, nn = n * n;
    double *waa = w, *wbb = w + nn, *wab = w + 2 * nn;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            double k;
            tsl_mmd_kernel(tsl_mmd_dist(d->dtype, a, a, f, i, j), &k, &waa[i * n + j]);
            tsl_acc_add(acc, k);
            tsl_mmd_kernel(tsl_mmd_dist(d->dtype, b, b, f, i, j), &k, &wbb[i * n + j]);
            tsl_acc_add(acc, k);
            tsl_mmd_kernel(tsl_mmd_dist(d->dtype, a, b, f, i, j), &k, &wab[i * n + j]);
            tsl_acc_add(acc, tsl_hd_mul(-2.0, k));
        }
    for (int64_t i = 0; da && i < n; i++)
        for (int64_t k = 0; k < f; k++) {
            tsl_loss_store(d->dtype, da, i * f + k,
                           tsl_mmd_grad(d->dtype, a, b, n, f, waa, wab, n, 1, i, k));
            tsl_loss_store(d->dtype, db, i * f + k,
                           tsl_mmd_grad(d->dtype, b, a, n, f, wbb, wab, 1, n, i, k));
        }
}

/* The difference and similarity codelets: R a, R b, W scratch (`scratch` doubles per n^2),
 * W acc, and W da, W db for the gradient; the similarity compares values of one width. */
typedef void (*pair_tile_fn)(const tsl_diff_args *, const void *, const void *, double *, tsl_acc *,
                             void *, void *);
static void pair_cpu(void *buffers[], void *cl_arg, int64_t scratch, int same_features,
                     pair_tile_fn tile, const char *what)
{
    tsl_diff_args d;
    starpu_codelet_unpack_args(cl_arg, &d);
    unsigned nbuffers = starpu_task_get_current()->nbuffers;
    TSL_CODELET_CHECK(
        pair_buffers_ok(buffers, nbuffers, &d, scratch) && (!same_features || d.fa == d.fb), what);
    tsl_acc *acc = (tsl_acc *)STARPU_VECTOR_GET_PTR(buffers[3]);
    tsl_acc_init(acc);
    tile(&d, (const void *)STARPU_VECTOR_GET_PTR(buffers[0]),
         (const void *)STARPU_VECTOR_GET_PTR(buffers[1]),
         (double *)STARPU_VECTOR_GET_PTR(buffers[2]), acc,
         nbuffers == 6 ? (void *)STARPU_VECTOR_GET_PTR(buffers[4]) : NULL,
         nbuffers == 6 ? (void *)STARPU_VECTOR_GET_PTR(buffers[5]) : NULL);
    tsl_acc_normalize(acc);
}

static void difference_cpu(void *buffers[], void *cl_arg)
{
    pair_cpu(buffers, cl_arg, 2, 0, tsl_difference_tile, "difference: buffers and sizes");
}

static void similarity_cpu(void *buffers[], void *cl_arg)
{
    pair_cpu(buffers, cl_arg, 3, 1, tsl_similarity_tile, "similarity: buffers and sizes");
}

static uint32_t pair_variant(struct starpu_task *task)
{
    tsl_diff_args d;
    starpu_codelet_unpack_args(task->cl_arg, &d);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, d.dtype);
    h = tsl_hash_i64(h, d.n);
    return tsl_hash_i64(h, d.fa * 65537 + d.fb);
}

/* The footprint: the tile sizes, the loss, the dtypes, the layout and the classes. */
static uint32_t loss_variant(struct starpu_task *task)
{
    tsl_loss_args a;
    starpu_codelet_unpack_args(task->cl_arg, &a);
    uint32_t h = starpu_task_data_footprint(task);
    h = tsl_hash_i64(h, a.kind);
    h = tsl_hash_i64(h, a.dtype);
    h = tsl_hash_i64(h, a.label_dtype);
    h = tsl_hash_i64(h, a.channels_last);
    return tsl_hash_i64(h, a.classes);
}

/* R x, R target, W accumulator, optionally W gradient. */
TSL_CODELET(tsl_cl_loss, "tsl_loss", loss_cpu, tsl_loss_cuda, loss_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_difference, "tsl_difference", difference_cpu, tsl_difference_cuda, pair_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_similarity, "tsl_similarity", similarity_cpu, tsl_similarity_cuda, pair_variant,
            .nbuffers = STARPU_VARIABLE_NBUFFERS);
TSL_CODELET(tsl_cl_dice_stats, "tsl_dice_stats", dice_stats_cpu, tsl_dice_stats_cuda, loss_variant,
            .nbuffers = 3, .modes = {STARPU_R, STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_dice_coef, "tsl_dice_coef", dice_coef_cpu, tsl_dice_coef_cuda, loss_variant,
            .nbuffers = 2, .modes = {STARPU_R, STARPU_W});
TSL_CODELET(tsl_cl_dice_grad, "tsl_dice_grad", dice_grad_cpu, tsl_dice_grad_cuda, loss_variant,
            .nbuffers = 4, .modes = {STARPU_R, STARPU_R, STARPU_R, STARPU_W});
