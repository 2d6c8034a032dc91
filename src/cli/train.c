/* tessel train: a zoo network or model file trained on a dataset, with checkpoints
 * (checkpoint.c) and metrics. Every rank takes part in every step (the model's tile tasks
 * span the ranks); rank 0 reads the data, prints and writes files. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static void usage_train(FILE *out)
{
    fprintf(
        out,
        "usage: tessel train --data SPEC [--model NAME|FILE] [--epochs N] [--batch B] [--lr X]\n"
        "                    [--optimizer sgd|adam|adamw] [--momentum M] [--seed S]\n"
        "                    [--weight-decay W] [--dampening D] [--nesterov]\n"
        "                    [--betas B1,B2] [--eps E] [--lr-schedule S] [--warmup-steps W]\n"
        "                    [--max-steps N] [--shuffle on|off] [--load-params DIR]\n"
        "                    [--save-params DIR] [--checkpoint DIR [--checkpoint-every N]]\n"
        "                    [--resume DIR] [--metrics-json FILE] [--plan PLAN] [--ncpu N]\n"
        "                    [--sched NAME] [--host-cache-mib M] [--spin] [--comm-stats]\n"
        "                    [--rank-report] [--progress auto|bar|lines|off] [-q] [-v]\n"
        "                    [--log-level LEVEL] [--trace FILE] [--loss L]\n"
        "  --data SPEC         fashion-mnist, synthetic:dims=2,size=32,samples=64,classes=3\n"
        "                      or npy:DIR (docs/usage.md)\n"
        "  --model NAME|FILE   a network of the zoo (default cnn; listed below) or a model\n"
        "                      file (.json, docs/model-format.md)\n"
        "  --epochs N          passes over the training split (default 1)\n"
        "  --batch B           samples per step (default 64); an epoch's last incomplete\n"
        "                      batch is skipped\n"
        "  --lr X              learning rate (default 0.001 for adam and adamw, 0.01 for sgd)\n"
        "  --optimizer NAME    adam (default), adamw or sgd, as torch.optim's Adam, AdamW and\n"
        "                      SGD; for sgd --momentum M (default 0.9), --dampening D\n"
        "                      (default 0) and --nesterov; for adam and adamw --betas B1,B2\n"
        "                      (default 0.9,0.999) and --eps E (default 1e-8)\n"
        "  --weight-decay W    L2 penalty added to the gradient (sgd, adam), or decoupled\n"
        "                      decay (adamw); default 0, 0.01 for adamw\n"
        "  --lr-schedule S     the learning rate by step: constant (default), step:N:G (times G\n"
        "                      every N steps, as StepLR) or cosine:T[:MIN] (from --lr down to\n"
        "                      MIN, default 0, over T steps, as CosineAnnealingLR; then MIN)\n"
        "  --warmup-steps W    times (k + 1) / W at the first W steps k = 0 .. W - 1\n"
        "  --loss L            what the steps minimise: NAME[:WEIGHT],... a weighted sum of\n"
        "                      cross_entropy (default) and dice (soft Dice over the batch,\n"
        "                      segmentation outputs), e.g. cross_entropy,dice:0.5; or of mse\n"
        "                      and l1 on float targets (npy or hdf5 data whose y holds\n"
        "                      floats), e.g. mse,l1:0.3\n"
        "  --seed S            parameters, shuffling and synthetic data (default 1)\n"
        "  --max-steps N       stop after N optimizer steps (default: no limit)\n"
        "  --shuffle on|off    shuffle the training samples every epoch (default on)\n"
        "  --load-params DIR   start from DIR/NAME.npy parameters (PyTorch state_dict names)\n"
        "  --save-params DIR   write the trained parameters there\n"
        "  --checkpoint DIR    keep a checkpoint there (parameters, optimizer state, position\n"
        "                      in the data), taken after every epoch and when training\n"
        "                      stops; --checkpoint-every N also every N steps\n"
        "  --resume DIR        continue from DIR's checkpoint exactly as the run would have\n"
        "                      gone on; model, data, batch, optimizer and its settings, seed\n"
        "                      and shuffle come from it (given ones must match), --epochs\n"
        "                      and --max-steps count from the start of the first run\n"
        "                      (SIGINT, SIGTERM, SIGUSR1: every rank stops after the step,\n"
        "                      writes the checkpoint, parameters and metrics, and exits with\n"
        "                      130, 143, 138)\n"
        "  --metrics-json FILE per-epoch metrics, per-step losses and wall seconds, and the\n"
        "                      final test accuracy; as the run goes, a JSON line per step and\n"
        "                      per epoch appended to FILE with .json replaced by .jsonl\n"
        "                      (FILE.jsonl otherwise), continued by --resume\n"
        "  --plan PLAN         how tensors are tiled over the ranks:\n"
        "                      data=D,space=AxBxC,stages=S,micro=M,balance=B,tiles=T,shard=E,\n"
        "                      bucket=K (D sample groups, an A x B x C spatial rank grid with\n"
        "                      halo exchange, S pipeline stages of consecutive layers with M\n"
        "                      micro-batches, cut by memory (default), time or layers, T more\n"
        "                      tiles along the longest dimension (or samples), weights of at\n"
        "                      least E elements (default 4096) sharded over their stage's\n"
        "                      ranks, the other parameters' gradients sent in packs of up to\n"
        "                      K elements, default 65536, 0: one message per parameter),\n"
        "                      recompute=1 to drop batch-norm + ReLU outputs after the\n"
        "                      forward and make them again for the backward (less memory, one\n"
        "                      more pass per layer); D x A x B x C x S must be the rank count\n"
        "                      (default: samples split over all ranks and workers)\n"
        "  --comm-stats        count the bytes StarPU-MPI moves and the time workers spend\n"
        "                      executing tasks: per-step traffic of the busiest rank and the\n"
        "                      workers' busy fraction in the summaries and the metrics\n"
        "  --trace FILE        a task trace of the run (every rank's tasks: codelet, layer,\n"
        "                      pass, worker, start, end; the first 2^20 a rank; and the\n"
        "                      rank's buffer memory in use over time, and how much of\n"
        "                      it StarPU-MPI receives into) written to\n"
        "                      FILE at the end as Chrome/Perfetto trace-event JSON: open it\n"
        "                      in https://ui.perfetto.dev; for a few steps (--max-steps)\n"
        "  --rank-report       after each epoch's summary, a line per rank: peak memory,\n"
        "                      tiles, most buffer memory at once, and with --comm-stats the\n"
        "                      bytes it sent and received per step (the metrics file has them\n"
        "                      always)\n"
        "  --progress MODE     auto (default): a bar rewritten in place where rank 0's\n"
        "                      stdout is a terminal and no MPI launcher started the job,\n"
        "                      lines otherwise; bar, lines, or off (epoch summaries only)\n"
        "  -q, --quiet         errors only (and --progress off unless given)\n"
        "  -v, --verbose       the library's info messages, and StarPU's own\n"
        "  --log-level LEVEL   error, warn (default), info or debug; below info StarPU is\n"
        "                      quiet (STARPU_SILENT=1 unless set in the environment)\n"
        "  --ncpu N, --sched NAME  CPU workers per rank, StarPU scheduler\n"
        "  --host-cache-mib M  MiB of freed tile buffers each rank keeps for reuse (default:\n"
        "                      an eighth of the rank's share of the node's memory, 32 to\n"
        "                      1024; 0 none): spares fresh pages for each step's activations\n"
        "  --spin              idle workers and MPI waits poll instead of yielding their\n"
        "                      core; the default (yield) is faster where threads outnumber\n"
        "                      cores\n");
    int32_t n;
    const char *const *desc;
    const char *const *names = tsl_zoo_names(&n, &desc);
    fprintf(out, "models:\n");
    for (int32_t i = 0; i < n; i++)
        fprintf(out, "  %-8s %s\n", names[i], desc[i]);
}

enum {
    OPT_EPOCHS = OPT_COMMAND_FIRST,
    OPT_MAX_STEPS,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_WEIGHT_DECAY,
    OPT_DAMPENING,
    OPT_NESTEROV,
    OPT_BETAS,
    OPT_EPS,
    OPT_LR_SCHEDULE,
    OPT_WARMUP_STEPS,
    OPT_OPTIMIZER,
    OPT_SEED,
    OPT_SHUFFLE,
    OPT_SAVE_PARAMS,
    OPT_METRICS_JSON,
    OPT_CHECKPOINT,
    OPT_CHECKPOINT_EVERY,
    OPT_RESUME,
    OPT_COMM_STATS,
    OPT_RANK_REPORT,
    OPT_PROGRESS,
    OPT_TRACE
};

/* An option of tessel train's own (those it shares with tessel eval first). */
static int parse_train_option(const cli_parser *parser, int id, const char *v)
{
    train_options *o = parser->state;
    int got = parse_run_option(parser, id, v);
    if (got != OPTION_UNKNOWN)
        return got;
    int bad = 0;
    switch (id) {
    case OPT_COMM_STATS:
        o->comm_stats = 1;
        o->common.config.comm_stats = 1;
        return OPTION_OK;
    case OPT_RANK_REPORT:
        o->rank_report = 1;
        return OPTION_OK;
    case OPT_TRACE:
        o->trace = v;
        return OPTION_OK;
    case OPT_PROGRESS: {
        static const char *const modes[] = {"auto", "bar", "lines", "off"};
        for (int m = PROGRESS_AUTO; m <= PROGRESS_OFF; m++)
            if (strcmp(v, modes[m]) == 0) {
                o->progress = m;
                o->given_progress = 1;
                return OPTION_OK;
            }
        return OPTION_BAD_VALUE;
    }
    case OPT_EPOCHS:
        bad = parse_int_arg(v, 1, MAX_EPOCHS, &o->epochs);
        o->given |= SET_EPOCHS;
        break;
    case OPT_MAX_STEPS:
        bad = parse_int_arg(v, 1, 1L << 40, &o->max_steps);
        break;
    case OPT_LR:
        bad = parse_double_arg(v, MIN_LR, &o->lr);
        o->given |= SET_LR;
        break;
    case OPT_MOMENTUM:
        bad = parse_double_arg(v, 0, &o->momentum);
        o->given |= SET_MOMENTUM;
        break;
    case OPT_WEIGHT_DECAY:
        bad = parse_double_arg(v, 0, &o->weight_decay);
        o->given |= SET_WEIGHT_DECAY;
        break;
    case OPT_DAMPENING:
        bad = parse_double_arg(v, 0, &o->dampening) || o->dampening > 1;
        o->given |= SET_DAMPENING;
        break;
    case OPT_NESTEROV:
        o->nesterov = 1;
        o->given |= SET_NESTEROV;
        break;
    case OPT_BETAS: {
        char first[64];
        const char *comma = strchr(v, ',');
        bad = !comma || (size_t)(comma - v) >= sizeof first;
        if (!bad) {
            memcpy(first, v, (size_t)(comma - v));
            first[comma - v] = 0;
            bad = parse_double_arg(first, 0, &o->beta1) ||
                  parse_double_arg(comma + 1, 0, &o->beta2) || o->beta1 >= 1 || o->beta2 >= 1;
        }
        o->given |= SET_BETAS;
        break;
    }
    case OPT_EPS:
        bad = parse_double_arg(v, 0, &o->eps) || !(o->eps > 0);
        o->given |= SET_EPS;
        break;
    case OPT_LR_SCHEDULE: {
        long warmup = o->schedule.warmup; /* --warmup-steps may come first */
        bad = strlen(v) >= sizeof(((run_settings *)0)->lr_schedule) ||
              parse_lr_schedule(v, &o->schedule);
        o->schedule.warmup = warmup;
        o->lr_schedule = v;
        o->given |= SET_SCHEDULE;
        break;
    }
    case OPT_WARMUP_STEPS:
        bad = parse_int_arg(v, 0, 1L << 40, &o->schedule.warmup);
        o->given |= SET_WARMUP;
        break;
    case OPT_OPTIMIZER:
        bad = !optimizer_known(v);
        o->optimizer = v;
        o->given |= SET_OPTIMIZER;
        break;
    case OPT_SEED:
        bad = parse_seed_arg(v, &o->seed);
        o->given |= SET_SEED;
        break;
    case OPT_SHUFFLE:
        bad = strcmp(v, "on") && strcmp(v, "off");
        o->shuffle = strcmp(v, "on") == 0;
        o->given |= SET_SHUFFLE;
        break;
    case OPT_SAVE_PARAMS:
        o->save_params = v;
        break;
    case OPT_METRICS_JSON:
        o->metrics_json = v;
        break;
    case OPT_CHECKPOINT:
        o->checkpoint = v;
        break;
    case OPT_CHECKPOINT_EVERY:
        bad = parse_int_arg(v, 1, 1L << 40, &o->checkpoint_every);
        break;
    case OPT_RESUME:
        o->resume = v;
        break;
    default:
        return OPTION_UNKNOWN;
    }
    return bad ? OPTION_BAD_VALUE : OPTION_OK;
}

