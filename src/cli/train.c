/* tessel train and tessel eval: a zoo network on a dataset. Every rank takes part in every
 * step (the model's tile tasks span the ranks); rank 0 reads the data, prints and writes
 * files. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

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
    SET_EPOCHS = 1 << 8
};

typedef struct train_options {
    common_options common;
    const char *model, *data, *optimizer, *load_params, *save_params, *metrics_json;
    const char *checkpoint, *resume, *plan_text;
    tsl_plan plan;
    long epochs, batch, max_steps, checkpoint_every;
    double lr, momentum;
    unsigned long long seed;
    int shuffle;
    unsigned given; /* SET_* of the options on the command line */
    int comm_stats, rank_report;
} train_options;

static void usage_train(FILE *out)
{
    fprintf(
        out,
        "usage: tessel train --data SPEC [--model NAME|FILE] [--epochs N] [--batch B] [--lr X]\n"
        "                    [--optimizer sgd|adam] [--momentum M] [--seed S]\n"
        "                    [--max-steps N] [--shuffle on|off] [--load-params DIR]\n"
        "                    [--save-params DIR] [--checkpoint DIR [--checkpoint-every N]]\n"
        "                    [--resume DIR] [--metrics-json FILE] [--plan PLAN] [--ncpu N]\n"
        "                    [--sched NAME] [--host-cache-mib M] [--spin] [--comm-stats]\n"
        "                    [--rank-report]\n"
        "  --data SPEC         fashion-mnist, synthetic:dims=2,size=32,samples=64,classes=3\n"
        "                      or npy:DIR (see the README)\n"
        "  --model NAME|FILE   a network of the zoo (default cnn; listed below) or a model\n"
        "                      file (.json, docs/model-format.md)\n"
        "  --epochs N          passes over the training split (default 1)\n"
        "  --batch B           samples per step (default 64); an epoch's last incomplete\n"
        "                      batch is skipped\n"
        "  --lr X              learning rate (default 0.001 for adam, 0.01 for sgd)\n"
        "  --optimizer NAME    adam (default) or sgd; --momentum M for sgd (default 0.9)\n"
        "  --seed S            parameters, shuffling and synthetic data (default 1)\n"
        "  --max-steps N       stop after N optimizer steps (default: no limit)\n"
        "  --shuffle on|off    shuffle the training samples every epoch (default on)\n"
        "  --load-params DIR   start from DIR/NAME.npy parameters (PyTorch state_dict names)\n"
        "  --save-params DIR   write the trained parameters there\n"
        "  --checkpoint DIR    keep a checkpoint there (parameters, optimizer state, position\n"
        "                      in the data), taken after every epoch and when training\n"
        "                      stops; --checkpoint-every N also every N steps\n"
        "  --resume DIR        continue from DIR's checkpoint exactly as the run would have\n"
        "                      gone on; model, data, batch, optimizer, lr, momentum, seed\n"
        "                      and shuffle come from it (given ones must match), --epochs\n"
        "                      and --max-steps count from the start of the first run\n"
        "  --metrics-json FILE per-epoch metrics, per-step losses and wall seconds, and the\n"
        "                      final test accuracy\n"
        "  --plan PLAN         how tensors are tiled over the ranks:\n"
        "                      data=D,space=AxBxC,stages=S,micro=M,balance=B,tiles=T,shard=E,\n"
        "                      bucket=K (D sample groups, an A x B x C spatial rank grid with\n"
        "                      halo exchange, S pipeline stages of consecutive layers with M\n"
        "                      micro-batches, cut by memory (default), time or layers, T more\n"
        "                      tiles along the longest dimension, weights of at least E\n"
        "                      elements (default 4096) sharded over their stage's ranks, the\n"
        "                      other parameters' gradients sent in packs of up to K elements,\n"
        "                      default 65536, 0: one message per parameter), recompute=1 to\n"
        "                      drop batch-norm + ReLU outputs after the forward and make them\n"
        "                      again for the backward (less memory, one more pass per layer);\n"
        "                      D x A x B x C x S must be the rank count (default: samples\n"
        "                      split over all ranks and workers)\n"
        "  --comm-stats        count the bytes StarPU-MPI moves and the time workers spend\n"
        "                      executing tasks: per-step traffic of the busiest rank and the\n"
        "                      workers' busy fraction in the summaries and the metrics\n"
        "  --rank-report       after each epoch's summary, a line per rank: peak memory,\n"
        "                      tiles, most buffer memory at once, and with --comm-stats the\n"
        "                      bytes it sent and received per step (the metrics file has them\n"
        "                      always)\n"
        "  --ncpu N, --sched NAME  CPU workers per rank, StarPU scheduler\n"
        "  --host-cache-mib M  MiB of freed tile buffers each rank keeps for reuse (default\n"
        "                      32, 0 none): spares fresh pages for each step's activations;\n"
        "                      a few times the gradient MiB helps data=D with large weights\n"
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

static void usage_eval(FILE *out)
{
    fprintf(out, "usage: tessel eval --data SPEC --load-params DIR [--model NAME] [--batch B]\n"
                 "                   [--plan PLAN] [--ncpu N] [--sched NAME] [--spin]\n"
                 "  loss and accuracy of saved parameters on the data's test split\n");
}

static int parse_double_arg(const char *text, double min, double *value)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || v < min)
        return -1;
    *value = v;
    return 0;
}

