/* tessel info: StarPU's version, the MPI ranks, the workers by kind and the scheduler, and
 * each CUDA worker of rank 0 with its device (StarPU's worker name). */
#include <stdio.h>

#include <starpu.h>

#include "cli.h"

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

/* tessel info has the common options only. */
static int parse_info_option(const cli_parser *parser, int id, const char *value)
{
    (void)parser;
    (void)id;
    (void)value;
    return OPTION_UNKNOWN;
}

/* One line per CUDA worker of this process: "CUDA worker K: <StarPU's name>", which names the
 * device (e.g. "CUDA 0.0 (NVIDIA H100 80GB HBM3 79.2 GiB 19:00.0)"). Nothing without one. */
static void print_cuda_workers(void)
{
    int ids[STARPU_NMAXWORKERS];
    unsigned n = starpu_worker_get_ids_by_type(STARPU_CUDA_WORKER, ids, STARPU_NMAXWORKERS);
    for (unsigned k = 0; k < n; k++) {
        char name[128];
        starpu_worker_get_name(ids[k], name, sizeof name);
        printf("CUDA worker %u: %s\n", k, name);
    }
}

int command_info(int argc, char **argv)
{
    static const struct option options[] = {CLI_HELP_OPTION, CLI_COMMON_OPTIONS, {0}};
    common_options opts;
    tsl_context_config_init(&opts.config);
    cli_parser parser = {"tessel info", options, usage_info, &opts, parse_info_option, NULL};
    int code = cli_parse(&parser, argc, argv);
    if (code)
        return code < 0 ? 0 : code;
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
        print_cuda_workers();
        printf("waiting threads: %s\n", opts.config.yield_when_idle ? "yield" : "spin");
        fflush(stdout);
    }
    return tsl_context_destroy(ctx) ? 1 : 0;
}