/* Parse and check the options; returns -1 to exit 0 (help), an exit code > 0, or 0. */
static int parse_train(int argc, char **argv, train_options *o)
{
    static const struct option options[] = {
        CLI_HELP_OPTION,
        CLI_COMMON_OPTIONS,
        CLI_RUN_OPTIONS,
        {"epochs", required_argument, NULL, OPT_EPOCHS},
        {"max-steps", required_argument, NULL, OPT_MAX_STEPS},
        {"lr", required_argument, NULL, OPT_LR},
        {"momentum", required_argument, NULL, OPT_MOMENTUM},
        {"weight-decay", required_argument, NULL, OPT_WEIGHT_DECAY},
        {"dampening", required_argument, NULL, OPT_DAMPENING},
        {"nesterov", no_argument, NULL, OPT_NESTEROV},
        {"betas", required_argument, NULL, OPT_BETAS},
        {"eps", required_argument, NULL, OPT_EPS},
        {"lr-schedule", required_argument, NULL, OPT_LR_SCHEDULE},
        {"warmup-steps", required_argument, NULL, OPT_WARMUP_STEPS},
        {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
        {"seed", required_argument, NULL, OPT_SEED},
        {"shuffle", required_argument, NULL, OPT_SHUFFLE},
        {"save-params", required_argument, NULL, OPT_SAVE_PARAMS},
        {"metrics-json", required_argument, NULL, OPT_METRICS_JSON},
        {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
        {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
        {"resume", required_argument, NULL, OPT_RESUME},
        {"comm-stats", no_argument, NULL, OPT_COMM_STATS},
        {"rank-report", no_argument, NULL, OPT_RANK_REPORT},
        {"progress", required_argument, NULL, OPT_PROGRESS},
        {"trace", required_argument, NULL, OPT_TRACE},
        {0}};
    train_options_init(o);
    cli_parser parser = {"tessel train", options, usage_train, &o->common, parse_train_option, o};
    const char *cmd = parser.command;
    int code = cli_parse(&parser, argc, argv);
    if (code || (code = check_run_options(&parser, o)))
        return code;
    /* resumed: the checkpoint's optimizer and settings, checked when it is read */
    if (o->lr < 0)
        o->lr = strcmp(o->optimizer, "sgd") == 0 ? 0.01 : 0.001;
    if (!o->resume && (code = check_optimizer_options(o, cmd)))
        return code;
    if (o->momentum >= 1) {
        fprintf(stderr, "%s: --momentum must be below 1\n", cmd);
        return EXIT_USAGE;
    }
    if (o->resume && o->load_params) {
        fprintf(stderr, "%s: --resume and --load-params both set the parameters; give one\n", cmd);
        return EXIT_USAGE;
    }
    if (o->checkpoint_every && !o->checkpoint) {
        fprintf(stderr, "%s: --checkpoint-every needs --checkpoint DIR\n", cmd);
        return EXIT_USAGE;
    }
    /* A checkpoint keeps the model and data as given; one it cannot keep whole could not be
     * resumed. */
    run_settings kept;
    const char *too_long = !o->checkpoint                                   ? NULL
                           : strlen(o->model) >= sizeof kept.model          ? "--model"
                           : o->data && strlen(o->data) >= sizeof kept.data ? "--data"
                                                                            : NULL;
    if (too_long) {
        fprintf(stderr, "%s: %s is longer than a checkpoint keeps (%zu characters at most)\n", cmd,
                too_long, sizeof kept.model - 1);
        return EXIT_USAGE;
    }
    return 0;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Peak resident memory of every rank, in MiB, gathered on rank 0 (max and rank 0's). */
static void peak_memory(double *max_mib, double *rank0_mib)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mine = (double)ru.ru_maxrss / 1024.0, max = 0;
    MPI_Reduce(&mine, &max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    *max_mib = max;
    *rank0_mib = mine;
}

/* "1h02m03s", "2m03s" or "5s". */
static const char *duration(double seconds, char *text, size_t cap)
{
    long total = seconds > 0 && seconds < 1e9 ? (long)(seconds + 0.5) : 0;
    if (total >= 3600)
        snprintf(text, cap, "%ldh%02ldm%02lds", total / 3600, total / 60 % 60, total % 60);
    else if (total >= 60)
        snprintf(text, cap, "%ldm%02lds", total / 60, total % 60);
    else
        snprintf(text, cap, "%lds", total);
    return text;
}

/* ---- stopping on a signal ----
 * SIGINT, SIGTERM and SIGUSR1 (a batch system's warning before the walltime) ask the run to
 * stop: the handler only records the signal; after each step the ranks agree on it (one
 * MPI_Allreduce of an int), so a signal delivered to any rank stops every rank after the same
 * step, with a checkpoint, the parameters and the metrics written. */

static volatile sig_atomic_t stop_signal; /* the last signal received, 0 for none */

static const int stop_signals[] = {SIGINT, SIGTERM, SIGUSR1};

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

/* Catch SIGINT, SIGTERM and SIGUSR1 (`catch`), or give them back their default action. */
static void catch_stop_signals(int catch)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = catch ? on_stop_signal : SIG_DFL;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof *stop_signals; i++)
        sigaction(stop_signals[i], &sa, NULL);
}

/* Collective: the signal any rank has received (the largest number where they differ), 0 for
 * none. Once one is noticed the default actions are back: a second signal ends the process at
 * once. */
static int agreed_stop_signal(void)
{
    int mine = stop_signal, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any)
        catch_stop_signals(0);
    return any;
}

static const char *signal_name(int sig)
{
    return sig == SIGINT    ? "SIGINT"
           : sig == SIGTERM ? "SIGTERM"
           : sig == SIGUSR1 ? "SIGUSR1"
                            : "a signal";
}

/* An accuracy as JSON: null for a run on float targets, which has none. */
static void json_accuracy(FILE *f, double accuracy, int targets)
{
    if (targets)
        fprintf(f, "null");
    else
        fprintf(f, "%.9g", accuracy);
}

/* An epoch's metrics as JSON members, "\"train_loss\": ..." up to the per-rank rows (where
 * kept); the caller opens and closes the object. `targets`: a run on float targets (no
 * accuracy). */
static void write_epoch_fields(FILE *f, const epoch_metrics *m, int nranks, int targets)
{
    fprintf(f, "\"train_loss\": %.9g, \"train_accuracy\": ", m->train_loss);
    json_accuracy(f, m->train_accuracy, targets);
    fprintf(f, ", \"test_loss\": %.9g, \"test_accuracy\": ", m->test_loss);
    json_accuracy(f, m->test_accuracy, targets);
    fprintf(f,
            ", \"seconds\": %.3f, "
            "\"samples_per_second\": %.1f, \"peak_memory_mib\": %.1f, "
            "\"tile_memory_mib\": %.3f, \"buffer_peak_mib\": %.3f, \"cached_peak_mib\": %.3f",
            m->seconds, m->samples_per_second, m->peak_mib, m->owned_mib, m->buffer_peak_mib,
            m->cached_peak_mib);
    if (m->sent_per_step >= 0)
        fprintf(f,
                ", \"sent_bytes_per_step\": %.0f, \"received_bytes_per_step\": %.0f, "
                "\"workers_busy\": %.4f",
                m->sent_per_step, m->received_per_step, m->busy);
    if (m->ranks) {
        fprintf(f, ", \"ranks\": [");
        for (int r = 0; r < nranks; r++) {
            const double *v = m->ranks + (size_t)r * RANK_FIELDS;
            fprintf(f,
                    "%s{\"peak_memory_mib\": %.1f, \"tile_memory_mib\": %.3f, "
                    "\"buffer_peak_mib\": %.3f, \"cached_peak_mib\": %.3f",
                    r ? ", " : "", v[0], v[1], v[2], v[5]);
            if (v[3] >= 0)
                fprintf(f, ", \"sent_bytes_per_step\": %.0f, \"received_bytes_per_step\": %.0f",
                        v[3], v[4]);
            fprintf(f, "}");
        }
        fprintf(f, "]");
    }
}

typedef struct metrics_file {
    const train_options *o;
    const epoch_metrics *m;
    int64_t n, steps, first_step, nlosses;
    const double *losses, *step_seconds;
    int nranks;
    int signal;  /* the signal that stopped the run, 0 for none */
    int targets; /* a run on float targets: no accuracy */
} metrics_file;

static int write_metrics_to(FILE *f, const void *arg)
{
    const metrics_file *mf = arg;
    const train_options *o = mf->o;
    fprintf(f, "{\n  \"model\": ");
    json_string(f, o->model);
    fprintf(f, ",\n  \"data\": ");
    json_string(f, o->data);
    fprintf(f, ",\n  \"optimizer\": \"%s\",\n", o->optimizer);
    fprintf(f, "  \"lr\": %.17g,\n  \"batch\": %ld,\n  \"seed\": %llu,\n  \"steps\": %lld,\n",
            o->lr, o->batch, o->seed, (long long)mf->steps);
    fprintf(f, "  \"epochs\": [\n");
    for (int64_t e = 0; e < mf->n; e++) {
        fprintf(f, "    {\"epoch\": %lld, ", (long long)e + 1);
        write_epoch_fields(f, &mf->m[e], mf->nranks, mf->targets);
        fprintf(f, "}%s\n", e + 1 < mf->n ? "," : "");
    }
    fprintf(f, "  ],\n  \"first_step\": %lld,\n  \"step_losses\": [",
            (long long)mf->first_step + 1);
    for (int64_t k = 0; k < mf->nlosses; k++)
        fprintf(f, "%s%.17g", k ? ", " : "", mf->losses[k]);
    fprintf(f, "],\n  \"step_seconds\": [");
    for (int64_t k = 0; k < mf->nlosses; k++)
        fprintf(f, "%s%.6f", k ? ", " : "", mf->step_seconds[k]);
    fprintf(f, "]");
    if (o->plan_auto && o->plan_text) { /* the chosen plan: predicted against measured */
        double *sorted = mf->nlosses > 1 ? malloc(sizeof *sorted * (size_t)mf->nlosses) : NULL;
        double measured = -1;
        if (sorted) { /* the median step, the first (warm-up) left out */
            int64_t n = mf->nlosses - 1;
            memcpy(sorted, mf->step_seconds + 1, sizeof *sorted * (size_t)n);
            qsort(sorted, (size_t)n, sizeof *sorted, compare_doubles);
            measured = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
            free(sorted);
        }
        fprintf(f, ",\n  \"plan_auto\": {\"plan\": ");
        json_string(f, o->plan_text);
        fprintf(f, ", \"predicted_seconds_per_step\": %.6g, \"measured_seconds_per_step\": %.6g}",
                o->plan_predicted, measured);
    }
    if (mf->signal)
        fprintf(f, ",\n  \"stopped_by\": \"%s\"", signal_name(mf->signal));
    fprintf(f, ",\n  \"final_test_accuracy\": ");
    json_accuracy(f, mf->n ? mf->m[mf->n - 1].test_accuracy : 0.0, mf->targets);
    fprintf(f, "\n}\n");
    return 0;
}

/* A training run: its options, context, data and model, what its checkpoints keep (settings
 * and progress), and what this process alone keeps (per-step losses and times, the epoch's
 * sample order). */
typedef struct train_run {
    train_options o;
    session s;
    run_settings resumed, settings; /* resumed: the checkpoint's (o's strings may point there) */
    run_progress p;
    tsl_optimizer_t opt;
    char snapshot[4096];
    double *losses, *step_secs; /* per step: the loss, the wall time */
    int64_t nlosses, losses_cap, first_step;
    int64_t *order;      /* the epoch's sample order */
    int64_t metrics_cap; /* entries of p.epochs whose `ranks` may need freeing */
    int64_t steps_per_epoch;
    int rank, nranks;
    int bar, lines; /* rank 0: --progress as a bar, as lines (or neither) */
    int signal;     /* the signal every rank agreed to stop on (0: none) */
    FILE *stream;   /* rank 0, with --metrics-json: the metrics stream (JSON lines) */
    char stream_path[4200];
    double start; /* when this process's training began (now()) */
} train_run;

/* ---- the metrics stream ----
 * With --metrics-json FILE, rank 0 also appends JSON lines to FILE with .json replaced by
 * .jsonl (FILE.jsonl for another name): a record per step, per epoch and per stop by a signal,
 * each flushed as it is written. --resume appends to the file, keeping only the records up to
 * the checkpoint's step (a run that died after its last checkpoint wrote more). */

typedef struct kept_records {
    FILE *old;
    int64_t steps;
} kept_records;

/* The whole records of an earlier stream with "step" up to k->steps. */
static int write_kept(FILE *f, const void *arg)
{
    const kept_records *k = arg;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int bad = 0;
    while (!bad && (len = getline(&line, &cap, k->old)) > 0) {
        cJSON *record = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(record, "step");
        int keep =
            line[len - 1] == '\n' && cJSON_IsNumber(step) && step->valuedouble <= (double)k->steps;
        cJSON_Delete(record);
        bad = keep && fputs(line, f) == EOF;
    }
    free(line);
    return bad || ferror(k->old) ? -1 : 0;
}

/* Rank 0, at the start: the stream opened afresh, or for --resume continued. Returns an exit
 * code (message printed). */
static int stream_open(train_run *r)
{
    const train_options *o = &r->o;
    const char *path = r->stream_path;
    size_t n = strlen(o->metrics_json);
    int len = n > 5 && strcmp(o->metrics_json + n - 5, ".json") == 0
                  ? snprintf(r->stream_path, sizeof r->stream_path, "%sl", o->metrics_json)
                  : snprintf(r->stream_path, sizeof r->stream_path, "%s.jsonl", o->metrics_json);
    struct stat sb;
    const char *why = len >= (int)sizeof r->stream_path              ? "the name is too long"
                      : stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) ? "not a regular file"
                                                                     : NULL;
    FILE *old = !why && o->resume ? fopen(path, "r") : NULL;
    if (old) {
        kept_records k = {old, r->p.steps};
        if (write_file_atomic(path, write_kept, &k) != 0)
            why = strerror(errno);
        fclose(old);
    }
    if (!why && !(r->stream = fopen(path, o->resume ? "a" : "w")))
        why = strerror(errno);
    if (why) {
        fprintf(stderr, "tessel train: cannot write the metrics stream '%s': %s\n", path, why);
        return EXIT_USAGE;
    }
    return 0;
}

/* Rank 0: close the record begun on the stream and flush it, so that a reader sees it at once;
 * a write that fails ends the stream with a message (training goes on). */
static void stream_end_record(train_run *r)
{
    if (fputs("}\n", r->stream) == EOF || fflush(r->stream) != 0) {
        fprintf(stderr, "tessel train: cannot write '%s': %s; the metrics stream stops here\n",
                r->stream_path, strerror(errno));
        fclose(r->stream);
        r->stream = NULL;
    }
}

/* Context, checkpoint (with --resume), data, model, room for the metrics, optimizer. Returns an
 * exit code (message printed). */
static int train_start(train_run *r)
{
    train_options *o = &r->o;
    run_progress *p = &r->p;
    int code;
    tsl_status st;
    if ((code = session_context(&r->s, o)))
        return code;
    /* Where the results go is checked before anything is trained. */
    if (rank_of_process == 0 && o->save_params)
        code = check_output_path("--save-params", o->save_params, 1);
    if (rank_of_process == 0 && !code && o->metrics_json)
        code = check_output_path("--metrics-json", o->metrics_json, 0);
    if (rank_of_process == 0 && !code && o->checkpoint)
        code = check_output_path("--checkpoint", o->checkpoint, 1);
    if (rank_of_process == 0 && !code && o->trace)
        code = check_output_path("--trace", o->trace, 0);
    if ((code = agree_exit(code)))
        return code;
    if (o->resume &&
        ((code = checkpoint_read(o->resume, &r->resumed, p, r->snapshot, sizeof r->snapshot)) ||
         (code = merge_resumed(o, &r->resumed))))
        return code;
    if ((code = agree_exit(rank_of_process == 0 && o->metrics_json ? stream_open(r) : 0)))
        return code;
    if ((code = session_open(&r->s, o, 1)))
        return code;
    r->rank = rank_of_process;
    r->nranks = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &r->nranks);
    r->steps_per_epoch = r->s.train_info.samples / o->batch;
    if (r->steps_per_epoch < 1) {
        if (r->rank == 0) /* alike on every rank */
            fprintf(stderr,
                    "tessel train: the training split has %lld samples, fewer than one "
                    "batch of %ld\n",
                    (long long)r->s.train_info.samples, o->batch);
        return EXIT_USAGE;
    }
    if (p->batch >= r->steps_per_epoch) {
        if (r->rank == 0)
            fprintf(stderr,
                    "tessel train: the checkpoint stands at batch %lld of an epoch of %lld\n",
                    (long long)p->batch, (long long)r->steps_per_epoch);
        return 1;
    }
    /* Room for every epoch's metrics (a resumed run may go on for more epochs). */
    int64_t cap = o->epochs > p->nepochs ? o->epochs : p->nepochs;
    epoch_metrics *grown = realloc(p->epochs, (size_t)(cap + 1) * sizeof *grown);
    if (!grown)
        return fail_oom("for the metrics of every epoch", (double)(cap + 1) * sizeof *grown);
    memset(grown + p->nepochs, 0, (size_t)(cap + 1 - p->nepochs) * sizeof *grown);
    p->epochs = grown;
    r->metrics_cap = cap + 1;
    settings_of(o, &r->settings);
    if ((st = create_optimizer(o, r->s.ctx, &r->opt)))
        return fail_collective(st, "creating the optimizer");
    if (o->resume && (st = tsl_model_load_checkpoint(r->s.model, r->opt, r->snapshot)))
        return fail_collective(st, "resuming from the checkpoint");
    /* A training forward per step: the resumed steps draw the dropout masks they would have. */
    if ((st = tsl_model_set_step(r->s.model, p->steps)))
        return fail_collective(st, "resuming from the checkpoint");
    int mode = o->progress;
    if (mode == PROGRESS_AUTO)
        mode = !o->given_progress && o->common.config.log_level == TSL_LOG_ERROR ? PROGRESS_OFF
               : isatty(fileno(stdout)) && !under_mpi_launcher()                 ? PROGRESS_BAR
                                                                                 : PROGRESS_LINES;
    r->bar = r->rank == 0 && mode == PROGRESS_BAR;
    r->lines = r->rank == 0 && mode == PROGRESS_LINES;
    catch_stop_signals(1);
    return 0;
}