/* Parse train/eval options; returns -1 to exit 0 (help), an exit code > 0, or 0. */
static int parse_train(int argc, char **argv, train_options *o, int eval)
{
    memset(o, 0, sizeof *o);
    tsl_context_config_init(&o->common.config);
    o->model = "cnn";
    o->optimizer = "adam";
    o->epochs = 1;
    o->batch = 64;
    o->lr = -1;
    o->momentum = 0.9;
    o->seed = 1;
    o->shuffle = 1;
    const char *cmd = eval ? "tessel eval" : "tessel train";
    void (*usage)(FILE *) = eval ? usage_eval : usage_train;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        int used = parse_common(argc, argv, &i, &o->common);
        if (used < 0)
            return EXIT_USAGE;
        if (used)
            continue;
        if (!eval && strcmp(a, "--comm-stats") == 0) {
            o->comm_stats = 1;
            o->common.config.comm_stats = 1;
            continue;
        }
        if (!eval && strcmp(a, "--rank-report") == 0) {
            o->rank_report = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: '%s' needs a value (or is unknown)\n", cmd, a);
            usage(stderr);
            return EXIT_USAGE;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (strcmp(a, "--model") == 0) {
            o->model = v;
            o->given |= SET_MODEL;
        } else if (strcmp(a, "--data") == 0) {
            o->data = v;
            o->given |= SET_DATA;
        } else if (strcmp(a, "--batch") == 0) {
            bad = parse_int_arg(v, 1, 1L << 24, &o->batch);
            o->given |= SET_BATCH;
        } else if (strcmp(a, "--load-params") == 0)
            o->load_params = v;
        else if (strcmp(a, "--plan") == 0) {
            if (tsl_plan_parse(v, &o->plan) != TSL_OK) {
                fprintf(stderr, "%s: %s\n", cmd, tsl_last_error());
                return EXIT_USAGE;
            }
            o->plan_text = v;
        } else if (eval)
            bad = 2;
        else if (strcmp(a, "--epochs") == 0) {
            bad = parse_int_arg(v, 1, 1000000, &o->epochs);
            o->given |= SET_EPOCHS;
        } else if (strcmp(a, "--max-steps") == 0)
            bad = parse_int_arg(v, 1, 1L << 40, &o->max_steps);
        else if (strcmp(a, "--lr") == 0) {
            bad = parse_double_arg(v, 1e-300, &o->lr);
            o->given |= SET_LR;
        } else if (strcmp(a, "--momentum") == 0) {
            bad = parse_double_arg(v, 0, &o->momentum);
            o->given |= SET_MOMENTUM;
        } else if (strcmp(a, "--optimizer") == 0) {
            bad = strcmp(v, "sgd") && strcmp(v, "adam");
            o->optimizer = v;
            o->given |= SET_OPTIMIZER;
        } else if (strcmp(a, "--seed") == 0) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            bad = end == v || *end || errno || *v == '-';
            o->given |= SET_SEED;
        } else if (strcmp(a, "--shuffle") == 0) {
            bad = strcmp(v, "on") && strcmp(v, "off");
            o->shuffle = strcmp(v, "on") == 0;
            o->given |= SET_SHUFFLE;
        } else if (strcmp(a, "--save-params") == 0)
            o->save_params = v;
        else if (strcmp(a, "--metrics-json") == 0)
            o->metrics_json = v;
        else if (strcmp(a, "--checkpoint") == 0)
            o->checkpoint = v;
        else if (strcmp(a, "--checkpoint-every") == 0)
            bad = parse_int_arg(v, 1, 1L << 40, &o->checkpoint_every);
        else if (strcmp(a, "--resume") == 0)
            o->resume = v;
        else
            bad = 2;
        if (bad == 2) {
            fprintf(stderr, "%s: unknown option '%s'\n", cmd, a);
            usage(stderr);
            return EXIT_USAGE;
        }
        if (bad) {
            fprintf(stderr, "%s: bad value '%s' for %s\n", cmd, v, a);
            return EXIT_USAGE;
        }
    }
    if (!o->data && !o->resume) {
        fprintf(stderr, "%s: --data is required\n", cmd);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (eval && !o->load_params) {
        fprintf(stderr, "%s: --load-params is required\n", cmd);
        return EXIT_USAGE;
    }
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
    if (o->lr < 0)
        o->lr = strcmp(o->optimizer, "sgd") == 0 ? 0.01 : 0.001;
    return 0;
}

