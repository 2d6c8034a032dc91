/* The tessel command. Subcommands: info, demo. Runs unchanged under mpirun; rank 0 prints. */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "cli.h"
#include "tessel/tessel.h"

int32_t rank_of_process;

static void usage_main(FILE *out)
{
    fprintf(out, "usage: tessel <command> [options]\n"
                 "\n"
                 "commands:\n"
                 "  info    StarPU version, MPI ranks, workers by kind, scheduler\n"
                 "  demo    create a tiled tensor over the ranks, run tile tasks on it and\n"
                 "          print which rank and worker handled each tile\n"
                 "  train   train a network of the model zoo on a dataset\n"
                 "  eval    evaluate saved parameters on a dataset's test split\n"
                 "  plan    how a plan tiles a model, and every rank's estimated memory\n"
                 "\n"
                 "Run under mpirun for several ranks; rank 0 prints.\n"
                 "'tessel <command> --help' describes each command.\n");
}

static void usage_info(FILE *out)
{
    fprintf(out, "usage: tessel info [--ncpu N] [--sched NAME] [--host-cache-mib M] [--spin]\n"
                 "  --ncpu N       CPU workers per rank (default: StarPU decides)\n"
                 "  --sched NAME   StarPU scheduler (default: StarPU's, or STARPU_SCHED)\n"
                 "  --host-cache-mib M  MiB of freed tile buffers kept for reuse (default 32)\n"
                 "  --spin         idle workers and MPI waits poll instead of yielding their\n"
                 "                 core (the default yields: faster where threads outnumber\n"
                 "                 cores)\n");
}

static void usage_demo(FILE *out)
{
    fprintf(out,
            "usage: tessel demo [--shape AxBx...] [--grid AxBx...] [--owners block|cyclic|single]\n"
            "                   [--seed S] [--ncpu N] [--sched NAME]\n"
            "  --shape   logical shape N x C x spatial dims (default 4x3x64x64)\n"
            "  --grid    tiles per dimension, same number of entries (default 2x1x2x2)\n"
            "  --owners  owner map: contiguous blocks (default), round-robin, or all on rank 0\n"
            "  --seed    seed of the random fill (default 42)\n"
            "  --ncpu N  CPU workers per rank; --sched NAME  StarPU scheduler\n");
}

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

int parse_int_arg(const char *text, long min, long max, long *value)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < min || v > max)
        return -1;
    *value = v;
    return 0;
}

/* Options shared by every command; returns 1 if consumed (advancing *i), 0 if not, -1 on
 * error. */
int parse_common(int argc, char **argv, int *i, common_options *opts)
{
    long v;
    if (strcmp(argv[*i], "--ncpu") == 0) {
        if (*i + 1 >= argc || parse_int_arg(argv[*i + 1], 0, 4096, &v)) {
            fprintf(stderr, "tessel: --ncpu needs a number of workers\n");
            return -1;
        }
        opts->config.ncpu = (int32_t)v;
        *i += 1;
        return 1;
    }
    if (strcmp(argv[*i], "--host-cache-mib") == 0) {
        if (*i + 1 >= argc || parse_int_arg(argv[*i + 1], 0, 1L << 30, &v)) {
            fprintf(stderr, "tessel: --host-cache-mib needs a number of MiB (0 or more)\n");
            return -1;
        }
        opts->config.host_cache_bytes = (int64_t)v << 20;
        *i += 1;
        return 1;
    }
    if (strcmp(argv[*i], "--spin") == 0) {
        opts->config.yield_when_idle = 0;
        return 1;
    }
    if (strcmp(argv[*i], "--sched") == 0) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "tessel: --sched needs a scheduler name\n");
            return -1;
        }
        opts->config.scheduler = argv[*i + 1];
        *i += 1;
        return 1;
    }
    return 0;
}

/* Report a failed call; a rejected argument is a usage error (exit 2), anything else 1. */
int fail(tsl_status st, const char *what)
{
    fprintf(stderr, "tessel[%d]: %s failed: %s (%s)\n", rank_of_process, what, tsl_last_error(),
            tsl_status_string(st));
    return st == TSL_ERR_INVALID_ARG ? EXIT_USAGE : 1;
}