/* Rank 0: what is trained on what, the plan, and where a resumed run stands. */
static void print_start(const train_run *r)
{
    const train_options *o = &r->o;
    const run_progress *p = &r->p;
    int32_t ranks, ncpu;
    tsl_context_size(r->s.ctx, &ranks);
    tsl_context_worker_count(r->s.ctx, TSL_WORKER_CPU, &ncpu);
    printf("tessel train: model %s, data %s (%lld training, %lld test samples), %d ranks x "
           "%d CPU workers, %s lr %g, batch %ld, seed %llu\n",
           o->model, o->data, (long long)r->s.train_info.samples, (long long)r->s.test_info.samples,
           (int)ranks, (int)ncpu, o->optimizer, o->lr, o->batch, o->seed);
    if (o->plan_text) {
        char text[256];
        tsl_plan_format(&o->plan, text, sizeof text);
        printf("plan %s\n", text);
    }
    if (o->resume)
        printf("resuming from %s: epoch %lld, step %lld of the epoch, %lld steps taken\n",
               r->snapshot, (long long)p->epoch + 1, (long long)p->batch, (long long)p->steps);
    fflush(stdout);
}

/* Keep a step's loss and its wall time since `step_start`. Returns an exit code. */
static int record_step(train_run *r, double loss, double step_start)
{
    if (r->nlosses == r->losses_cap) {
        r->losses_cap = r->losses_cap ? 2 * r->losses_cap : 1024;
        double *more = realloc(r->losses, (size_t)r->losses_cap * sizeof *more);
        if (more)
            r->losses = more;
        double *more_secs =
            more ? realloc(r->step_secs, (size_t)r->losses_cap * sizeof *more) : NULL;
        if (!more_secs)
            return fail_oom("for the losses of every step",
                            (double)r->losses_cap * 2 * sizeof *more);
        r->step_secs = more_secs;
    }
    r->step_secs[r->nlosses] = now() - step_start; /* the step returns with its loss */
    r->losses[r->nlosses++] = loss;
    return 0;
}

