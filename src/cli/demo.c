/* tessel demo: a tiled tensor over the ranks, tile tasks on it, and which rank and worker
 * handled each tile; sums before and after redistributing onto one rank must agree. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage_demo(FILE *out)
{
    fprintf(out,
            "usage: tessel demo [--shape AxBx...] [--grid AxBx...] [--owners block|cyclic|single]\n"
            "                   [--seed S] [--ncpu N] [--sched NAME]\n"
            "  --shape   logical shape N x C x spatial dims (default 4x3x64x64)\n"
            "  --grid    tiles per dimension, same number of entries (default 2x1x2x2),\n"
            "            at most 65536 tiles\n"
            "  --owners  owner map: contiguous blocks (default), round-robin, or all on rank 0\n"
            "  --seed    seed of the random fill (default 42)\n"
            "  --ncpu N  CPU workers per rank; --sched NAME  StarPU scheduler\n");
}

enum { OPT_SHAPE = OPT_COMMAND_FIRST, OPT_GRID, OPT_OWNERS, OPT_SEED };

/* The most tiles of a demo tensor (about 1.3 GiB of StarPU's bookkeeping per rank). */
#define DEMO_MAX_TILES 65536

typedef struct demo_options {
    common_options common;
    int64_t shape_dims[TSL_MAX_DIMS], grid_dims[TSL_MAX_DIMS];
    int shape_n, grid_n;
    const char *owners_name;
    uint64_t seed;
    tsl_shape shape;
    tsl_tile_grid grid;
} demo_options;

/* Parse "AxBxC" into at most TSL_MAX_DIMS positive integers; returns the count or -1. */
static int parse_dims(const char *text, int64_t *dims)
{
    int n = 0;
    const char *p = text;
    while (*p) {
        if (n == TSL_MAX_DIMS)
            return -1;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v <= 0)
            return -1;
        dims[n++] = v;
        if (*end == 'x')
            p = end + 1;
        else if (*end == '\0')
            p = end;
        else
            return -1;
        if (*end == 'x' && *p == '\0')
            return -1;
    }
    return n > 0 ? n : -1;
}

static int parse_demo_option(const cli_parser *parser, int id, const char *v)
{
    demo_options *o = parser->state;
    switch (id) {
    case OPT_SHAPE:
        if ((o->shape_n = parse_dims(v, o->shape_dims)) < 0) {
            fprintf(stderr, "tessel demo: bad --shape '%s' (want e.g. 4x3x64x64)\n", v);
            return OPTION_FAILED;
        }
        return OPTION_OK;
    case OPT_GRID:
        if ((o->grid_n = parse_dims(v, o->grid_dims)) < 0) {
            fprintf(stderr, "tessel demo: bad --grid '%s' (want e.g. 2x1x2x2)\n", v);
            return OPTION_FAILED;
        }
        return OPTION_OK;
    case OPT_OWNERS:
        if (strcmp(v, "block") && strcmp(v, "cyclic") && strcmp(v, "single")) {
            fprintf(stderr, "tessel demo: --owners takes block, cyclic or single\n");
            return OPTION_FAILED;
        }
        o->owners_name = v;
        return OPTION_OK;
    case OPT_SEED: {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 10);
        if (end == v || *end || errno) {
            fprintf(stderr, "tessel demo: bad --seed '%s'\n", v);
            return OPTION_FAILED;
        }
        o->seed = s;
        return OPTION_OK;
    }
    }
    return OPTION_UNKNOWN;
}

/* Parse and check the options, the shape and the grid; returns -1 to exit 0 (help), an exit
 * code > 0, or 0. */