static int command_info(int argc, char **argv)
{
    common_options opts;
    tsl_context_config_init(&opts.config);
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage_info(stdout);
            return 0;
        }
        int used = parse_common(argc, argv, &i, &opts);
        if (used < 0)
            return EXIT_USAGE;
        if (!used) {
            fprintf(stderr, "tessel info: unknown option '%s'\n", argv[i]);
            usage_info(stderr);
            return EXIT_USAGE;
        }
    }
    tsl_context_t ctx;
    tsl_status st = tsl_context_create(&ctx, &opts.config);
    if (st)
        return fail(st, "starting StarPU");
    int32_t rank, size, ncpu, ncuda;
    const char *sched;
    tsl_context_rank(ctx, &rank);
    tsl_context_size(ctx, &size);
    tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu);
    tsl_context_worker_count(ctx, TSL_WORKER_CUDA, &ncuda);
    tsl_context_scheduler(ctx, &sched);
    if (rank == 0) {
        int major, minor, release;
        starpu_get_version(&major, &minor, &release);
        printf("tessel %s\n", TSL_VERSION_STRING);
        printf("StarPU %d.%d.%d with StarPU-MPI\n", major, minor, release);
        printf("MPI ranks: %d\n", (int)size);
        printf("scheduler: %s\n", sched);
        printf("workers on rank 0: %d CPU, %d CUDA\n", (int)ncpu, (int)ncuda);
        printf("waiting threads: %s\n", opts.config.yield_when_idle ? "yield" : "spin");
        fflush(stdout);
    }
    return tsl_context_destroy(ctx) ? 1 : 0;
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