/* Rank 0: where epoch e stands `epoch_seconds` into it: step, mean loss, samples/s, time since
 * training began and the estimated time to the end of the run (all epochs, or --max-steps, at
 * this process's mean time per step). */
static void show_progress(const train_run *r, int64_t e, double epoch_seconds)
{
    const train_options *o = &r->o;
    const run_progress *p = &r->p;
    double elapsed = now() - r->start;
    int64_t left = r->steps_per_epoch - p->batch + (o->epochs - e - 1) * r->steps_per_epoch;
    if (o->max_steps && o->max_steps - p->steps < left)
        left = o->max_steps - p->steps;
    double per_step = elapsed / (double)(p->steps - r->first_step);
    double rate = (double)p->seen / epoch_seconds,
           loss = p->loss_sum / (double)(p->seen / o->batch);
    char spent[32], eta[32];
    duration(elapsed, spent, sizeof spent);
    duration((double)(left > 0 ? left : 0) * per_step, eta, sizeof eta);
    if (r->bar) {
        char bar[31];
        int filled = (int)(30 * p->batch / r->steps_per_epoch);
        for (int i = 0; i < 30; i++)
            bar[i] = i < filled ? '#' : '.';
        bar[30] = '\0';
        printf("\r\033[Kepoch %lld/%ld [%s] step %lld/%lld loss %.4f %.0f samples/s elapsed %s "
               "ETA %s",
               (long long)e + 1, o->epochs, bar, (long long)p->batch, (long long)r->steps_per_epoch,
               loss, rate, spent, eta);
    } else {
        printf("epoch %lld/%ld step %lld/%lld loss %.4f %.0f samples/s elapsed %s ETA %s\n",
               (long long)e + 1, o->epochs, (long long)p->batch, (long long)r->steps_per_epoch,
               loss, rate, spent, eta);
    }
    fflush(stdout);
}