static int parse_demo(int argc, char **argv, demo_options *o)
{
    static const struct option options[] = {CLI_HELP_OPTION,
                                            CLI_COMMON_OPTIONS,
                                            {"shape", required_argument, NULL, OPT_SHAPE},
                                            {"grid", required_argument, NULL, OPT_GRID},
                                            {"owners", required_argument, NULL, OPT_OWNERS},
                                            {"seed", required_argument, NULL, OPT_SEED},
                                            {0}};
    *o = (demo_options){.shape_dims = {4, 3, 64, 64},
                        .grid_dims = {2, 1, 2, 2},
                        .shape_n = 4,
                        .grid_n = 4,
                        .owners_name = "block",
                        .seed = 42};
    tsl_context_config_init(&o->common.config);
    cli_parser parser = {"tessel demo", options, usage_demo, &o->common, parse_demo_option, o};
    int code = cli_parse(&parser, argc, argv);
    if (code)
        return code;
    if (o->grid_n != o->shape_n) {
        fprintf(stderr, "tessel demo: --grid has %d entries, --shape has %d\n", o->grid_n,
                o->shape_n);
        return EXIT_USAGE;
    }
    if (tsl_shape_make(&o->shape, o->shape_n, o->shape_dims)) {
        fprintf(stderr, "tessel demo: %s\n", tsl_last_error());
        return EXIT_USAGE;
    }
    o->grid = tsl_tile_grid_single();
    for (int d = 0; d < o->grid_n; d++)
        o->grid.splits[d] = (int32_t)o->grid_dims[d];
    if (tsl_tile_grid_check(&o->grid, &o->shape)) {
        fprintf(stderr, "tessel demo: %s\n", tsl_last_error());
        return EXIT_USAGE;
    }
    /* StarPU keeps about 5 KiB per registered tile (its handle and one replicate per memory
     * node), and the demo registers every tile of 4 tensors: a million tiles take some 20 GiB,
     * and where StarPU cannot allocate it aborts on an assertion. */
    int64_t ntiles = 1;
    for (int d = 0; d < o->grid_n; d++)
        ntiles *= o->grid_dims[d];
    if (ntiles > DEMO_MAX_TILES) {
        fprintf(stderr,
                "tessel demo: --grid makes %lld tiles, more than the %d the demo takes (StarPU "
                "keeps about 20 KiB per tile of the demo's 4 tensors, and the table has a line "
                "per tile)\n",
                (long long)ntiles, DEMO_MAX_TILES);
        return EXIT_USAGE;
    }
    return 0;
}

/* Tiles dealt to ranks in turn, in row-major tile order. */
static int32_t round_robin(const int32_t tile[TSL_MAX_DIMS], int32_t ndim,
                           const tsl_tile_grid *grid, int32_t nranks, void *user)
{
    (void)user;
    int64_t linear = 0;
    for (int d = 0; d < ndim; d++)
        linear = linear * grid->splits[d] + tile[d];
    return (int32_t)(linear % nranks);
}

static void format_dims(char *buf, size_t cap, int n, const int64_t *dims)
{
    buf[0] = '\0';
    for (int d = 0; d < n; d++) {
        size_t len = strlen(buf);
        snprintf(buf + len, cap - len, d ? "x%lld" : "%lld", (long long)dims[d]);
    }
}

/* Rank 0: the table of tiles, where each ran (`marks`, gathered), and the two sums. */
static int print_demo(const demo_options *o, tsl_context_t ctx, tsl_tensor_t where,
                      const int32_t *marks, int64_t ntiles, double sum_tiled, double sum_whole)
{
    int32_t ncpu, size;
    int n = o->shape_n;
    tsl_context_size(ctx, &size);
    tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu);
    printf("tessel demo: %d ranks, %d CPU workers on rank 0\n", (int)size, (int)ncpu);
    char shape_text[96], grid_text[96];
    format_dims(shape_text, sizeof shape_text, n, o->shape_dims);
    format_dims(grid_text, sizeof grid_text, o->grid_n, o->grid_dims);
    printf("tensor f32 %s, tile grid %s, owners %s: %" PRId64 " tiles\n\n", shape_text, grid_text,
           o->owners_name, ntiles);
    printf("%-6s %-22s %-22s %-6s %s\n", "tile", "start", "extent", "owner", "ran on");
    int64_t strides[TSL_MAX_DIMS];
    int64_t s = 1;
    for (int d = n - 1; d >= 0; d--) {
        strides[d] = s;
        s *= o->shape_dims[d];
    }
    for (int64_t i = 0; i < ntiles; i++) {
        int32_t owner;
        int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
        tsl_tensor_tile_info(where, i, NULL, &owner, start, extent);
        char sbuf[96], ebuf[96];
        format_dims(sbuf, sizeof sbuf, n, start);
        format_dims(ebuf, sizeof ebuf, n, extent);
        int64_t first = 0;
        for (int d = 0; d < n; d++)
            first += start[d] * strides[d];
        int32_t mark = marks[first];
        printf("%-6" PRId64 " %-22s %-22s %-6d rank %d worker %d\n", i, sbuf, ebuf, (int)owner,
               (int)(mark / 1000), (int)(mark % 1000));
    }
    printf("\nexact sum of y = 2*uniform + normal over %" PRId64 " tiles: %.17g\n", ntiles,
           sum_tiled);
    printf("exact sum after redistributing y to one tile on rank 0:   %.17g\n", sum_whole);
    printf("sums %s\n", sum_tiled == sum_whole ? "identical" : "DIFFER");
    return sum_tiled != sum_whole;
}

