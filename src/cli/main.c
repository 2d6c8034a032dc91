/* The tessel command: `main` and the dispatch to the commands (one file each: info.c, demo.c,
 * train.c, eval.c, plan.c, bench.c; what they share is in common.c). Runs unchanged under mpirun;
 * rank 0 prints. */
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

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
                 "  bench   training steps of one model under several StarPU schedulers\n"
                 "\n"
                 "Run under mpirun for several ranks; rank 0 prints.\n"
                 "'tessel <command> --help' describes each command; --version prints the\n"
                 "version.\n");
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
    if (strcmp(command, "--version") == 0) {
        print_version();
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
    if (strcmp(command, "bench") == 0)
        return command_bench(argc, argv);
    static const char *const commands[] = {"info", "demo", "train", "eval", "plan", "bench"};
    const char *near = closest_name(command, commands, 6);
    fprintf(stderr, "tessel: unknown command '%s'\n", command);
    if (near)
        fprintf(stderr, "did you mean 'tessel %s'?\n", near);
    fprintf(stderr, "usage: tessel <command> [options]   ('tessel --help' lists the commands)\n");
    return EXIT_USAGE;
}
