/* Shared parts of the tessel command (src/cli/): option parsing, the context, data and model
 * of a run, failure reports and files written whole (common.c), checkpoints (checkpoint.c),
 * and one entry point per command (info.c, demo.c, train.c, eval.c, plan.c). */
#ifndef TESSEL_CLI_H
#define TESSEL_CLI_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "tessel/tessel.h"

#define EXIT_USAGE 2

/* This process's rank once a context exists (for messages). */
extern int32_t rank_of_process;

/* ---- option parsing (getopt_long: --opt value and --opt=value) ---- */

/* Option ids: the ones several commands share; each command numbers its own from
 * OPT_COMMAND_FIRST. */
enum {
    OPT_HELP = 'h',
    OPT_VERSION = 255,
    OPT_NCPU = 256,
    OPT_SCHED,
    OPT_HOST_CACHE_MIB,
    OPT_SPIN,
    OPT_MODEL,
    OPT_DATA,
    OPT_BATCH,
    OPT_LOAD_PARAMS,
    OPT_PLAN,
    OPT_LOSS,
    OPT_LOG_LEVEL,
    OPT_QUIET = 'q',
    OPT_VERBOSE = 'v',
    OPT_COMMAND_FIRST = 512
};

/* getopt_long table rows: --help (and -h) and --version, which every command takes, the
 * options every StarPU command takes, and those tessel train and tessel eval share. */
#define CLI_HELP_OPTION                                                                            \
    {"help", no_argument, NULL, OPT_HELP},                                                         \
    {                                                                                              \
        "version", no_argument, NULL, OPT_VERSION                                                  \
    }
#define CLI_COMMON_OPTIONS                                                                         \
    {"ncpu", required_argument, NULL, OPT_NCPU}, {"sched", required_argument, NULL, OPT_SCHED},    \
        {"host-cache-mib", required_argument, NULL, OPT_HOST_CACHE_MIB},                           \
        {"spin", no_argument, NULL, OPT_SPIN}, {"quiet", no_argument, NULL, OPT_QUIET},            \
        {"verbose", no_argument, NULL, OPT_VERBOSE},                                               \
    {                                                                                              \
        "log-level", required_argument, NULL, OPT_LOG_LEVEL                                        \
    }
#define CLI_RUN_OPTIONS                                                                            \
    {"model", required_argument, NULL, OPT_MODEL}, {"data", required_argument, NULL, OPT_DATA},    \
        {"batch", required_argument, NULL, OPT_BATCH},                                             \
        {"load-params", required_argument, NULL, OPT_LOAD_PARAMS},                                 \
        {"plan", required_argument, NULL, OPT_PLAN},                                               \
    {                                                                                              \
        "loss", required_argument, NULL, OPT_LOSS                                                  \
    }

/* What an option handler says of an option. */
enum {
    OPTION_OK = 0,
    OPTION_BAD_VALUE, /* "bad value 'V' for --NAME" is printed */
    OPTION_UNKNOWN,   /* "unknown option" and the usage are printed */
    OPTION_FAILED     /* the handler printed why */
};

/* Options every command that starts StarPU takes (--ncpu, --sched, --host-cache-mib, --spin,
 * and the log level: -q/--quiet errors only, -v/--verbose info, --log-level LEVEL). Below the
 * info level StarPU is made quiet (STARPU_SILENT=1, unless the environment sets it). */
typedef struct common_options {
    tsl_context_config config;
} common_options;

/* One command's options. */
typedef struct cli_parser {
    const char *command;          /* "tessel train": the messages' prefix */
    const struct option *options; /* getopt_long's table, ending with a row of zeros */
    void (*usage)(FILE *out);
    common_options *common; /* where the common options go; NULL: the command has none */
    /* Take option `id` (an option that takes no value gets NULL); returns an OPTION_* code. */
    int (*handle)(const struct cli_parser *parser, int id, const char *value);
    void *state; /* the handler's */
} cli_parser;

/* Parse argv[2..] (argv[1] is the command) with the parser's table, in order, stopping at the
 * first error. Returns 0, -1 when --help printed the usage or --version the version (exit 0),
 * or EXIT_USAGE (message printed; for an unknown option the closest known one and a short
 * usage line). */
int cli_parse(const cli_parser *parser, int argc, char **argv);

/* "tessel VERSION" (the project's version) on stdout. */
void print_version(void);