/* Demo: a tiled f32 tensor and an i32 placement tensor over the same grid. */
static int command_demo(int argc, char **argv)
{
    common_options opts;
    tsl_context_config_init(&opts.config);
    int64_t shape_dims[TSL_MAX_DIMS] = {4, 3, 64, 64};
    int64_t grid_dims[TSL_MAX_DIMS] = {2, 1, 2, 2};
    int shape_n = 4, grid_n = 4;
    const char *owners_name = "block";
    uint64_t seed = 42;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage_demo(stdout);
            return 0;
        }
        int used = parse_common(argc, argv, &i, &opts);
        if (used < 0)
            return EXIT_USAGE;
        if (used)
            continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "tessel demo: '%s' needs a value (or is unknown)\n", a);
            usage_demo(stderr);
            return EXIT_USAGE;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--shape") == 0) {
            if ((shape_n = parse_dims(v, shape_dims)) < 0) {
                fprintf(stderr, "tessel demo: bad --shape '%s' (want e.g. 4x3x64x64)\n", v);
                return EXIT_USAGE;
            }
        } else if (strcmp(a, "--grid") == 0) {
            if ((grid_n = parse_dims(v, grid_dims)) < 0) {
                fprintf(stderr, "tessel demo: bad --grid '%s' (want e.g. 2x1x2x2)\n", v);
                return EXIT_USAGE;
            }
        } else if (strcmp(a, "--owners") == 0) {
            if (strcmp(v, "block") && strcmp(v, "cyclic") && strcmp(v, "single")) {
                fprintf(stderr, "tessel demo: --owners takes block, cyclic or single\n");
                return EXIT_USAGE;
            }
            owners_name = v;
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (end == v || *end || errno) {
                fprintf(stderr, "tessel demo: bad --seed '%s'\n", v);
                return EXIT_USAGE;
            }
            seed = s;
        } else {
            fprintf(stderr, "tessel demo: unknown option '%s'\n", a);
            usage_demo(stderr);
            return EXIT_USAGE;
        }
    }
    if (grid_n != shape_n) {
        fprintf(stderr, "tessel demo: --grid has %d entries, --shape has %d\n", grid_n, shape_n);
        return EXIT_USAGE;
    }
    tsl_shape shape;
    if (tsl_shape_make(&shape, shape_n, shape_dims)) {
        fprintf(stderr, "tessel demo: %s\n", tsl_last_error());
        return EXIT_USAGE;
    }
    tsl_tile_grid grid = tsl_tile_grid_single();
    for (int d = 0; d < grid_n; d++)
        grid.splits[d] = (int32_t)grid_dims[d];
    if (tsl_tile_grid_check(&grid, &shape)) {
        fprintf(stderr, "tessel demo: %s\n", tsl_last_error());
        return EXIT_USAGE;
    }

    tsl_context_t ctx;
    tsl_status st = tsl_context_create(&ctx, &opts.config);
    if (st)
        return fail(st, "starting StarPU");
    int32_t rank, size;
    tsl_context_rank(ctx, &rank);
    tsl_context_size(ctx, &size);
    rank_of_process = rank;
    tsl_owner_map owners = tsl_owner_block(NULL);
    if (strcmp(owners_name, "single") == 0) {
        owners = tsl_owner_single(0);
    } else if (strcmp(owners_name, "cyclic") == 0) {
        owners = tsl_owner_callback(round_robin, NULL);
    }

    tsl_tensor_t x = NULL, y = NULL, where = NULL, whole = NULL;
    int status = 0;
    double sum_tiled = 0, sum_whole = 0;
    int32_t *marks = NULL;
    int64_t ntiles = 0, numel = 1;
    for (int d = 0; d < shape_n; d++)
        numel *= shape_dims[d];
    if ((st = tsl_tensor_create(&x, ctx, TSL_F32, &shape, &grid, &owners)) ||
        (st = tsl_tensor_create(&y, ctx, TSL_F32, &shape, &grid, &owners)) ||
        (st = tsl_tensor_create(&where, ctx, TSL_I32, &shape, &grid, &owners)) ||
        (st = tsl_tensor_create(&whole, ctx, TSL_F32, &shape, NULL, NULL))) {
        status = fail(st, "creating tensors");
        goto done;
    }
    /* y = 2 * uniform + normal, tile by tile, then its exact sum, and the same sum after
     * redistributing y onto one tile on rank 0: the two must agree to the bit. */
    if ((st = tsl_tensor_fill_uniform(x, seed, -1.0, 1.0)) ||
        (st = tsl_tensor_fill_normal(y, seed + 1, 0.0, 1.0)) || (st = tsl_tensor_axpy(y, 2.0, x)) ||
        (st = tsl_tensor_mark_placement(where)) || (st = tsl_tensor_sum(y, &sum_tiled)) ||
        (st = tsl_tensor_redistribute(whole, y)) || (st = tsl_tensor_sum(whole, &sum_whole))) {
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
    if (rank == 0 && !status) {
        int32_t ncpu;
        tsl_context_worker_count(ctx, TSL_WORKER_CPU, &ncpu);
        printf("tessel demo: %d ranks, %d CPU workers on rank 0\n", (int)size, (int)ncpu);
        char shape_text[96], grid_text[96];
        format_dims(shape_text, sizeof shape_text, shape_n, shape_dims);
        format_dims(grid_text, sizeof grid_text, grid_n, grid_dims);
        printf("tensor f32 %s, tile grid %s, owners %s: %" PRId64 " tiles\n\n", shape_text,
               grid_text, owners_name, ntiles);
        printf("%-6s %-22s %-22s %-6s %s\n", "tile", "start", "extent", "owner", "ran on");
        int64_t strides[TSL_MAX_DIMS];
        int64_t s = 1;
        for (int d = shape_n - 1; d >= 0; d--) {
            strides[d] = s;
            s *= shape_dims[d];
        }
        for (int64_t i = 0; i < ntiles; i++) {
            int32_t owner;
            int64_t start[TSL_MAX_DIMS], extent[TSL_MAX_DIMS];
            tsl_tensor_tile_info(where, i, NULL, &owner, start, extent);
            char sbuf[96], ebuf[96];
            format_dims(sbuf, sizeof sbuf, shape_n, start);
            format_dims(ebuf, sizeof ebuf, shape_n, extent);
            int64_t first = 0;
            for (int d = 0; d < shape_n; d++)
                first += start[d] * strides[d];
            int32_t mark = marks[first];
            printf("%-6" PRId64 " %-22s %-22s %-6d rank %d worker %d\n", i, sbuf, ebuf, (int)owner,
                   (int)(mark / 1000), (int)(mark % 1000));
        }
        printf("\nexact sum of y = 2*uniform + normal over %" PRId64 " tiles: %.17g\n", ntiles,
               sum_tiled);
        printf("exact sum after redistributing y to one tile on rank 0:   %.17g\n", sum_whole);
        printf("sums %s\n", sum_tiled == sum_whole ? "identical" : "DIFFER");
        if (sum_tiled != sum_whole)
            status = 1;
    }
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

int main(int argc, char **argv)
{
    /* Buffers of 1 MiB and more (halo windows, batches, StarPU's temporary data) are mapped
     * and unmapped, so memory freed after a task goes back to the system at once instead of
     * staying in the heap: glibc's default raises this threshold to 32 MiB after the first
     * large free, which kept about 60 MiB per rank resident (bench/RESULTS.md). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    if (argc < 2) {
        usage_main(stderr);
        return EXIT_USAGE;
    }
    const char *command = argv[1];
    if (strcmp(command, "--help") == 0 || strcmp(command, "-h") == 0 ||
        strcmp(command, "help") == 0) {
        usage_main(stdout);
        return 0;
    }
    if (strcmp(command, "info") == 0)
        return command_info(argc, argv);
    if (strcmp(command, "demo") == 0)
        return command_demo(argc, argv);
    if (strcmp(command, "train") == 0)
        return command_train(argc, argv);
    if (strcmp(command, "plan") == 0)
        return command_plan(argc, argv);
    if (strcmp(command, "eval") == 0)
        return command_eval(argc, argv);
    fprintf(stderr, "tessel: unknown command '%s'\n\n", command);
    usage_main(stderr);
    return EXIT_USAGE;
}