/* Rank 0's status on every rank (a step only rank 0 can do: reading data, writing files). */
static tsl_status agree(tsl_status st)
{
    int v = st;
    MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return (tsl_status)v;
}

/* The worst status of any rank, on every rank. */
static tsl_status agree_all(tsl_status st)
{
    int v = st, worst = 0;
    MPI_Allreduce(&v, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return (tsl_status)worst;
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

/* Loss and accuracy over a whole split, in batches of `batch` (the last one may be smaller);
 * every rank reads its own tiles of each batch. */
static tsl_status evaluate(tsl_model_t model, tsl_dataset_t ds, const tsl_dataset_info *info,
                           int64_t batch, double *loss, double *accuracy)
{
    int64_t *idx = malloc(sizeof *idx * (size_t)batch);
    tsl_status st = agree_all(idx ? TSL_OK : TSL_ERR_OUT_OF_MEMORY);
    double loss_sum = 0;
    int64_t hits = 0;
    for (int64_t first = 0; first < info->samples && !st; first += batch) {
        int64_t count = info->samples - first < batch ? info->samples - first : batch;
        for (int64_t i = 0; i < count; i++)
            idx[i] = first + i;
        double l = 0;
        int64_t c = 0;
        if ((st = tsl_model_evaluate_read(model, ds, count, idx, &l, &c)))
            break;
        loss_sum += l * (double)count;
        hits += c;
    }
    free(idx);
    if (!st) {
        *loss = loss_sum / (double)info->samples;
        *accuracy = (double)hits / (double)(info->samples * info->label_numel);
    }
    return st;
}

/* One progress line: a bar on a terminal (rewritten in place), plain lines otherwise. */
static void progress(int tty, int64_t epoch, int64_t epochs, int64_t step, int64_t steps,
                     double loss, double rate, double eta)
{
    if (tty) {
        char bar[31];
        int filled = (int)(30 * step / (steps ? steps : 1));
        for (int i = 0; i < 30; i++)
            bar[i] = i < filled ? '#' : '.';
        bar[30] = '\0';
        printf("\repoch %lld/%lld [%s] step %lld/%lld loss %.4f %.0f samples/s ETA %dm%02ds",
               (long long)epoch, (long long)epochs, bar, (long long)step, (long long)steps, loss,
               rate, (int)(eta / 60), (int)fmod(eta, 60));
    } else {
        printf("epoch %lld/%lld step %lld/%lld loss %.4f %.0f samples/s ETA %.0fs\n",
               (long long)epoch, (long long)epochs, (long long)step, (long long)steps, loss, rate,
               eta);
    }
    fflush(stdout);
}

typedef struct metrics_file {
    const train_options *o;
    const epoch_metrics *m;
    int64_t n, steps, first_step, nlosses;
    const double *losses, *step_seconds;
    int nranks;
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
        const epoch_metrics *m = &mf->m[e];
        fprintf(f,
                "    {\"epoch\": %lld, \"train_loss\": %.9g, \"train_accuracy\": %.9g, "
                "\"test_loss\": %.9g, \"test_accuracy\": %.9g, \"seconds\": %.3f, "
                "\"samples_per_second\": %.1f, \"peak_memory_mib\": %.1f, "
                "\"tile_memory_mib\": %.3f, \"buffer_peak_mib\": %.3f, \"cached_peak_mib\": %.3f",
                (long long)e + 1, m->train_loss, m->train_accuracy, m->test_loss, m->test_accuracy,
                m->seconds, m->samples_per_second, m->peak_mib, m->owned_mib, m->buffer_peak_mib,
                m->cached_peak_mib);
        if (m->sent_per_step >= 0)
            fprintf(f,
                    ", \"sent_bytes_per_step\": %.0f, \"received_bytes_per_step\": %.0f, "
                    "\"workers_busy\": %.4f",
                    m->sent_per_step, m->received_per_step, m->busy);
        if (m->ranks) {
            fprintf(f, ", \"ranks\": [");
            for (int r = 0; r < mf->nranks; r++) {
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
        fprintf(f, "}%s\n", e + 1 < mf->n ? "," : "");
    }
    fprintf(f, "  ],\n  \"first_step\": %lld,\n  \"step_losses\": [",
            (long long)mf->first_step + 1);
    for (int64_t k = 0; k < mf->nlosses; k++)
        fprintf(f, "%s%.17g", k ? ", " : "", mf->losses[k]);
    fprintf(f, "],\n  \"step_seconds\": [");
    for (int64_t k = 0; k < mf->nlosses; k++)
        fprintf(f, "%s%.6f", k ? ", " : "", mf->step_seconds[k]);
    fprintf(f, "],\n  \"final_test_accuracy\": %.9g\n}\n",
            mf->n ? mf->m[mf->n - 1].test_accuracy : 0.0);
    return 0;
}

/* Context, datasets (every rank opens them: each needs the shapes; only rank 0 reads
 * batches) and the model. */
typedef struct session {
    tsl_context_t ctx;
    tsl_dataset_t train, test;
    tsl_dataset_info train_info, test_info;
    tsl_model_t model;
} session;

static void session_end(session *s)
{
    tsl_model_destroy(s->model);
    tsl_dataset_destroy(s->train);
    tsl_dataset_destroy(s->test);
    if (s->ctx)
        tsl_context_destroy(s->ctx);
}

static int session_context(session *s, const train_options *o)
{
    memset(s, 0, sizeof *s);
    tsl_status st = tsl_context_create(&s->ctx, &o->common.config);
    if (st)
        return fail(st, "starting StarPU");
    tsl_context_rank(s->ctx, &rank_of_process);
    return 0;
}

/* Give the graph the stages the plan cuts it into for this run's batch and optimizer (the
 * model alone would split for one sample and Adam; stages the graph has are kept). */
static tsl_status set_stages(tsl_graph_t g, const train_options *o)
{
    int32_t n = tsl_graph_op_count(g), states = strcmp(o->optimizer, "adam") == 0 ? 2
                                                : o->momentum > 0                 ? 1
                                                                                  : 0;
    int32_t *stage = calloc((size_t)n + 1, sizeof *stage);
    if (!stage)
        return TSL_ERR_OUT_OF_MEMORY;
    tsl_status st = tsl_plan_stages(&o->plan, g, o->batch, states, stage);
    for (int32_t i = 0; i < n && !st; i++) {
        int32_t out;
        if (!(st = tsl_graph_op_info(g, i, NULL, NULL, &out)))
            st = tsl_graph_set_stage(g, out, stage[i]);
    }
    free(stage);
    return st;
}

static int session_open(session *s, const train_options *o, int need_train)
{
    tsl_status st = TSL_OK;
    if ((need_train && (st = tsl_dataset_open(&s->train, o->data, TSL_SPLIT_TRAIN))) ||
        (!st && (st = tsl_dataset_open(&s->test, o->data, TSL_SPLIT_TEST))))
        return fail(st, "opening the data");
    if (s->train)
        tsl_dataset_get_info(s->train, &s->train_info);
    tsl_dataset_get_info(s->test, &s->test_info);
    const tsl_dataset_info *info = s->train ? &s->train_info : &s->test_info;
    tsl_graph_t g;
    if ((st = tsl_model_graph(o->model, info->sample_shape.ndim, info->sample_shape.dims,
                              info->classes, &g)))
        return fail(st, "building the model");
    tsl_shape out;
    tsl_graph_value_shape(g, tsl_graph_output(g), &out);
    if (out.ndim - 1 != info->label_shape.ndim) {
        tsl_graph_destroy(g);
        fprintf(stderr, "tessel: model '%s' is a %s network but the data has %s labels\n", o->model,
                out.ndim == 1 ? "classification" : "segmentation",
                info->label_shape.ndim ? "per-voxel" : "per-sample");
        return EXIT_USAGE;
    }
    if (o->plan_text && o->plan.stages > 1 && (st = set_stages(g, o))) {
        tsl_graph_destroy(g);
        return fail(st, "splitting the model into stages");
    }
    st = tsl_model_create_plan(&s->model, s->ctx, g, o->seed, o->plan_text ? &o->plan : NULL);
    tsl_graph_destroy(g);
    if (st)
        return fail(st, "creating the model");
    if (o->load_params && (st = tsl_model_load_params(s->model, o->load_params)))
        return fail(st, "loading parameters");
    return 0;
}

/* Take the trajectory settings the command line left out from the checkpoint; those given
 * must match it (--epochs may differ: it extends or shortens the run). */
static int merge_resumed(train_options *o, const run_settings *r)
{
    const char *diff = NULL;
    if ((o->given & SET_MODEL) && strcmp(o->model, r->model))
        diff = "--model";
    else if ((o->given & SET_DATA) && strcmp(o->data, r->data))
        diff = "--data";
    else if ((o->given & SET_BATCH) && o->batch != r->batch)
        diff = "--batch";
    else if ((o->given & SET_OPTIMIZER) && strcmp(o->optimizer, r->optimizer))
        diff = "--optimizer";
    else if ((o->given & SET_LR) && o->lr != r->lr)
        diff = "--lr";
    else if ((o->given & SET_MOMENTUM) && o->momentum != r->momentum)
        diff = "--momentum";
    else if ((o->given & SET_SEED) && o->seed != r->seed)
        diff = "--seed";
    else if ((o->given & SET_SHUFFLE) && o->shuffle != r->shuffle)
        diff = "--shuffle";
    if (diff) {
        if (rank_of_process == 0)
            fprintf(stderr,
                    "tessel train: %s differs from the checkpoint being resumed; leave it out "
                    "to use the checkpoint's value\n",
                    diff);
        return EXIT_USAGE;
    }
    o->model = r->model;
    o->data = r->data;
    o->batch = r->batch;
    o->optimizer = r->optimizer;
    o->lr = r->lr;
    o->momentum = r->momentum;
    o->seed = r->seed;
    o->shuffle = r->shuffle;
    if (!(o->given & SET_EPOCHS))
        o->epochs = r->epochs;
    return 0;
}

static void settings_of(const train_options *o, run_settings *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->model, sizeof r->model, "%s", o->model);
    snprintf(r->data, sizeof r->data, "%s", o->data);
    snprintf(r->optimizer, sizeof r->optimizer, "%s", o->optimizer);
    r->batch = o->batch;
    r->epochs = o->epochs;
    r->lr = o->lr;
    r->momentum = o->momentum;
    r->seed = o->seed;
    r->shuffle = o->shuffle;
}

static tsl_status create_optimizer(const train_options *o, tsl_context_t ctx, tsl_optimizer_t *opt)
{
    if (strcmp(o->optimizer, "sgd") == 0) {
        tsl_sgd_config c;
        tsl_sgd_config_init(&c);
        c.lr = o->lr;
        c.momentum = o->momentum;
        return tsl_optimizer_create_sgd(opt, ctx, &c);
    }
    tsl_adam_config c;
    tsl_adam_config_init(&c);
    c.lr = o->lr;
    return tsl_optimizer_create_adam(opt, ctx, &c);
}

int command_train(int argc, char **argv)
{
    train_options o;
    int code = parse_train(argc, argv, &o, 0);
    if (code)
        return code < 0 ? 0 : code;
    session s;
    run_settings resumed, settings;
    run_progress p;
    memset(&p, 0, sizeof p);
    char snapshot[4096];
    double *losses = NULL, *step_secs = NULL; /* per step: the loss, the wall time */
    int64_t nlosses = 0, first_step = 0;
    tsl_status st = TSL_OK;
    tsl_optimizer_t opt = NULL;
    int64_t *order = NULL;   /* the epoch's sample order */
    int64_t metrics_cap = 0; /* entries of p.epochs whose `ranks` may need freeing */
    if ((code = session_context(&s, &o)))
        goto end;
    if (o.resume && ((code = checkpoint_read(o.resume, &resumed, &p, snapshot, sizeof snapshot)) ||
                     (code = merge_resumed(&o, &resumed))))
        goto end;
    if ((code = session_open(&s, &o, 1)))
        goto end;
    int rank = rank_of_process, nranks = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int64_t steps_per_epoch = s.train_info.samples / o.batch;
    if (steps_per_epoch < 1) {
        fprintf(stderr,
                "tessel train: the training split has %lld samples, fewer than one "
                "batch of %ld\n",
                (long long)s.train_info.samples, o.batch);
        code = EXIT_USAGE;
        goto end;
    }
    if (p.batch >= steps_per_epoch) {
        fprintf(stderr, "tessel train: the checkpoint stands at batch %lld of an epoch of %lld\n",
                (long long)p.batch, (long long)steps_per_epoch);
        code = 1;
        goto end;
    }
    /* Room for every epoch's metrics (a resumed run may go on for more epochs). */
    int64_t cap = o.epochs > p.nepochs ? o.epochs : p.nepochs;
    epoch_metrics *grown = realloc(p.epochs, (size_t)(cap + 1) * sizeof *grown);
    if (!grown) {
        code = fail(TSL_ERR_OUT_OF_MEMORY, "allocating metrics");
        goto end;
    }
    memset(grown + p.nepochs, 0, (size_t)(cap + 1 - p.nepochs) * sizeof *grown);
    p.epochs = grown;
    metrics_cap = cap + 1;
    settings_of(&o, &settings);
    if ((st = create_optimizer(&o, s.ctx, &opt))) {
        code = fail(st, "creating the optimizer");
        goto end;
    }
    if (o.resume && (st = tsl_model_load_checkpoint(s.model, opt, snapshot))) {
        code = fail(st, "resuming from the checkpoint");
        goto end;
    }
    int tty = rank == 0 && isatty(fileno(stdout));
    if (rank == 0) {
        int32_t ranks, ncpu;
        tsl_context_size(s.ctx, &ranks);
        tsl_context_worker_count(s.ctx, TSL_WORKER_CPU, &ncpu);
        printf("tessel train: model %s, data %s (%lld training, %lld test samples), %d ranks x "
               "%d CPU workers, %s lr %g, batch %ld, seed %llu\n",
               o.model, o.data, (long long)s.train_info.samples, (long long)s.test_info.samples,
               (int)ranks, (int)ncpu, o.optimizer, o.lr, o.batch, o.seed);
        if (o.plan_text) {
            char text[160];
            tsl_plan_format(&o.plan, text, sizeof text);
            printf("plan %s\n", text);
        }
        if (o.resume)
            printf("resuming from %s: epoch %lld, step %lld of the epoch, %lld steps taken\n",
                   snapshot, (long long)p.epoch + 1, (long long)p.batch, (long long)p.steps);
        fflush(stdout);
    }
    first_step = p.steps;
    int64_t losses_cap = 0;
    int stop = o.max_steps && p.steps >= o.max_steps;
    while (p.epoch < o.epochs && !stop) {
        /* Every rank knows the epoch's order and reads its own tiles of each batch. */
        if (!order && !(order = malloc((size_t)s.train_info.samples * sizeof *order)))
            st = TSL_ERR_OUT_OF_MEMORY;
        if (!st)
            st = tsl_dataset_epoch_order(order, s.train_info.samples, o.seed, p.epoch, o.shuffle);
        if ((st = agree_all(st))) {
            code = fail(st, "ordering the epoch's samples");
            goto end;
        }
        double t0 = now() - p.seconds, last_print = 0;
        int64_t e = p.epoch, steps_here = 0, sent0 = 0, recv0 = 0;
        double exec = 0, alive = 0;
        if (o.comm_stats && ((st = tsl_context_wait(s.ctx)) ||
                             (st = tsl_context_worker_seconds(s.ctx, &exec, &alive)) ||
                             (st = tsl_context_comm_bytes(s.ctx, &sent0, &recv0)))) {
            code = fail(st, "reading communication statistics");
            goto end;
        }
        while (p.batch < steps_per_epoch) {
            double loss = 0, step_start = now();
            int64_t correct = 0;
            if ((st = tsl_model_train_step_read(s.model, s.train, o.batch,
                                                order + p.batch * o.batch, opt, &loss, &correct))) {
                code = fail(st, "a training step");
                goto end;
            }
            if (nlosses == losses_cap) {
                losses_cap = losses_cap ? 2 * losses_cap : 1024;
                double *more = realloc(losses, (size_t)losses_cap * sizeof *more);
                if (more)
                    losses = more;
                double *more_secs =
                    more ? realloc(step_secs, (size_t)losses_cap * sizeof *more) : NULL;
                if (!more_secs) {
                    code = fail(TSL_ERR_OUT_OF_MEMORY, "recording losses");
                    goto end;
                }
                step_secs = more_secs;
            }
            step_secs[nlosses] = now() - step_start; /* the step returns with its loss */
            losses[nlosses++] = loss;
            p.loss_sum += loss;
            p.hits += correct;
            p.seen += o.batch;
            p.steps++;
            p.batch++;
            steps_here++;
            stop = o.max_steps && p.steps >= o.max_steps;
            double t = now() - t0;
            int last = p.batch == steps_per_epoch || stop;
            if (rank == 0 && (last || (tty ? t - last_print > 0.2
                                           : p.batch % (steps_per_epoch / 10 + 1) == 0))) {
                last_print = t;
                double rate = (double)p.seen / t;
                progress(tty, e + 1, o.epochs, p.batch, steps_per_epoch,
                         p.loss_sum / (double)(p.seen / o.batch), rate,
                         (double)(steps_per_epoch - p.batch) * (double)o.batch / rate);
            }
            int every = o.checkpoint_every && p.steps % o.checkpoint_every == 0;
            if (o.checkpoint && p.batch < steps_per_epoch && (every || stop)) {
                /* Mid-epoch: the epoch's partial sums travel with the checkpoint. */
                p.seconds = now() - t0;
                if ((code = checkpoint_save(s.model, opt, o.checkpoint, &settings, &p)))
                    goto end;
            }
            if (stop)
                break;
        }
        epoch_metrics *m = &p.epochs[e];
        m->sent_per_step = m->received_per_step = m->busy = -1;
        double row[RANK_FIELDS] = {0, 0, 0, -1, -1, 0};
        if (o.comm_stats) { /* the busiest rank's traffic per step, evaluation left out */
            int64_t sent1, recv1;
            if ((st = tsl_context_wait(s.ctx)) ||
                (st = tsl_context_worker_seconds(s.ctx, &exec, &alive)) ||
                (st = tsl_context_comm_bytes(s.ctx, &sent1, &recv1))) {
                code = fail(st, "reading communication statistics");
                goto end;
            }
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
        }
        m->seconds = now() - t0;
        m->samples_per_second = (double)p.seen / m->seconds;
        m->train_loss = p.loss_sum / (double)(p.seen / o.batch);
        m->train_accuracy = (double)p.hits / (double)(p.seen * s.train_info.label_numel);
        if ((st = evaluate(s.model, s.test, &s.test_info, o.batch, &m->test_loss,
                           &m->test_accuracy))) {
            code = fail(st, "evaluating");
            goto end;
        }
        double rank0_mib;
        peak_memory(&m->peak_mib, &rank0_mib);
        int64_t owned = 0;
        tsl_context_owned_bytes(s.ctx, &owned);
        int64_t buffers = 0, buffers_most = 0, cached = 0, cached_most = 0;
        tsl_context_buffer_bytes(s.ctx, &buffers, &buffers_most);
        tsl_context_cached_bytes(s.ctx, &cached, &cached_most);
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
        if (rank == 0)
            m->ranks = malloc(sizeof *m->ranks * RANK_FIELDS * (size_t)nranks);
        if ((st = agree(rank == 0 && !m->ranks ? TSL_ERR_OUT_OF_MEMORY : TSL_OK))) {
            code = fail(st, "gathering per-rank metrics");
            goto end;
        }
        MPI_Gather(row, RANK_FIELDS, MPI_DOUBLE, m->ranks, RANK_FIELDS, MPI_DOUBLE, 0,
                   MPI_COMM_WORLD);
        if (rank == 0) {
            if (tty)
                printf("\n");
            printf("epoch %lld/%ld%s: train loss %.4f acc %.2f%%, test loss %.4f acc %.2f%%, "
                   "%.1f s, %.0f samples/s, peak memory %.0f MiB (tiles %.1f MiB, buffers at "
                   "most %.1f MiB, remote copies at most %.1f MiB)",
                   (long long)e + 1, o.epochs, p.batch < steps_per_epoch ? " (stopped early)" : "",
                   m->train_loss, 100 * m->train_accuracy, m->test_loss, 100 * m->test_accuracy,
                   m->seconds, m->samples_per_second, m->peak_mib, m->owned_mib, m->buffer_peak_mib,
                   m->cached_peak_mib);
            if (m->sent_per_step >= 0)
                printf(", per step %.2f MiB sent, %.2f MiB received, workers busy %.0f%%",
                       m->sent_per_step / 1048576.0, m->received_per_step / 1048576.0,
                       100 * m->busy);
            printf(" (largest rank)\n");
            for (int r = 0; o.rank_report && r < nranks; r++) {
                const double *v = m->ranks + (size_t)r * RANK_FIELDS;
                printf("  rank %d: peak memory %.0f MiB, tiles %.1f MiB, buffers at most %.1f MiB, "
                       "remote copies at most %.1f MiB",
                       r, v[0], v[1], v[2], v[5]);
                if (v[3] >= 0)
                    printf(", per step %.2f MiB sent, %.2f MiB received", v[3] / 1048576.0,
                           v[4] / 1048576.0);
                printf("\n");
            }
            fflush(stdout);
        }
        p.nepochs = e + 1;
        if (p.batch < steps_per_epoch)
            break; /* stopped by --max-steps: the checkpoint keeps the epoch open */
        p.epoch++;
        p.batch = 0;
        p.loss_sum = p.seconds = 0;
        p.hits = p.seen = 0;
        if (o.checkpoint && (code = checkpoint_save(s.model, opt, o.checkpoint, &settings, &p)))
            goto end;
    }
    if (o.save_params && (st = tsl_model_save_params(s.model, o.save_params))) {
        code = fail(st, "saving parameters");
        goto end;
    }
    if (o.metrics_json) {
        metrics_file mf = {&o,      p.epochs, p.nepochs, p.steps, first_step,
                           nlosses, losses,   step_secs, nranks};
        int bad = rank == 0 && write_file_atomic(o.metrics_json, write_metrics_to, &mf);
        if ((st = agree(bad ? TSL_ERR_IO : TSL_OK))) {
            fprintf(stderr, "tessel train: cannot write '%s'\n", o.metrics_json);
            code = 1;
            goto end;
        }
    }
end:
    for (int64_t k = 0; k < metrics_cap; k++)
        free(p.epochs[k].ranks);
    free(p.epochs);
    free(losses);
    free(step_secs);
    free(order);
    tsl_optimizer_destroy(opt);
    session_end(&s);
    return code;
}

int command_eval(int argc, char **argv)
{
    train_options o;
    int code = parse_train(argc, argv, &o, 1);
    if (code)
        return code < 0 ? 0 : code;
    session s;
    if ((code = session_context(&s, &o)) || (code = session_open(&s, &o, 0))) {
        session_end(&s);
        return code;
    }
    double loss = 0, accuracy = 0;
    tsl_status st = evaluate(s.model, s.test, &s.test_info, o.batch, &loss, &accuracy);
    if (st)
        code = fail(st, "evaluating");
    else if (rank_of_process == 0)
        printf("tessel eval: model %s, data %s: test loss %.4f, accuracy %.2f%% (%lld "
               "samples)\n",
               o.model, o.data, loss, 100 * accuracy, (long long)s.test_info.samples);
    session_end(&s);
    return code;
}