/* The name of `names` (`count` of them, or up to a NULL) closest to `typed` in edit distance,
 * if close enough to be a likely typo; NULL otherwise. */
const char *closest_name(const char *typed, const char *const *names, int count);

/* The ranges of tessel train's trajectory options; a checkpoint's state.json is held to the
 * same ones. */
#define MAX_EPOCHS 1000000L
#define MAX_BATCH (1L << 24)
#define MIN_LR 1e-300

/* A whole decimal integer in [min, max]; 0 on success, -1 otherwise. */
int parse_int_arg(const char *text, long min, long max, long *value);

/* A seed: a whole decimal number in [0, 2^64); 0 on success, -1 otherwise. */
int parse_seed_arg(const char *text, unsigned long long *value);

/* A finite number of at least `min`; 0 on success, -1 otherwise. */
int parse_double_arg(const char *text, double min, double *value);

/* Whether this process runs under an MPI launcher (mpirun, mpiexec, srun: their variables are
 * set), where a terminal on stdout does not mean a person watches it. */
int under_mpi_launcher(void);

/* Report a failed call; returns the exit code (2 for a rejected argument, 1 otherwise). */
int fail(tsl_status st, const char *what);

/* Report a failure of a step every rank takes (collective: every rank calls it, with its own
 * status, TSL_OK where its part went well). Returns 0 where no rank failed; otherwise the exit
 * code on every rank, after rank 0 printed the failure once where every rank failed alike,
 * or each failing rank's line where they differ. */
int fail_collective(tsl_status mine, const char *what);

/* Report that this process could not allocate `bytes` for `what` ("for the metrics ..."); returns
 * the exit code (1). */
int fail_oom(const char *what, double bytes);

/* ---- tessel train and tessel eval: a zoo network or model file on a dataset ---- */

/* Options that decide a run's trajectory: given with --resume, they must match the
 * checkpoint; left out, they are taken from it. */
enum {
    SET_MODEL = 1 << 0,
    SET_DATA = 1 << 1,
    SET_BATCH = 1 << 2,
    SET_OPTIMIZER = 1 << 3,
    SET_LR = 1 << 4,
    SET_MOMENTUM = 1 << 5,
    SET_SEED = 1 << 6,
    SET_SHUFFLE = 1 << 7,
    SET_EPOCHS = 1 << 8,
    SET_WEIGHT_DECAY = 1 << 9,
    SET_DAMPENING = 1 << 10,
    SET_NESTEROV = 1 << 11,
    SET_BETAS = 1 << 12,
    SET_EPS = 1 << 13,
    SET_SCHEDULE = 1 << 14,
    SET_WARMUP = 1 << 15,
    SET_LOSS = 1 << 16
};

/* A learning-rate schedule (--lr-schedule, --warmup-steps): constant, step (times gamma every
 * `every` steps) or cosine (from lr down to `min` over `t_max` steps, then min), times a linear
 * warm-up over the first `warmup` steps. */
enum { SCHEDULE_CONSTANT = 0, SCHEDULE_STEP, SCHEDULE_COSINE };
typedef struct lr_schedule {
    int kind;
    long every, t_max, warmup;
    double gamma, min;
} lr_schedule;

/* Parse "constant", "step:N:G" or "cosine:T[:MIN]"; 0, or -1 when malformed. */
int parse_lr_schedule(const char *text, lr_schedule *s);

/* Parse --loss: "NAME[:WEIGHT],..." with NAME cross_entropy or dice (1 to TSL_MAX_LOSS_TERMS
 * terms, weights finite and above 0, default 1); 0, or -1 when malformed. */
int parse_loss(const char *text, tsl_loss_term *terms, int32_t *count);

/* The learning rate of the step after `steps` steps, from the base rate `lr`. */
double scheduled_lr(const lr_schedule *s, double lr, int64_t steps);

/* tessel train --progress: a bar rewritten in place, a line now and then, or nothing but the
 * epochs' summaries; auto is a bar where rank 0's stdout is a terminal outside an MPI
 * launcher, lines elsewhere (-q: nothing). */
enum { PROGRESS_AUTO = 0, PROGRESS_BAR, PROGRESS_LINES, PROGRESS_OFF };

