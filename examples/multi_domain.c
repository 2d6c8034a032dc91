/* Multi-domain training with the zoo's domain separation network (`dsn`): every sample is one
 * object seen by K instruments (K domains, one input channel each: here three classes of
 * stripe and checker patterns, drawn by domain 0 as they are and by the others with inverted
 * contrast, other scales and offsets). Only domain 0's labels train the classifier; the other
 * domains take part through their reconstructions, the difference of their private and shared
 * codes and the similarity of their shared codes with domain 0's (graph/zoo.c).
 *
 *   mpirun -np R ./example_multi_domain [STEPS] [SEED] [DOMAINS]
 *
 * DOMAINS (default 2, at most 10) domains on R ranks: R = 1 holds them all; R a multiple of
 * DOMAINS puts each domain's encoders and decoder on its own group of R / DOMAINS ranks (plan
 * domains=K, with data=R/K inside each group), the shared weights with domain 0's group, whose
 * copies every other group refreshes before the forward and whose gradients they send back.
 * Prints the loss of every step, then the test accuracy of the classifier on each domain's
 * images (domain d's image in domain 0's place: what the shared encoder learnt carries over to
 * the domains without labels). The same seed gives the same losses at every rank count (to
 * float rounding; tests/cli/multi_domain_check.py checks 1, 2 and 4 ranks). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "tessel/tessel.h"

#define CLASSES 3
#define SIDE 16
#define BATCH 16 /* samples per step */
#define TEST 96  /* test samples */

#define TRY(call)                                                                                  \
    do {                                                                                           \
        tsl_status st_ = (call);                                                                   \
        if (st_ != TSL_OK) {                                                                       \
            fprintf(stderr, "%s failed: %s\n", #call, tsl_last_error());                           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* n samples of k domains from `seed`: class 0 horizontal stripes, 1 vertical stripes, 2 a
 * checkerboard, at a random phase; domain d's channel draws the pattern with its own contrast
 * and offset, plus noise. With `first` set, domain `first`'s image goes to channel 0 and the
 * others follow in turn (channel c holds domain (c + first) mod k). */
static void make_data(int k, int first, int64_t n, uint64_t seed, float *x, int64_t *y)
{
    uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
#define NEXT() (state = state * 6364136223846793005ULL + 1442695040888963407ULL, state >> 33)
    for (int64_t i = 0; i < n; i++) {
        int64_t c = (int64_t)(NEXT() % CLASSES), phase = (int64_t)(NEXT() % 2);
        y[i] = c;
        for (int ch = 0; ch < k; ch++) {
            int d = (ch + first) % k;
            double gain = d == 0 ? 1.0 : d % 2 ? -2.0 : 1.0 + 0.5 * d, offset = d % 2 ? 1.5 : 0.0;
            for (int r = 0; r < SIDE; r++)
                for (int q = 0; q < SIDE; q++) {
                    int64_t on = c == 0   ? (r / 2 + phase) % 2
                                 : c == 1 ? (q / 2 + phase) % 2
                                          : ((r / 2) + (q / 2) + phase) % 2;
                    double noise = ((double)(NEXT() % 2001) / 1000.0 - 1.0) * 0.6;
                    x[((i * k + ch) * SIDE + r) * SIDE + q] =
                        (float)(offset + gain * (double)on + noise);
                }
        }
    }
#undef NEXT
}

int main(int argc, char **argv)
{
    int64_t steps = argc > 1 ? atoll(argv[1]) : 40;
    uint64_t seed = argc > 2 ? (uint64_t)atoll(argv[2]) : 1;
    int k = argc > 3 ? atoi(argv[3]) : 2;
    tsl_context_t ctx;
    TRY(tsl_context_create(&ctx, NULL));
    int32_t rank, size;
    tsl_context_rank(ctx, &rank);
    tsl_context_size(ctx, &size);
    if (steps < 1 || k < 2 || k > 10 || (size > 1 && size % k != 0)) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: mpirun -np R example_multi_domain [STEPS >= 1] [SEED] [DOMAINS 2 to "
                    "10], R = 1 or a multiple of %d\n",
                    k);
        tsl_context_destroy(ctx);
        return 2;
    }
    const int64_t sample[3] = {k, SIDE, SIDE};
    tsl_graph_t graph;
    TRY(tsl_zoo_graph("dsn", 3, sample, CLASSES, &graph));
    char text[64];
    snprintf(text, sizeof text, size / k > 1 ? "domains=%d,data=%d" : "domains=%d", k,
             (int)(size / k));
    tsl_plan plan;
    TRY(tsl_plan_parse(text, &plan));
    tsl_model_t model;
    TRY(tsl_model_create_plan(&model, ctx, graph, seed, size > 1 ? &plan : NULL));
    tsl_adam_config ac;
    tsl_adam_config_init(&ac);
    ac.lr = 0.01;
    tsl_optimizer_t opt;
    TRY(tsl_optimizer_create_adam(&opt, ctx, &ac));

    const int64_t per = (int64_t)k * SIDE * SIDE;
    float *x = malloc(sizeof(float) * (size_t)(TEST * per));
    int64_t *y = malloc(sizeof(int64_t) * TEST);
    if (!x || !y)
        return 1;
    if (rank == 0)
        printf("multi-domain training: %d domains, %d ranks (plan %s), batch %d, %lld steps\n", k,
               (int)size, size > 1 ? text : "one rank", BATCH, (long long)steps);
    for (int64_t step = 0; step < steps; step++) {
        double loss = 0;
        make_data(k, 0, BATCH, seed * 1000003ULL + (uint64_t)step, x, y);
        TRY(tsl_model_train_step(model, BATCH, x, y, opt, &loss, NULL));
        if (rank == 0)
            printf("step %lld loss %.9f\n", (long long)step + 1, loss);
    }
    for (int d = 0; d < k; d++) {
        make_data(k, d, TEST, seed * 7919ULL + 999983ULL, x, y);
        double loss = 0;
        int64_t hits = 0;
        TRY(tsl_model_evaluate(model, TEST, x, y, &loss, &hits));
        if (rank == 0)
            printf("domain %d test accuracy %.4f\n", d, (double)hits / TEST);
    }
    free(x);
    free(y);
    tsl_optimizer_destroy(opt);
    tsl_model_destroy(model);
    tsl_graph_destroy(graph);
    tsl_context_destroy(ctx);
    return 0;
}