/* The MGRIT residual norms of the last step (plan levels= > 1), each segment's forward and
 * backward, and their mean convergence factor (the geometric mean of the ratios of
 * successive norms; -1 with fewer than two norms or a zero one). */
static double mgrit_factor(const double *r, int32_t n)
{
    if (n < 2 || !(r[0] > 0) || !(r[n - 1] > 0))
        return -1;
    return pow(r[n - 1] / r[0], 1.0 / (double)(n - 1));
}

/* `, "mgrit": [{"forward": [...], "forward_factor": F, "backward": [...], ...}, ...]`. */
static void write_mgrit(FILE *f, tsl_model_t m)
{
    int32_t nseg = tsl_model_mgrit_segments(m);
    if (nseg < 1)
        return;
    fprintf(f, ", \"mgrit\": [");
    for (int32_t s = 0; s < nseg; s++) {
        fprintf(f, "%s{", s ? ", " : "");
        for (int dir = 0; dir < 2; dir++) {
            double norms[64];
            int32_t n = 0;
            tsl_model_mgrit_residuals(m, s, dir, 64, norms, &n);
            n = n < 64 ? n : 64;
            fprintf(f, "%s\"%s\": [", dir ? ", " : "", dir ? "backward" : "forward");
            for (int32_t i = 0; i < n; i++)
                fprintf(f, "%s%.17g", i ? ", " : "", norms[i]);
            fprintf(f, "], \"%s_factor\": %.6g", dir ? "backward" : "forward",
                    mgrit_factor(norms, n));
        }
        fprintf(f, "}");
    }
    fprintf(f, "]");
}

