/* Shared parts of the tessel command (src/cli/). */
#ifndef TESSEL_CLI_H
#define TESSEL_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "tessel/tessel.h"

#define EXIT_USAGE 2

/* This process's rank once a context exists (for messages). */
extern int32_t rank_of_process;

/* Options every command takes (--ncpu, --sched). */
typedef struct common_options {
    tsl_context_config config;
} common_options;

/* Consume a common option at argv[*i]: 1 if consumed (advancing *i), 0 if not ours, -1 on a
 * bad value (message printed). */
int parse_common(int argc, char **argv, int *i, common_options *opts);

/* A whole decimal integer in [min, max]; 0 on success, -1 otherwise. */
int parse_int_arg(const char *text, long min, long max, long *value);

/* Report a failed call; returns the exit code (2 for a rejected argument, 1 otherwise). */
int fail(tsl_status st, const char *what);

/* Per-epoch metrics of a training run. */
typedef struct epoch_metrics {
    double train_loss, train_accuracy, test_loss, test_accuracy, seconds, samples_per_second;
    double peak_mib;
    /* Largest rank's tile memory, its most StarPU buffer memory at once so far
     * (tsl_context_buffer_bytes), and bytes sent and received per training step (-1 without
     * --comm-stats); not kept in checkpoints. */
    double owned_mib, buffer_peak_mib, sent_per_step, received_per_step;
    /* Largest rank's most bytes of other ranks' data in StarPU-MPI's cache at once during the
     * epoch (tsl_context_cached_bytes), MiB; not kept in checkpoints. */
    double cached_peak_mib;
    double busy; /* fraction of worker time spent executing tasks, all ranks (-1: not measured) */
    /* Rank 0 only, NULL elsewhere and for epochs read from a checkpoint: RANK_FIELDS values
     * per rank (peak MiB, tile MiB, most buffer MiB, bytes sent and received per step, most
     * cached remote MiB). */
    double *ranks;
} epoch_metrics;

#define RANK_FIELDS 6

/* What decides a training run's trajectory; recorded in every checkpoint. */
typedef struct run_settings {
    char model[1024], data[1024], optimizer[16];
    long batch, epochs;
    double lr, momentum;
    unsigned long long seed;
    int shuffle;
} run_settings;

/* Where a training run stands: the next batch, the partial sums of the current epoch and the
 * metrics of the finished ones. */
typedef struct run_progress {
    int64_t epoch, batch, steps; /* next epoch and batch in it (from 0); steps taken */
    double loss_sum, seconds;    /* of the current epoch so far */
    int64_t hits, seen;
    int64_t nepochs;       /* finished epochs, metrics in epochs[0 .. nepochs) */
    epoch_metrics *epochs; /* capacity: the run's epoch count */
} run_progress;

/* Write `s` as a JSON string literal (quoted, escaped). */
void json_string(FILE *f, const char *s);

/* Write `write(f, arg)` to `path` under a temporary name, sync it and rename it: a crash never
 * leaves a partial file. 0 on success, -1 otherwise. */
int write_file_atomic(const char *path, int (*write)(FILE *f, const void *arg), const void *arg);

/* Save a checkpoint into DIR (collective): DIR/step-NNNNNNNNNNNN holds the parameters, the
 * optimizer state and state.json; DIR/latest names it. The snapshot is written under a
 * temporary name and renamed, then `latest` is replaced atomically, then older snapshots go:
 * a crash at any point leaves the previous checkpoint usable. Returns an exit code. */
int checkpoint_save(tsl_model_t model, tsl_optimizer_t opt, const char *dir,
                    const run_settings *settings, const run_progress *progress);

/* Read DIR's latest checkpoint's settings and progress (collective; progress->epochs is
 * allocated with room for max(epochs, finished) entries) and its snapshot directory, for
 * tsl_model_load_checkpoint(). Returns an exit code (message printed). */
int checkpoint_read(const char *dir, run_settings *settings, run_progress *progress, char *snapshot,
                    size_t size);

int command_train(int argc, char **argv);
int command_eval(int argc, char **argv);
int command_plan(int argc, char **argv);

#endif /* TESSEL_CLI_H */
