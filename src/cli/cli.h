/* Shared parts of the tessel command (src/cli/). */
#ifndef TESSEL_CLI_H
#define TESSEL_CLI_H

#include <stdint.h>

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

int command_train(int argc, char **argv);
int command_eval(int argc, char **argv);

#endif /* TESSEL_CLI_H */
