/* Multi-domain training, domain-separation style: two input domains (the same three classes
 * drawn in two different appearances), each with a private encoder, and a shared encoder and
 * classifier whose weights both domains train.
 *
 *   mpirun -np R ./example_multi_domain [STEPS] [SEED]     (R = 1, or an even rank count)
 *
 * The plan is data=2 with domain-private parameters: domain d's samples live on its own rank
 * group (ranks d R/2 .. (d+1) R/2 - 1; both on rank 0 when R = 1), one sample tile per rank of
 * the group. Domain d's private encoder weights are owned by its group's first rank, so its
 * tasks and its gradient never leave the group. The shared encoder and the classifier run on
 * each domain's tiles where they live; their gradients are reduced inside each group by task
 * trees and then across the two groups by one add task, and the optimizer updates them on
 * rank 0; the updated weights reach the groups by StarPU-MPI transfers. No call moves data by
 * hand. Per sample of domain d:
 *
 *   h = ReLU(conv3x3_private_d(x))   s = ReLU(conv3x3_shared(x))       (8 channels each)
 *   logits = linear(global_average_pool(concat(h, s)))                 (3 classes)
 *
 * The loss is the mean cross-entropy over both domains' samples. Prints the loss of every
 * step, then the test accuracy per domain; the same seed gives the same losses at every rank
 * count (to float rounding; tests/cli/multi_domain_check.py checks 1, 2 and 4 ranks). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tessel/tessel.h"

#define DOMAINS 2
#define CLASSES 3
#define SIDE 16
#define FEATURES 8
#define BATCH 16 /* per domain and step */
#define TEST 96  /* test samples per domain */