/* Demo: a tiled f32 tensor and an i32 placement tensor over the same grid. */
int command_demo(int argc, char **argv)
{
    demo_options o;
    int code = parse_demo(argc, argv, &o);
    if (code)
        return code < 0 ? 0 : code;

    tsl_context_t ctx;
    tsl_status st = tsl_context_create(&ctx, &o.common.config);
    if (st)
        return fail(st, "starting StarPU");
    int32_t rank;
    tsl_context_rank(ctx, &rank);
    rank_of_process = rank;
    tsl_owner_map owners = tsl_owner_block(NULL);
    if (strcmp(o.owners_name, "single") == 0) {
        owners = tsl_owner_single(0);
    } else if (strcmp(o.owners_name, "cyclic") == 0) {
        owners = tsl_owner_callback(round_robin, NULL);
    }

    tsl_tensor_t x = NULL, y = NULL, where = NULL, whole = NULL;
    int status = 0;
    double sum_tiled = 0, sum_whole = 0;
    int32_t *marks = NULL;
    int64_t ntiles = 0, numel = 1;
    for (int d = 0; d < o.shape_n; d++)
        numel *= o.shape_dims[d];
    if ((st = tsl_tensor_create(&x, ctx, TSL_F32, &o.shape, &o.grid, &owners)) ||
        (st = tsl_tensor_create(&y, ctx, TSL_F32, &o.shape, &o.grid, &owners)) ||
        (st = tsl_tensor_create(&where, ctx, TSL_I32, &o.shape, &o.grid, &owners)) ||
        (st = tsl_tensor_create(&whole, ctx, TSL_F32, &o.shape, NULL, NULL))) {
        status = fail(st, "creating tensors");
        goto done;
    }
    /* y = 2 * uniform + normal, tile by tile, then its exact sum, and the same sum after
     * redistributing y onto one tile on rank 0: the two must agree to the bit. */
    if ((st = tsl_tensor_fill_uniform(x, o.seed, -1.0, 1.0)) ||
        (st = tsl_tensor_fill_normal(y, o.seed + 1, 0.0, 1.0)) ||
        (st = tsl_tensor_axpy(y, 2.0, x)) || (st = tsl_tensor_mark_placement(where)) ||
        (st = tsl_tensor_sum(y, &sum_tiled)) || (st = tsl_tensor_redistribute(whole, y)) ||
        (st = tsl_tensor_sum(whole, &sum_whole))) {
        status = fail(st, "running tile tasks");
        goto done;
    }
    tsl_tensor_tile_count(where, &ntiles);
    if (rank == 0 && !(marks = malloc((size_t)numel * sizeof *marks))) {
        fprintf(stderr, "tessel demo: out of memory\n");
        status = 1;
    }
    if ((st = tsl_tensor_gather(where, 0, marks))) {
        status = fail(st, "gathering placement");
        goto done;
    }
    if (rank == 0 && !status)
        status = print_demo(&o, ctx, where, marks, ntiles, sum_tiled, sum_whole);
done:
    free(marks);
    tsl_tensor_destroy(x);
    tsl_tensor_destroy(y);
    tsl_tensor_destroy(where);
    tsl_tensor_destroy(whole);
    if (tsl_context_destroy(ctx))
        status = 1;
    return status;
}
