/* tessel plan: what a plan means for a model on a dataset, without running anything: how the
 * input is tiled, and the estimated tile memory of every rank (tsl_plan_estimate). Pure: no
 * MPI, no StarPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage_plan(FILE *out)
{
    fprintf(out,
            "usage: tessel plan --data SPEC [--model NAME|FILE] [--plan PLAN] [--ranks N]\n"
            "                   [--batch B] [--ncpu W] [--optimizer sgd|adam]\n"
            "  how PLAN (default: samples over all ranks and workers) tiles the model's tensors\n"
            "  on N ranks (default: the plan's rank count) of W CPU workers (default 1), and\n"
            "  the estimated tile memory of every rank for training with batches of B\n"
            "  (default 64): activations, gradients, labels, and on rank 0 the parameters,\n"
            "  their gradients and the optimizer state (adam, the default, keeps two copies;\n"
            "  sgd one)\n");
}

/* How the parameters are kept (tsl_plan_param_placement). */
static int print_placement(const tsl_plan *plan, tsl_graph_t g, int32_t ranks)
{
    int32_t np = tsl_graph_param_count(g), sharded = 0;
    tsl_tile_grid *grids = calloc((size_t)np + 1, sizeof *grids);
    int32_t *owner = calloc((size_t)np + 1, sizeof *owner);
    tsl_status st = grids && owner ? tsl_plan_param_placement(plan, g, ranks, grids, owner)
                                   : TSL_ERR_OUT_OF_MEMORY;
    int64_t bytes[2] = {0, 0};
    for (int32_t i = 0; i < np && !st; i++) {
        tsl_shape s;
        if ((st = tsl_graph_param_info(g, i, NULL, &s, NULL)))
            break;
        sharded += owner[i] < 0;
        bytes[owner[i] < 0] += 4 * tsl_shape_numel(&s);
    }
    if (!st)
        printf("parameters: %d of %d sharded over the ranks (%.2f MiB: weights of %d elements and "
               "more), %d whole on one rank each (%.2f MiB)\n",
               (int)sharded, (int)np, (double)bytes[1] / 1048576.0,
               plan ? (int)plan->shard : TSL_PLAN_SHARD_DEFAULT, (int)(np - sharded),
               (double)bytes[0] / 1048576.0);
    free(grids);
    free(owner);
    return st ? fail(st, "placing the parameters") : 0;
}

int command_plan(int argc, char **argv)
{
    const char *model = "cnn", *data = NULL, *plan_text = NULL, *optimizer = "adam";
    long ranks = 0, batch = 64, workers = 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage_plan(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tessel plan: '%s' needs a value (or is unknown)\n", a);
            usage_plan(stderr);
            return EXIT_USAGE;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (strcmp(a, "--model") == 0)
            model = v;
        else if (strcmp(a, "--data") == 0)
            data = v;
        else if (strcmp(a, "--plan") == 0)
            plan_text = v;
        else if (strcmp(a, "--ranks") == 0)
            bad = parse_int_arg(v, 1, 1 << 20, &ranks);
        else if (strcmp(a, "--batch") == 0)
            bad = parse_int_arg(v, 1, 1L << 24, &batch);
        else if (strcmp(a, "--ncpu") == 0)
            bad = parse_int_arg(v, 1, 4096, &workers);
        else if (strcmp(a, "--optimizer") == 0) {
            bad = strcmp(v, "sgd") && strcmp(v, "adam");
            optimizer = v;
        } else {
            fprintf(stderr, "tessel plan: unknown option '%s'\n", a);
            usage_plan(stderr);
            return EXIT_USAGE;
        }
        if (bad) {
            fprintf(stderr, "tessel plan: bad value '%s' for %s\n", v, a);
            return EXIT_USAGE;
        }
    }
    if (!data) {
        fprintf(stderr, "tessel plan: --data is required\n");
        usage_plan(stderr);
        return EXIT_USAGE;
    }
    tsl_plan plan;
    if (plan_text && tsl_plan_parse(plan_text, &plan) != TSL_OK) {
        fprintf(stderr, "tessel plan: %s\n", tsl_last_error());
        return EXIT_USAGE;
    }
    if (!ranks)
        ranks = plan_text ? (long)tsl_plan_ranks(&plan) : 1;
    tsl_dataset_t ds;
    tsl_status st = tsl_dataset_open(&ds, data, TSL_SPLIT_TRAIN);
    if (st)
        return fail(st, "opening the data");
    tsl_dataset_info info;
    tsl_dataset_get_info(ds, &info);
    tsl_dataset_destroy(ds);
    tsl_graph_t g;
    if ((st = tsl_model_graph(model, info.sample_shape.ndim, info.sample_shape.dims, info.classes,
                              &g)))
        return fail(st, "building the model");
    int32_t states = strcmp(optimizer, "adam") == 0 ? 2 : 1;
    int64_t *bytes = calloc((size_t)ranks, sizeof *bytes), one = 0;
    tsl_tile_grid grid;
    tsl_owner_map owners;
    const tsl_plan *pp = plan_text ? &plan : NULL;
    int code = 0;
    if (!bytes)
        code = fail(TSL_ERR_OUT_OF_MEMORY, "estimating");
    else if ((st = tsl_plan_estimate(pp, g, (int32_t)ranks, (int32_t)workers, batch, states,
                                     bytes)) ||
             (st = tsl_plan_estimate(NULL, g, 1, 1, batch, states, &one)) ||
             (st = tsl_plan_tensor_tiling(pp, &info.sample_shape, (int32_t)ranks, (int32_t)workers,
                                          batch, &info.sample_shape, 1, &grid, &owners)))
        code = fail(st, "planning");
    if (!code) {
        char text[160] = "default";
        if (pp)
            tsl_plan_format(pp, text, sizeof text);
        printf("tessel plan: model %s, data %s (samples", model, data);
        for (int d = 0; d < info.sample_shape.ndim; d++)
            printf("%s%lld", d ? "x" : " ", (long long)info.sample_shape.dims[d]);
        printf("), batch %ld, plan %s on %ld ranks x %ld workers\n", batch, text, ranks, workers);
        printf("input tiles (N x C x spatial):");
        for (int d = 0; d <= info.sample_shape.ndim; d++)
            printf("%s%d", d ? " x " : " ", (int)grid.splits[d]);
        printf("\nrank  estimated tile memory\n");
        int64_t largest = 0;
        for (long r = 0; r < ranks; r++) {
            printf("%-5ld %.1f MiB\n", r, (double)bytes[r] / 1048576.0);
            largest = bytes[r] > largest ? bytes[r] : largest;
        }
        printf("largest rank %.1f MiB, %.2f of one rank's %.1f MiB\n", (double)largest / 1048576.0,
               (double)largest / (double)one, (double)one / 1048576.0);
        code = print_placement(pp, g, (int32_t)ranks);
    }
    free(bytes);
    tsl_graph_destroy(g);
    return code;
}