#define TRY(call)                                                                                  \
    do {                                                                                           \
        tsl_status st_ = (call);                                                                   \
        if (st_ != TSL_OK) {                                                                       \
            fprintf(stderr, "%s failed: %s\n", #call, tsl_last_error());                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct group {
    int32_t first, count; /* the ranks of one domain */
} group;

static int32_t in_group(const int32_t *tile, int32_t ndim, const tsl_tile_grid *grid,
                        int32_t nranks, void *user)
{
    (void)ndim;
    (void)grid;
    (void)nranks;
    const group *g = user;
    return g->first + tile[0] % g->count;
}

static tsl_context_t ctx;

/* A (n, dims...) tensor cut into the group's sample tiles. */
static tsl_tensor_t batch_tensor(group *g, tsl_dtype dt, int64_t n, int32_t ndim,
                                 const int64_t *dims)
{
    int64_t all[TSL_MAX_DIMS] = {n};
    for (int32_t k = 0; k < ndim; k++)
        all[k + 1] = dims[k];
    tsl_shape s;
    TRY(tsl_shape_make(&s, ndim + 1, all));
    tsl_tile_grid grid = tsl_tile_grid_single();
    grid.splits[0] = g->count < n ? g->count : (int32_t)n;
    tsl_owner_map owners = tsl_owner_callback(in_group, g);
    tsl_tensor_t t;
    TRY(tsl_tensor_create(&t, ctx, dt, &s, &grid, &owners));
    return t;
}

/* One tile on `rank`. */
static tsl_tensor_t param(int32_t rank, int32_t ndim, const int64_t *dims)
{
    tsl_shape s;
    TRY(tsl_shape_make(&s, ndim, dims));
    tsl_owner_map on = tsl_owner_single(rank);
    tsl_tensor_t t;
    TRY(tsl_tensor_create(&t, ctx, TSL_F32, &s, NULL, &on));
    return t;
}

/* The activations and gradients of one domain's batch (n samples). */
typedef struct pass {
    tsl_tensor_t x, labels, hp, h, sp, s, z, pooled, feat, logits;
    tsl_tensor_t dlogits, dfeat, dpooled, dz, dh, ds, dhp, dsp;
} pass;

static void pass_make(pass *p, group *g, int64_t n)
{
    const int64_t img[3] = {1, SIDE, SIDE}, half[3] = {FEATURES, SIDE, SIDE},
                  both[3] = {2 * FEATURES, SIDE, SIDE}, pooled[3] = {2 * FEATURES, 1, 1},
                  feat[1] = {2 * FEATURES}, classes[1] = {CLASSES};
    p->x = batch_tensor(g, TSL_F32, n, 3, img);
    p->labels = batch_tensor(g, TSL_I64, n, 0, NULL);
    tsl_tensor_t *halves[] = {&p->hp, &p->h, &p->sp, &p->s, &p->dh, &p->ds, &p->dhp, &p->dsp};
    for (size_t k = 0; k < sizeof halves / sizeof *halves; k++)
        *halves[k] = batch_tensor(g, TSL_F32, n, 3, half);
    p->z = batch_tensor(g, TSL_F32, n, 3, both);
    p->dz = batch_tensor(g, TSL_F32, n, 3, both);
    p->pooled = batch_tensor(g, TSL_F32, n, 3, pooled);
    p->dpooled = batch_tensor(g, TSL_F32, n, 3, pooled);
    p->feat = batch_tensor(g, TSL_F32, n, 1, feat);
    p->dfeat = batch_tensor(g, TSL_F32, n, 1, feat);
    p->logits = batch_tensor(g, TSL_F32, n, 1, classes);
    p->dlogits = batch_tensor(g, TSL_F32, n, 1, classes);
}

static void pass_free(pass *p)
{
    tsl_tensor_t *all = (tsl_tensor_t *)p;
    for (size_t k = 0; k < sizeof *p / sizeof(tsl_tensor_t); k++)
        tsl_tensor_destroy(all[k]);
}

/* Weights: per domain the private convolution; shared: convolution and classifier. */
enum { PW, PB, NPRIVATE };
enum { SW, SB, LW, LB, NSHARED };
static tsl_tensor_t priv[DOMAINS][NPRIVATE], dpriv[DOMAINS][NPRIVATE];
static tsl_tensor_t shared[NSHARED], dshared[NSHARED], dpart[DOMAINS][NSHARED];
static tsl_conv_params conv;
static tsl_pool_params gap;

static void forward(int d, pass *p)
{
    const tsl_activation relu = TSL_ACT_RELU;
    TRY(tsl_conv_forward(&conv, p->x, priv[d][PW], priv[d][PB], p->hp));
    TRY(tsl_activation_forward(relu, 0, p->hp, p->h));
    TRY(tsl_conv_forward(&conv, p->x, shared[SW], shared[SB], p->sp));
    TRY(tsl_activation_forward(relu, 0, p->sp, p->s));
    tsl_tensor_t parts[2] = {p->h, p->s};
    TRY(tsl_concat_channels(2, parts, p->z));
    TRY(tsl_pool_forward(&gap, p->z, p->pooled));
    TRY(tsl_reshape_samples(p->pooled, p->feat));
    TRY(tsl_linear_forward(p->feat, shared[LW], shared[LB], p->logits));
}

/* Backward from dlogits: private gradients into dpriv[d], shared ones into dpart[d]. */
static void backward(int d, pass *p)
{
    const tsl_activation relu = TSL_ACT_RELU;
    TRY(tsl_linear_backward(p->feat, shared[LW], p->dlogits, p->dfeat, dpart[d][LW], dpart[d][LB]));
    TRY(tsl_reshape_samples(p->dfeat, p->dpooled));
    TRY(tsl_pool_backward(&gap, p->z, p->dpooled, p->dz));
    tsl_tensor_t parts[2] = {p->dh, p->ds};
    TRY(tsl_split_channels(p->dz, 2, parts));
    TRY(tsl_activation_backward(relu, 0, p->hp, p->h, p->dh, p->dhp));
    TRY(tsl_activation_backward(relu, 0, p->sp, p->s, p->ds, p->dsp));
    TRY(tsl_conv_backward(&conv, p->x, priv[d][PW], p->dhp, NULL, dpriv[d][PW], dpriv[d][PB]));
    TRY(tsl_conv_backward(&conv, p->x, shared[SW], p->dsp, NULL, dpart[d][SW], dpart[d][SB]));
}

/* n samples of domain d from `seed` on rank 0: class 0 horizontal stripes, 1 vertical
 * stripes, 2 a checkerboard, at a random phase, with noise; domain 1 draws them with inverted
 * contrast at another scale and offset. */
static void make_data(int d, int64_t n, uint64_t seed, float *x, int64_t *y)
{
    uint64_t state = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)d * 0x632be59bd9b4e019ULL + 1;
#define NEXT() (state = state * 6364136223846793005ULL + 1442695040888963407ULL, state >> 33)
    for (int64_t i = 0; i < n; i++) {
        int64_t c = (int64_t)(NEXT() % CLASSES), phase = (int64_t)(NEXT() % 2);
        y[i] = c;
        for (int r = 0; r < SIDE; r++)
            for (int q = 0; q < SIDE; q++) {
                int64_t on = c == 0   ? (r / 2 + phase) % 2
                             : c == 1 ? (q / 2 + phase) % 2
                                      : ((r / 2) + (q / 2) + phase) % 2;
                double noise = ((double)(NEXT() % 2001) / 1000.0 - 1.0) * 0.6;
                double v = d == 0 ? (double)on : 1.5 - 2.0 * (double)on;
                x[(i * SIDE + r) * SIDE + q] = (float)(v + noise);
            }
    }
#undef NEXT
}

static void load(pass *p, int d, int64_t n, uint64_t seed, int32_t rank)
{
    float *x = rank == 0 ? malloc(sizeof(float) * (size_t)(n * SIDE * SIDE)) : NULL;
    int64_t *y = rank == 0 ? malloc(sizeof(int64_t) * (size_t)n) : NULL;
    if (rank == 0) {
        if (!x || !y)
            exit(1);
        make_data(d, n, seed, x, y);
    }
    TRY(tsl_tensor_scatter(p->x, 0, x));
    TRY(tsl_tensor_scatter(p->labels, 0, y));
    free(x);
    free(y);
}

int main(int argc, char **argv)
{
    int64_t steps = argc > 1 ? atoll(argv[1]) : 40;
    uint64_t seed = argc > 2 ? (uint64_t)atoll(argv[2]) : 1;
    TRY(tsl_context_create(&ctx, NULL));
    int32_t rank, size;
    tsl_context_rank(ctx, &rank);
    tsl_context_size(ctx, &size);
    if (steps < 1 || (size > 1 && size % DOMAINS != 0)) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: mpirun -np R example_multi_domain [STEPS >= 1] [SEED], R = 1 "
                    "or a multiple of %d\n",
                    DOMAINS);
        tsl_context_destroy(ctx);
        return 2;
    }
    group groups[DOMAINS];
    for (int d = 0; d < DOMAINS; d++) {
        groups[d].count = size > 1 ? size / DOMAINS : 1;
        groups[d].first = size > 1 ? d * groups[d].count : 0;
    }
    TRY(tsl_conv_params_init(&conv, 2));
    conv.padding[0] = conv.padding[1] = 1;
    TRY(tsl_pool_params_init(&gap, TSL_POOL_AVG, 2, SIDE));

    const int64_t wconv[4] = {FEATURES, 1, 3, 3}, bconv[1] = {FEATURES},
                  wlin[2] = {CLASSES, 2 * FEATURES}, blin[1] = {CLASSES};
    const int64_t *shapes[NSHARED] = {wconv, bconv, wlin, blin};
    const int32_t ndims[NSHARED] = {4, 1, 2, 1};
    const double bound[NSHARED] = {1.0 / 3.0, 1.0 / 3.0, 0.25, 0.25}; /* 1 / sqrt(fan_in) */
    for (int k = 0; k < NSHARED; k++) {
        shared[k] = param(0, ndims[k], shapes[k]);
        dshared[k] = param(0, ndims[k], shapes[k]);
        TRY(tsl_tensor_fill_uniform(shared[k], seed * 100 + (uint64_t)k, -bound[k], bound[k]));
        for (int d = 0; d < DOMAINS; d++)
            dpart[d][k] = param(groups[d].first, ndims[k], shapes[k]);
    }
    for (int d = 0; d < DOMAINS; d++)
        for (int k = 0; k < NPRIVATE; k++) {
            priv[d][k] = param(groups[d].first, ndims[k], shapes[k]);
            dpriv[d][k] = param(groups[d].first, ndims[k], shapes[k]);
            TRY(tsl_tensor_fill_uniform(priv[d][k], seed * 100 + 10 * (uint64_t)(d + 1) + k,
                                        -bound[k], bound[k]));
        }
    tsl_adam_config ac;
    tsl_adam_config_init(&ac);
    ac.lr = 0.01;
    tsl_optimizer_t opt;
    TRY(tsl_optimizer_create_adam(&opt, ctx, &ac));
    tsl_tensor_t params[NSHARED + DOMAINS * NPRIVATE], grads[NSHARED + DOMAINS * NPRIVATE];
    int32_t np = 0;
    for (int k = 0; k < NSHARED; k++, np++) {
        params[np] = shared[k];
        grads[np] = dshared[k];
    }
    for (int d = 0; d < DOMAINS; d++)
        for (int k = 0; k < NPRIVATE; k++, np++) {
            params[np] = priv[d][k];
            grads[np] = dpriv[d][k];
        }

    pass train[DOMAINS], test[DOMAINS];
    for (int d = 0; d < DOMAINS; d++) {
        pass_make(&train[d], &groups[d], BATCH);
        pass_make(&test[d], &groups[d], TEST);
    }
    if (rank == 0)
        printf("multi-domain training: %d domains, %d ranks (%d per domain), batch %d per "
               "domain, %lld steps\n",
               DOMAINS, (int)size, (int)groups[0].count, BATCH, (long long)steps);
    for (int64_t step = 0; step < steps; step++) {
        double loss = 0;
        for (int d = 0; d < DOMAINS; d++) {
            load(&train[d], d, BATCH, seed * 1000003ULL + (uint64_t)step, rank);
            forward(d, &train[d]);
            double l = 0;
            TRY(tsl_loss_cross_entropy(train[d].logits, train[d].labels, train[d].dlogits, &l));
            TRY(tsl_tensor_scale(train[d].dlogits, 1.0 / DOMAINS)); /* mean over both */
            loss += l / DOMAINS;
            backward(d, &train[d]);
        }
        for (int k = 0; k < NSHARED; k++) /* the shared gradients meet across the domains */
            TRY(tsl_tensor_add(dshared[k], dpart[0][k], dpart[1][k]));
        TRY(tsl_optimizer_step(opt, np, params, grads));
        if (rank == 0)
            printf("step %lld loss %.9f\n", (long long)step + 1, loss);
    }
    for (int d = 0; d < DOMAINS; d++) {
        load(&test[d], d, TEST, seed * 7919ULL + 999983ULL, rank);
        forward(d, &test[d]);
        int64_t hits = 0;
        TRY(tsl_argmax_hits(test[d].logits, test[d].labels, &hits));
        if (rank == 0)
            printf("domain %d test accuracy %.4f\n", d, (double)hits / TEST);
    }
    for (int d = 0; d < DOMAINS; d++) {
        pass_free(&train[d]);
        pass_free(&test[d]);
    }
    tsl_optimizer_destroy(opt);
    for (int k = 0; k < NSHARED; k++) {
        tsl_tensor_destroy(shared[k]);
        tsl_tensor_destroy(dshared[k]);
        for (int d = 0; d < DOMAINS; d++)
            tsl_tensor_destroy(dpart[d][k]);
    }
    for (int d = 0; d < DOMAINS; d++)
        for (int k = 0; k < NPRIVATE; k++) {
            tsl_tensor_destroy(priv[d][k]);
            tsl_tensor_destroy(dpriv[d][k]);
        }
    tsl_context_destroy(ctx);
    return 0;
}