/* Rank 0, with --comm-stats: the last step's MGRIT residual norms, a line per segment. */
static void print_mgrit(tsl_model_t m)
{
    for (int32_t s = 0; s < tsl_model_mgrit_segments(m); s++)
        for (int dir = 0; dir < 2; dir++) {
            double norms[64];
            int32_t n = 0;
            tsl_model_mgrit_residuals(m, s, dir, 64, norms, &n);
            n = n < 64 ? n : 64;
            printf("  MGRIT segment %d %s residuals (last step):", (int)s,
                   dir ? "backward" : "forward");
            for (int32_t i = 0; i < n; i++)
                printf(" %.3e", norms[i]);
            double f = mgrit_factor(norms, n);
            if (f >= 0)
                printf(", convergence factor %.3g", f);
            printf("\n");
        }
}

/* The steps of the current epoch from its next batch, until its end, --max-steps (*stop) or a
 * signal (r->signal: after the epoch's last step the epoch ends first), with progress lines and
 * mid-epoch checkpoints. Returns an exit code. */
static int run_steps(train_run *r, double t0, int64_t *steps_here, int *stop)
{
    const train_options *o = &r->o;
    run_progress *p = &r->p;
    int64_t e = p->epoch, steps_per_epoch = r->steps_per_epoch;
    double last_print = 0;
    int code;
    while (p->batch < steps_per_epoch) {
        double loss = 0, step_start = now();
        int64_t correct = 0;
        tsl_status st = TSL_OK;
        if (o->schedule.kind != SCHEDULE_CONSTANT || o->schedule.warmup > 0)
            st = tsl_optimizer_set_lr(r->opt, scheduled_lr(&o->schedule, o->lr, p->steps));
        /* The epoch's next batch is read while this step runs (not past --max-steps). */
        const int64_t *next =
            p->batch + 1 < steps_per_epoch && !(o->max_steps && p->steps + 1 >= o->max_steps)
                ? r->order + (p->batch + 1) * o->batch
                : NULL;
        if (!st)
            st = tsl_model_train_step_read_next(r->s.model, r->s.train, o->batch,
                                                r->order + p->batch * o->batch, next, r->opt, &loss,
                                                &correct);
        if (st)
            return fail_collective(st, "a training step");
        if ((code = record_step(r, loss, step_start)))
            return code;
        p->loss_sum += loss;
        p->hits += correct;
        p->seen += o->batch;
        p->steps++;
        p->batch++;
        (*steps_here)++;
        if (r->stream) {
            fprintf(r->stream,
                    "{\"record\": \"step\", \"step\": %lld, \"epoch\": %lld, \"batch\": %lld, "
                    "\"loss\": %.17g, \"seconds\": %.6f",
                    (long long)p->steps, (long long)e + 1, (long long)p->batch, loss,
                    r->step_secs[r->nlosses - 1]);
            write_mgrit(r->stream, r->s.model);
            stream_end_record(r);
        }
        *stop = o->max_steps && p->steps >= o->max_steps;
        double t = now() - t0;
        int last = p->batch == steps_per_epoch || *stop;
        if ((r->bar && (last || t - last_print > 0.2)) ||
            (r->lines && (last || p->batch % (steps_per_epoch / 10 + 1) == 0))) {
            last_print = t;
            show_progress(r, e, t);
        }
        if (!*stop && p->batch < steps_per_epoch)
            r->signal = agreed_stop_signal();
        int every = o->checkpoint_every && p->steps % o->checkpoint_every == 0;
        if (o->checkpoint && p->batch < steps_per_epoch && (every || *stop || r->signal)) {
            /* Mid-epoch: the epoch's partial sums travel with the checkpoint. */
            p->seconds = now() - t0;
            if ((code = checkpoint_save(r->s.model, r->opt, o->checkpoint, &r->settings, p)))
                return code;
        }
        if (*stop || r->signal)
            break;
    }
    return 0;
}

/* With --comm-stats, at the start of an epoch: the bytes moved so far (the workers' times
 * are read to start their count afresh). Returns an exit code. */