typedef struct train_options {
    common_options common;
    const char *model, *data, *optimizer, *load_params, *save_params, *metrics_json;
    const char *trace; /* --trace FILE (train) */
    const char *checkpoint, *resume, *plan_text;
    tsl_plan plan;
    /* --plan auto: chosen when the model is made (session_open), its text and prediction */
    int plan_auto;
    char plan_auto_text[256];
    double plan_predicted;
    long epochs, batch, max_steps, checkpoint_every;
    double lr, momentum;
    /* weight decay (< 0: the optimizer's default, 0.01 for adamw, else 0), SGD's dampening and
     * Nesterov momentum, Adam's betas and eps */
    double weight_decay, dampening, beta1, beta2, eps;
    int nesterov;
    const char *lr_schedule; /* --lr-schedule as given (parsed into schedule) */
    lr_schedule schedule;
    const char *loss; /* --loss as given, or the model file's (parsed into loss_terms) */
    char loss_text[128];
    tsl_loss_term loss_terms[TSL_MAX_LOSS_TERMS];
    int32_t nloss;
    unsigned long long seed;
    int shuffle;
    unsigned given;               /* SET_* of the options on the command line */
    int progress, given_progress; /* PROGRESS_*; whether --progress was given */
    int comm_stats, rank_report;
} train_options;

/* The defaults of tessel train and tessel eval. */
void train_options_init(train_options *o);

/* The optimizer of --optimizer (sgd: --lr, default 0.01, --momentum, --dampening, --nesterov;
 * adam and adamw: --lr, default 0.001, --betas, --eps; all: --weight-decay). */
tsl_status create_optimizer(const train_options *o, tsl_context_t ctx, tsl_optimizer_t *opt);

/* Whether NAME is an optimizer tessel trains with (sgd, adam, adamw), and how many state
 * tensors it keeps per parameter with momentum `momentum`. */
int optimizer_known(const char *name);
/* --weight-decay as given, or the optimizer's default (PyTorch's: 0.01 for adamw, else 0). */
double weight_decay_of(const train_options *o);
int32_t optimizer_states(const char *name, double momentum);

/* Check the optimizer options against each other and --optimizer; returns an exit code
 * (EXIT_USAGE, message printed) or 0. */
int check_optimizer_options(train_options *o, const char *cmd);

/* Take an option of CLI_COMMON_OPTIONS' and CLI_RUN_OPTIONS' (parser->state is the
 * train_options); OPTION_UNKNOWN for any other. */
int parse_run_option(const cli_parser *parser, int id, const char *value);

/* After parsing: --data is required unless resuming. 0 or EXIT_USAGE (message printed). */
int check_run_options(const cli_parser *parser, const train_options *o);

/* Context, datasets (every rank opens them: each needs the shapes; only rank 0 reads
 * batches) and the model. */
typedef struct session {
    tsl_context_t ctx;
    tsl_dataset_t train, test;
    tsl_dataset_info train_info, test_info;
    tsl_model_t model;
    tsl_shape output_shape; /* one sample's output (logits: classes, or classes x spatial) */
    int32_t output_value;   /* its value in the model's graph */
    int32_t ninputs;        /* the graph's inputs: value, name and sample shape of each */
    int32_t input_values[TSL_GRAPH_MAX_GRAPH_INPUTS];
    char input_names[TSL_GRAPH_MAX_GRAPH_INPUTS][TSL_GRAPH_NAME_MAX];
    tsl_shape input_shapes[TSL_GRAPH_MAX_GRAPH_INPUTS];
} session;

/* Start StarPU (and MPI) with the common options; sets rank_of_process. Returns an exit code
 * (message printed); session_end() cleans up either way. */
int session_context(session *s, const train_options *o);

/* Open the data (the training split only when `need_train`) and create the model, with the
 * plan's stages and the --load-params parameters. Returns an exit code (message printed). */
int session_open(session *s, train_options *o, int need_train);

void session_end(session *s);

/* Loss and accuracy over a whole split, in batches of `batch` (the last one may be smaller);
 * every rank reads its own tiles of each batch. */
tsl_status evaluate(tsl_model_t model, tsl_dataset_t ds, const tsl_dataset_info *info,
                    int64_t batch, double *loss, double *accuracy);

/* Rank 0's status on every rank (a step only rank 0 can do: reading data, writing files). */
tsl_status agree(tsl_status st);

/* Rank 0's exit code on every rank. */
int agree_exit(int code);

/* Rank 0: can the run write `path` (given as `option`): a directory (`is_dir`; it may be
 * created) or a file written under a temporary name in its directory and renamed? 0, or
 * EXIT_USAGE with the reason printed. */