static int traffic_start(train_run *r, int64_t *sent0, int64_t *recv0)
{
    double exec = 0, alive = 0;
    tsl_status st;
    if ((st = tsl_context_wait(r->s.ctx)) ||
        (st = tsl_context_worker_seconds(r->s.ctx, &exec, &alive)) ||
        (st = tsl_context_comm_bytes(r->s.ctx, sent0, recv0)))
        return fail(st, "reading communication statistics");
    return 0;
}

/* With --comm-stats, at the end of an epoch's steps: the busiest rank's traffic per step
 * (evaluation left out) and the workers' busy fraction into m, this rank's traffic into
 * row[3] and row[4]. Returns an exit code. */
static int traffic_end(train_run *r, epoch_metrics *m, double *row, int64_t sent0, int64_t recv0,
                       int64_t steps_here)
{
    int64_t sent1, recv1;
    double exec = 0, alive = 0;
    tsl_status st;
    if ((st = tsl_context_wait(r->s.ctx)) ||
        (st = tsl_context_worker_seconds(r->s.ctx, &exec, &alive)) ||
        (st = tsl_context_comm_bytes(r->s.ctx, &sent1, &recv1)))
        return fail(st, "reading communication statistics");
    double times[2] = {exec, alive}, sums[2];
    MPI_Allreduce(times, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    m->busy = sums[1] > 0 ? sums[0] / sums[1] : 0;
    double mine[2] = {(double)(sent1 - sent0) / (double)steps_here,
                      (double)(recv1 - recv0) / (double)steps_here},
           most[2];
    row[3] = mine[0];
    row[4] = mine[1];
    MPI_Allreduce(mine, most, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    m->sent_per_step = most[0];
    m->received_per_step = most[1];
    return 0;
}

/* Rank 0: an epoch's summary line, and with --rank-report a line per rank. */
static void print_epoch(const train_run *r, int64_t e, const epoch_metrics *m)
{
    const train_options *o = &r->o;
    if (r->bar) /* over the bar or the evaluation's line */
        printf("\r\033[K");
    char train_acc[32] = "", test_acc[32] = ""; /* (float targets: no classes, no accuracy) */
    if (!r->s.train_info.targets) {
        snprintf(train_acc, sizeof train_acc, " acc %.2f%%", 100 * m->train_accuracy);
        snprintf(test_acc, sizeof test_acc, " acc %.2f%%", 100 * m->test_accuracy);
    }
    printf("epoch %lld/%ld%s: train loss %.4f%s, test loss %.4f%s, "
           "%.1f s, %.0f samples/s, peak memory %.0f MiB (tiles %.1f MiB, buffers at "
           "most %.1f MiB, remote copies at most %.1f MiB)",
           (long long)e + 1, o->epochs, r->p.batch < r->steps_per_epoch ? " (stopped early)" : "",
           m->train_loss, train_acc, m->test_loss, test_acc, m->seconds, m->samples_per_second,
           m->peak_mib, m->owned_mib, m->buffer_peak_mib, m->cached_peak_mib);
    if (m->sent_per_step >= 0)
        printf(", per step %.2f MiB sent, %.2f MiB received, workers busy %.0f%%",
               m->sent_per_step / 1048576.0, m->received_per_step / 1048576.0, 100 * m->busy);
    printf(" (largest rank)\n");
    for (int k = 0; o->rank_report && k < r->nranks; k++) {
        const double *v = m->ranks + (size_t)k * RANK_FIELDS;
        printf("  rank %d: peak memory %.0f MiB, tiles %.1f MiB, buffers at most %.1f MiB, "
               "remote copies at most %.1f MiB",
               k, v[0], v[1], v[2], v[5]);
        if (v[3] >= 0)
            printf(", per step %.2f MiB sent, %.2f MiB received", v[3] / 1048576.0,
                   v[4] / 1048576.0);
        printf("\n");
    }
    fflush(stdout);
}

/* After epoch e's steps: its metrics (traffic, losses, test evaluation, memory of every
 * rank, gathered on rank 0), and its summary. Returns an exit code. */
static int finish_epoch(train_run *r, int64_t e, double t0, int64_t sent0, int64_t recv0,
                        int64_t steps_here)
{
    const train_options *o = &r->o;
    const run_progress *p = &r->p;
    epoch_metrics *m = &r->p.epochs[e];
    int code;
    tsl_status st;
    m->sent_per_step = m->received_per_step = m->busy = -1;
    double row[RANK_FIELDS] = {0, 0, 0, -1, -1, 0};
    if (o->comm_stats && (code = traffic_end(r, m, row, sent0, recv0, steps_here)))
        return code;
    m->seconds = now() - t0;
    m->samples_per_second = (double)p->seen / m->seconds;
    m->train_loss = p->loss_sum / (double)(p->seen / o->batch);
    m->train_accuracy = (double)p->hits / (double)(p->seen * r->s.train_info.label_numel);
    if (r->bar || r->lines) {
        printf("%sepoch %lld/%ld: evaluating on %lld test samples%s", r->bar ? "\r\033[K" : "",
               (long long)e + 1, o->epochs, (long long)r->s.test_info.samples,
               r->bar ? " ..." : "\n");
        fflush(stdout);
    }
    if ((st = evaluate(r->s.model, r->s.test, &r->s.test_info, o->batch, &m->test_loss,
                       &m->test_accuracy)))
        return fail_collective(st, "evaluating");
    double rank0_mib;
    peak_memory(&m->peak_mib, &rank0_mib);
    int64_t owned = 0;
    tsl_context_owned_bytes(r->s.ctx, &owned);
    int64_t buffers = 0, buffers_most = 0, cached = 0, cached_most = 0;
    tsl_context_buffer_bytes(r->s.ctx, &buffers, &buffers_most);
    tsl_context_cached_bytes(r->s.ctx, &cached, &cached_most);
    double mine[3] = {(double)owned / 1048576.0, (double)buffers_most / 1048576.0,
                      (double)cached_most / 1048576.0},
           most[3];
    MPI_Allreduce(mine, most, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    m->owned_mib = most[0];
    m->buffer_peak_mib = most[1];
    m->cached_peak_mib = most[2];
    row[0] = rank0_mib; /* this rank's own peak */
    row[1] = mine[0];
    row[2] = mine[1];
    row[5] = mine[2];
    if (r->rank == 0)
        m->ranks = malloc(sizeof *m->ranks * RANK_FIELDS * (size_t)r->nranks);
    if (r->rank == 0 && !m->ranks)
        fail_oom("for the metrics of every rank", (double)RANK_FIELDS * r->nranks * 8);
    if ((st = agree(r->rank == 0 && !m->ranks ? TSL_ERR_OUT_OF_MEMORY : TSL_OK)))
        return fail(st, "gathering per-rank metrics");
    MPI_Gather(row, RANK_FIELDS, MPI_DOUBLE, m->ranks, RANK_FIELDS, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (r->rank == 0) {
        print_epoch(r, e, m);
        if (o->comm_stats)
            print_mgrit(r->s.model);
    }
    if (r->stream) {
        fprintf(r->stream,
                "{\"record\": \"epoch\", \"step\": %lld, \"epoch\": %lld, \"complete\": %s, ",
                (long long)p->steps, (long long)e + 1,
                p->batch < r->steps_per_epoch ? "false" : "true");
        write_epoch_fields(r->stream, m, r->nranks, r->s.train_info.targets);
        stream_end_record(r);
    }
    return 0;
}

/* One epoch from where the run stands: its order, its steps (until --max-steps: *stop), its
 * metrics. Returns an exit code. */
static int train_epoch(train_run *r, int *stop)
{
    const train_options *o = &r->o;
    run_progress *p = &r->p;
    int code;
    tsl_status st = TSL_OK;
    /* Every rank knows the epoch's order and reads its own tiles of each batch. */
    if (!r->order && !(r->order = malloc((size_t)r->s.train_info.samples * sizeof *r->order))) {
        fail_oom("for the epoch's sample order",
                 (double)r->s.train_info.samples * sizeof *r->order);
        st = TSL_ERR_OUT_OF_MEMORY;
    }
    if (!st)
        st = tsl_dataset_epoch_order(r->order, r->s.train_info.samples, o->seed, p->epoch,
                                     o->shuffle);
    if ((st = agree_all(st)))
        return fail(st, "ordering the epoch's samples");
    double t0 = now() - p->seconds;
    int64_t e = p->epoch, steps_here = 0, sent0 = 0, recv0 = 0;
    if (o->comm_stats && (code = traffic_start(r, &sent0, &recv0)))
        return code;
    if ((code = run_steps(r, t0, &steps_here, stop)))
        return code;
    if (r->signal) /* stopped within the epoch: no evaluation, the checkpoint keeps it open */
        return 0;
    if ((code = finish_epoch(r, e, t0, sent0, recv0, steps_here)))
        return code;
    p->nepochs = e + 1;
    return 0;
}

/* The epochs up to --epochs, --max-steps or a signal, with a checkpoint after each whole one.
 * Returns an exit code. */
static int train_epochs(train_run *r)
{
    const train_options *o = &r->o;
    run_progress *p = &r->p;
    int code;
    int stop = o->max_steps && p->steps >= o->max_steps;
    while (p->epoch < o->epochs && !stop) {
        if ((code = train_epoch(r, &stop)))
            return code;
        if (p->batch < r->steps_per_epoch)
            break; /* stopped by --max-steps or a signal: the checkpoint keeps the epoch open */
        p->epoch++;
        p->batch = 0;
        p->loss_sum = p->seconds = 0;
        p->hits = p->seen = 0;
        if (o->checkpoint &&
            (code = checkpoint_save(r->s.model, r->opt, o->checkpoint, &r->settings, p)))
            return code;
        /* A signal during the epoch's last step or its evaluation: stop before the next. */
        if (p->epoch < o->epochs && !stop && (r->signal = agreed_stop_signal()))
            break;
    }
    return 0;
}

/* --save-params and --metrics-json. Returns an exit code. */
static int train_finish(train_run *r)
{
    const train_options *o = &r->o;
    tsl_status st;
    if (o->save_params && (st = tsl_model_save_params(r->s.model, o->save_params)))
        return fail_collective(st, "saving parameters");
    if (o->trace && (st = tsl_context_trace_write(r->s.ctx, o->trace)))
        return fail_collective(st, "writing the trace");
    if (o->metrics_json) {
        metrics_file mf = {
            o,         r->p.epochs,  r->p.nepochs, r->p.steps, r->first_step,          r->nlosses,
            r->losses, r->step_secs, r->nranks,    r->signal,  r->s.train_info.targets};
        int bad = r->rank == 0 && write_file_atomic(o->metrics_json, write_metrics_to, &mf);
        if (bad)
            fprintf(stderr, "tessel train: cannot write '%s': %s\n", o->metrics_json,
                    strerror(errno));
        if ((st = agree(bad ? TSL_ERR_IO : TSL_OK)))
            return 1;
    }
    return 0;
}

/* Rank 0: why the run stopped early and where its results are. */
static void print_stopped(const train_run *r)
{
    const train_options *o = &r->o;
    if (r->bar)
        printf("\n");
    fflush(stdout);
    fprintf(stderr, "tessel train: stopped by %s after step %lld (epoch %lld, step %lld of %lld)",
            signal_name(r->signal), (long long)r->p.steps, (long long)r->p.epoch + (r->p.batch > 0),
            (long long)(r->p.batch > 0 ? r->p.batch : r->steps_per_epoch),
            (long long)r->steps_per_epoch);
    if (o->checkpoint)
        fprintf(stderr, "; checkpoint in %s, continue with --resume %s", o->checkpoint,
                o->checkpoint);
    else
        fprintf(stderr, "; no --checkpoint, so it cannot be resumed");
    if (o->save_params)
        fprintf(stderr, "; parameters in %s", o->save_params);
    if (o->metrics_json)
        fprintf(stderr, "; metrics in %s", o->metrics_json);
    fprintf(stderr, "\n");
}

static void train_end(train_run *r)
{
    catch_stop_signals(0);
    if (r->stream)
        fclose(r->stream);
    for (int64_t k = 0; k < r->metrics_cap; k++)
        free(r->p.epochs[k].ranks);
    free(r->p.epochs);
    free(r->losses);
    free(r->step_secs);
    free(r->order);
    tsl_optimizer_destroy(r->opt);
    session_end(&r->s);
}

/* --trace: every rank's tasks from here on (the first 2^20 a rank). */
static tsl_status o_trace_begin(train_run *r)
{
    return r->o.trace ? tsl_context_trace_begin(r->s.ctx, (int64_t)1 << 20) : TSL_OK;
}

int command_train(int argc, char **argv)
{
    train_run r;
    memset(&r, 0, sizeof r);
    int code = parse_train(argc, argv, &r.o);
    if (code)
        return code < 0 ? 0 : code;
    if (!(code = train_start(&r))) {
        if (r.rank == 0)
            print_start(&r);
        r.first_step = r.p.steps;
        tsl_status tst = o_trace_begin(&r);
        if (tst)
            code = fail_collective(tst, "starting the trace");
        r.start = now();
        if (!code && !(code = train_epochs(&r)))
            code = train_finish(&r);
        /* Stopped by a signal: 128 + its number, as a shell reports a process it killed
         * (SIGINT 130, SIGTERM 143, SIGUSR1 138 on Linux). */
        if (!code && r.signal) {
            if (r.rank == 0)
                print_stopped(&r);
            if (r.stream) {
                fprintf(r.stream, "{\"record\": \"stop\", \"step\": %lld, \"signal\": \"%s\"",
                        (long long)r.p.steps, signal_name(r.signal));
                stream_end_record(&r);
            }
            code = 128 + r.signal;
        }
    }
    train_end(&r);
    return code;
}