int check_output_path(const char *option, const char *path, int is_dir);

/* The worst status of any rank, on every rank. */
tsl_status agree_all(tsl_status st);

/* ---- files ---- */

/* Write `s` as a JSON string literal (quoted, escaped). */
void json_string(FILE *f, const char *s);

/* Write `write(f, arg)` to `path` under a temporary name, sync it and rename it: a crash never
 * leaves a partial file. 0 on success, -1 with errno set otherwise. */
int write_file_atomic(const char *path, int (*write)(FILE *f, const void *arg), const void *arg);

/* ---- checkpoints (checkpoint.c) ---- */

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
    char model[4096], data[4096], optimizer[16];
    long batch, epochs;
    double lr, momentum, weight_decay, dampening, beta1, beta2, eps;
    int nesterov;
    char lr_schedule[64];
    long warmup;
    char loss[128];
    char mgrit[128]; /* the plan's MGRIT schedule (mgrit_schedule), "" for the serial executor */
    unsigned long long seed;
    int shuffle;
} run_settings;

/* A plan's MGRIT schedule, the parts that change a training step's values:
 * "levels=L,cf=M,iters=F,biters=B,relax=R,skip=K", or "" with levels=1 (or no plan). */
void mgrit_schedule(const tsl_plan *plan, char *text, size_t size);

/* Where a training run stands: the next batch, the partial sums of the current epoch and the
 * metrics of the finished ones. */
typedef struct run_progress {
    int64_t epoch, batch, steps; /* next epoch and batch in it (from 0); steps taken */
    double loss_sum, seconds;    /* of the current epoch so far */
    int64_t hits, seen;
    int64_t nepochs;       /* finished epochs, metrics in epochs[0 .. nepochs) */
    epoch_metrics *epochs; /* capacity: the run's epoch count */
} run_progress;

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

/* Take the trajectory settings the command line left out from the checkpoint's `r`; those
 * given must match it (--epochs may differ: it extends or shortens the run). Returns an exit
 * code (message printed on rank 0). */
int merge_resumed(train_options *o, const run_settings *r);

/* The settings of the run `o` describes, for its checkpoints. */
void settings_of(const train_options *o, run_settings *r);

/* ---- the commands: argv[1] is the command's name; each returns the exit code ---- */

int command_info(int argc, char **argv);
int command_demo(int argc, char **argv);
int command_train(int argc, char **argv);
int command_eval(int argc, char **argv);
int command_bench(int argc, char **argv);
/* --plan auto (auto_plan.c). A rank's memory outside its tiles (libraries, threads, oneDNN's
 * code and scratch): 28-43 MiB measured (bench/RESULTS.md). */
#define PLAN_OVERHEAD_MIB 48

/* The tile memory a rank may use: mem_mib (> 0) less the overhead, else this node's memory
 * shared by ranks_here ranks (<= 0: the ranks on it, MPI's shared-memory split) less the
 * overhead. */
int64_t auto_budget_bytes(long mem_mib, long overhead_mib, long ranks_here);

/* The performance model's costs for g at this batch on ctx (collective; op_seconds: 6 x the ops):
 * the cached calibration of this model, batch and worker count, or a new one
 * (tsl_model_calibrate(), kept in the StarPU home's .starpu/tessel/), and the network measured now
 * (tsl_context_measure_link(), kept there too with several ranks). On one process predicting
 * for several ranks (for_ranks > 1), a calibration a run on several ranks kept comes first: it
 * holds the ops' costs on channel tiles and the waits between ranks one rank cannot measure.
 * *cached: 0 measured now, 1 from the cache, 2 from a run on several ranks. */
tsl_status auto_costs(tsl_context_t ctx, tsl_graph_t g, int64_t batch, int32_t for_ranks,
                      double *op_seconds, tsl_plan_costs *costs, int *cached);

/* The network the last run on several ranks measured (0), or -1 when none is kept. */
int auto_cached_link(double *latency, double *bandwidth);

/* qsort's order of doubles, ascending. */
int compare_doubles(const void *a, const void *b);

/* The search's first `shown` plans as a table. */
void print_ranked(const tsl_plan_prediction *ranked, int32_t shown, int32_t fit, int32_t total);

int command_plan(int argc, char **argv);

#endif /* TESSEL_CLI_H */
