/* tessel bench: the same model, data and plan trained for a few steps under each of several
 * StarPU schedulers, for a comparison. StarPU fixes its scheduler when it starts, so each one
 * gets a StarPU of its own (a context created and destroyed in turn; MPI, started here, stays
 * up across them). Per scheduler: warm-up steps (calibration of the history-based models of
 * dmda and dmdas happens there and in STARPU_HOME), then repetitions of timed steps, each
 * ended by waiting for every task; rank 0 prints a table (seconds per step: median, min, max
 * over the repetitions, each repetition's time the slowest rank's; workers busy and idle;
 * bytes sent between ranks per step; with CUDA workers, the share of tasks each kind of worker
 * ran and how busy it was) and writes it as JSON with --json, with the most bytes any rank's
 * buffers held at once (tsl_context_buffer_bytes, the measure tsl_plan_estimate_peak predicts). */
#include <math.h>
#include <mpi.h>
#include <starpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

enum {
    OPT_STEPS = OPT_COMMAND_FIRST,
    OPT_WARMUP,
    OPT_REPEAT,
    OPT_JSON,
    OPT_OPTIMIZER,
    OPT_CRITICAL_PATH
};

#define MAX_SCHEDS 16
#define DEFAULT_SCHEDS "eager,lws,dmda,dmdas"

typedef struct bench_options {
    train_options run;
    const char *scheds; /* comma-separated */
    long steps, warmup, repeat;
    const char *json;
    int critical_path; /* --critical-path: one traced step after the timed ones */
} bench_options;

typedef struct sched_result {
    char name[32];
    double *secs; /* [repeat]: seconds per step of each repetition */
    double median, min, max, busy, bytes_per_step;
    double buffer_peak_mib; /* the most any rank's buffers held at once (tiles, copies, scratch) */
    /* by kind of worker (CPU, CUDA; all ranks): tasks run in the timed steps, busy share
       (-1 without workers of that kind) */
    double tasks[2], kind_busy[2];
    int cuda; /* some rank has CUDA workers */
    /* the last step's MGRIT residual norms (first segment; plan levels= > 1) */
    double mgrit[2][64];
    int32_t nmgrit[2];
    /* --critical-path: the traced step's critical path and all ranks' task time, seconds */
    double critical, task_time;
} sched_result;

static void usage_bench(FILE *out)
{
    fprintf(out,
            "usage: tessel bench --data SPEC [--model NAME|FILE] [--batch B] [--plan PLAN]\n"
            "                    [--sched LIST] [--steps N] [--warmup W] [--repeat R]\n"
            "                    [--optimizer sgd|adam] [--loss L] [--json FILE] [--ncpu N]\n"
            "                    [--spin] [--critical-path]\n"
            "  training steps of one model, data and plan under each scheduler of LIST, each in\n"
            "  a StarPU of its own: W warm-up steps, then R repetitions of N timed steps\n"
            "  --sched LIST   comma-separated StarPU schedulers (default " DEFAULT_SCHEDS ";\n"
            "                 others: prio, random, ws, dm, dmdar, dmdasd, heteroprio, ...; an\n"
            "                 unknown name lists StarPU's)\n"
            "  --steps N      timed steps per repetition (default 5)\n"
            "  --warmup W     untimed steps first (default 2)\n"
            "  --repeat R     repetitions (default 3); the table gives their median, min, max\n"
            "                 (with CUDA workers, a line more: where the tasks ran)\n"
            "  --json FILE    the table as JSON too (python/tessel_plot.py plots it)\n"
            "  --critical-path  one more step, traced: its tasks' time summed over the ranks\n"
            "                 and their critical path (with a worker per task and free\n"
            "                 messages), whose ratio is the parallelism the plan exposes\n");
}

static int handle_bench_option(const cli_parser *parser, int id, const char *value)
{
    bench_options *o = parser->state;
    switch (id) {
    case OPT_STEPS:
        return parse_int_arg(value, 1, 1000000, &o->steps) ? OPTION_BAD_VALUE : OPTION_OK;
    case OPT_WARMUP:
        return parse_int_arg(value, 0, 1000000, &o->warmup) ? OPTION_BAD_VALUE : OPTION_OK;
    case OPT_REPEAT:
        return parse_int_arg(value, 1, 1000, &o->repeat) ? OPTION_BAD_VALUE : OPTION_OK;
    case OPT_JSON:
        o->json = value;
        return OPTION_OK;
    case OPT_CRITICAL_PATH:
        o->critical_path = 1;
        return OPTION_OK;
    case OPT_OPTIMIZER:
        if (!optimizer_known(value))
            return OPTION_BAD_VALUE;
        o->run.optimizer = value;
        return OPTION_OK;
    }
    cli_parser run = *parser;
    run.state = &o->run;
    return parse_run_option(&run, id, value);
}

/* The predefined StarPU scheduler called `name`, or NULL. */
static const struct starpu_sched_policy *find_policy(const char *name)
{
    struct starpu_sched_policy **p = starpu_sched_get_predefined_policies();
    for (; p && *p; p++)
        if ((*p)->policy_name && strcmp((*p)->policy_name, name) == 0)
            return *p;
    return NULL;
}

/* Split o->scheds into names[]; checks each against StarPU's schedulers. Returns the count, or
 * -1 (message printed). */
static int split_scheds(const char *cmd, const char *list, char names[MAX_SCHEDS][32])
{
    int n = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= 32 || n == MAX_SCHEDS) {
            fprintf(stderr, "%s: bad --sched list '%s' (comma-separated names, at most %d)\n", cmd,
                    list, MAX_SCHEDS);
            return -1;
        }
        memcpy(names[n], p, len);
        names[n][len] = '\0';
        if (!find_policy(names[n])) {
            fprintf(stderr, "%s: StarPU has no scheduler '%s'; it has:", cmd, names[n]);
            for (struct starpu_sched_policy **q = starpu_sched_get_predefined_policies(); q && *q;
                 q++)
                fprintf(stderr, " %s", (*q)->policy_name);
            fprintf(stderr, "\n");
            return -1;
        }
        n++;
        p += len;
        if (*p == ',')
            p++;
    }
    return n;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One scheduler: its StarPU, warm-up, the timed repetitions. Returns an exit code. */
static int bench_one(const bench_options *bo, const char *sched, sched_result *res)
{
    train_options o = bo->run;
    o.common.config.scheduler = sched;
    int ranks = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    o.common.config.comm_stats = ranks > 1; /* (bytes between ranks) */
    session s;
    tsl_optimizer_t opt = NULL;
    int64_t *order = NULL;
    int code = session_context(&s, &o);
    if (!code)
        code = session_open(&s, &o, 1);
    tsl_status st = TSL_OK;
    if (!code) {
        const char *got = NULL;
        tsl_context_scheduler(s.ctx, &got);
        if (!got || strcmp(got, sched) != 0) {
            if (rank_of_process == 0)
                fprintf(stderr, "tessel bench: asked StarPU for '%s', it runs '%s'\n", sched,
                        got ? got : "?");
            code = 1;
        }
    }
    int64_t samples = s.train_info.samples, timed_end = bo->warmup + bo->steps * bo->repeat,
            steps = timed_end + (bo->critical_path ? 1 : 0);
    if (!code && samples < o.batch) {
        if (rank_of_process == 0)
            fprintf(stderr, "tessel bench: %lld training samples, fewer than a batch of %ld\n",
                    (long long)samples, o.batch);
        code = EXIT_USAGE;
    }
    /* order: this step's samples, then the next step's (read ahead while this one runs) */
    if (!code && !(order = malloc(sizeof *order * (size_t)(2 * o.batch))))
        code = fail_oom("for a batch's sample indices", (double)o.batch * 2 * sizeof *order);
    if (!code && (st = create_optimizer(&o, s.ctx, &opt)))
        code = fail_collective(st, "creating the optimizer");
    tsl_worker_stats busy; /* the timed repetitions' */
    memset(&busy, 0, sizeof busy);
    int64_t sent0 = 0, sent1 = 0, recv = 0;
    for (int64_t k = 0, rep = -1; !code && k < steps; k++) {
        int64_t timed = k - bo->warmup;
        if (timed >= 0 && k < timed_end && timed % bo->steps == 0) { /* a repetition begins */
            rep = timed / bo->steps;
            tsl_worker_stats before; /* (restarts the counters) */
            if ((st = tsl_context_wait(s.ctx)) || (st = tsl_context_worker_stats(s.ctx, &before)))
                code = fail_collective(st, "starting a repetition");
            if (!code && rep == 0 && ranks > 1 &&
                (st = tsl_context_comm_bytes(s.ctx, &sent0, &recv)))
                code = fail_collective(st, "counting bytes");
            MPI_Barrier(MPI_COMM_WORLD);
            res->secs[rep] = now();
        }
        if (!code && k == timed_end && /* the traced step */
            ((st = tsl_context_wait(s.ctx)) || (st = tsl_context_trace_begin(s.ctx, 1 << 26))))
            code = fail_collective(st, "starting the trace");
        for (int64_t i = 0; i < 2 * o.batch; i++)
            order[i] = (k * o.batch + i) % samples;
        double loss = 0;
        if (!code && (st = tsl_model_train_step_read_next(s.model, s.train, o.batch, order,
                                                          k + 1 < steps ? order + o.batch : NULL,
                                                          opt, &loss, NULL)))
            code = fail_collective(st, "a training step");
        if (!code && timed >= 0 && k < timed_end && timed % bo->steps == bo->steps - 1) {
            /* it ends */
            tsl_worker_stats w;
            memset(&w, 0, sizeof w);
            if ((st = tsl_context_wait(s.ctx)) || (st = tsl_context_worker_stats(s.ctx, &w)))
                code = fail_collective(st, "ending a repetition");
            double mine = (now() - res->secs[rep]) / (double)bo->steps, slowest = 0;
            MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            res->secs[rep] = slowest;
            for (int kind = 0; kind < 2; kind++) {
                busy.tasks[kind] += w.tasks[kind];
                busy.executing[kind] += w.executing[kind];
                busy.total[kind] += w.total[kind];
            }
        }
    }
    if (!code && bo->critical_path &&
        (st = tsl_context_trace_critical_path(s.ctx, &res->critical, &res->task_time)))
        code = fail_collective(st, "the traced step's critical path");
    if (!code && ranks > 1 && (st = tsl_context_comm_bytes(s.ctx, &sent1, &recv)))
        code = fail_collective(st, "counting bytes");
    if (!code) {
        int64_t in_use = 0, most = 0;
        tsl_context_buffer_bytes(s.ctx, &in_use, &most);
        double mine = (double)most / 1048576.0;
        MPI_Allreduce(&mine, &res->buffer_peak_mib, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double local[9] = {(double)(sent1 - sent0)}, all[9] = {0};
        for (int k = 0; k < 2; k++) {
            local[1 + k] = (double)busy.tasks[k];
            local[3 + k] = busy.executing[k];
            local[5 + k] = busy.total[k];
        }
        int32_t ncuda = 0;
        tsl_context_worker_count(s.ctx, TSL_WORKER_CUDA, &ncuda);
        local[7] = ncuda;
        MPI_Allreduce(local, all, 9, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double executing = all[3] + all[4], total = all[5] + all[6];
        res->busy = total > 0 ? executing / total : -1;
        res->bytes_per_step = all[0] / (double)(bo->steps * bo->repeat);
        for (int k = 0; k < 2; k++) {
            res->tasks[k] = all[1 + k];
            res->kind_busy[k] = all[5 + k] > 0 ? all[3 + k] / all[5 + k] : -1;
        }
        res->cuda = all[7] > 0;
        double *sorted = malloc(sizeof *sorted * (size_t)bo->repeat);
        if (!sorted)
            code = fail_oom("for the repetitions' times", (double)bo->repeat * sizeof *sorted);
        else {
            memcpy(sorted, res->secs, sizeof *sorted * (size_t)bo->repeat);
            qsort(sorted, (size_t)bo->repeat, sizeof *sorted, compare_doubles);
            long r = bo->repeat;
            res->median = r % 2 ? sorted[r / 2] : 0.5 * (sorted[r / 2 - 1] + sorted[r / 2]);
            res->min = sorted[0];
            res->max = sorted[r - 1];
            free(sorted);
        }
    }
    for (int dir = 0; !code && dir < 2 && tsl_model_mgrit_segments(s.model) > 0; dir++) {
        tsl_model_mgrit_residuals(s.model, 0, dir, 64, res->mgrit[dir], &res->nmgrit[dir]);
        res->nmgrit[dir] = res->nmgrit[dir] < 64 ? res->nmgrit[dir] : 64;
    }
    free(order);
    tsl_optimizer_destroy(opt);
    session_end(&s);
    return code;
}

static int write_json(FILE *f, const void *arg)
{
    const void *const *a = arg;
    const bench_options *o = a[0];
    const sched_result *res = a[1];
    int n = *(const int *)a[2], ranks = *(const int *)a[3];
    fprintf(f, "{\n  \"model\": ");
    json_string(f, o->run.model);
    fprintf(f, ",\n  \"data\": ");
    json_string(f, o->run.data);
    fprintf(f, ",\n  \"plan\": ");
    json_string(f, o->run.plan_text ? o->run.plan_text : "");
    fprintf(f,
            ",\n  \"batch\": %ld,\n  \"ranks\": %d,\n  \"steps\": %ld,\n  \"warmup\": %ld,\n"
            "  \"repeat\": %ld,\n  \"results\": [",
            o->run.batch, ranks, o->steps, o->warmup, o->repeat);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s\n    {\"sched\": ", i ? "," : "");
        json_string(f, res[i].name);
        fprintf(f, ", \"seconds_per_step\": [");
        for (long r = 0; r < o->repeat; r++)
            fprintf(f, "%s%.9g", r ? ", " : "", res[i].secs[r]);
        fprintf(f,
                "], \"median\": %.9g, \"min\": %.9g, \"max\": %.9g, \"workers_busy\": %.6g, "
                "\"bytes_per_step\": %.9g, \"tasks_cpu\": %.0f, \"tasks_cuda\": %.0f, "
                "\"busy_cpu\": %.6g, \"busy_cuda\": %.6g, \"buffer_peak_mib\": %.3f",
                res[i].median, res[i].min, res[i].max, res[i].busy, res[i].bytes_per_step,
                res[i].tasks[0], res[i].tasks[1], res[i].kind_busy[0], res[i].kind_busy[1],
                res[i].buffer_peak_mib);
        if (o->critical_path)
            fprintf(f, ", \"task_seconds\": %.9g, \"critical_path_seconds\": %.9g",
                    res[i].task_time, res[i].critical);
        for (int dir = 0; dir < 2 && res[i].nmgrit[0] > 0; dir++) {
            fprintf(f, ", \"mgrit_%s\": [", dir ? "backward" : "forward");
            for (int32_t k = 0; k < res[i].nmgrit[dir]; k++)
                fprintf(f, "%s%.17g", k ? ", " : "", res[i].mgrit[dir][k]);
            fprintf(f, "]");
        }
        fprintf(f, "}");
    }
    return fprintf(f, "\n  ]\n}\n") < 0 ? -1 : 0;
}

int command_bench(int argc, char **argv)
{
    static const struct option options[] = {CLI_HELP_OPTION,
                                            CLI_COMMON_OPTIONS,
                                            CLI_RUN_OPTIONS,
                                            {"steps", required_argument, NULL, OPT_STEPS},
                                            {"warmup", required_argument, NULL, OPT_WARMUP},
                                            {"repeat", required_argument, NULL, OPT_REPEAT},
                                            {"json", required_argument, NULL, OPT_JSON},
                                            {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
                                            {"critical-path", no_argument, NULL, OPT_CRITICAL_PATH},
                                            {0}};
    bench_options bo;
    memset(&bo, 0, sizeof bo);
    train_options_init(&bo.run);
    bo.scheds = DEFAULT_SCHEDS;
    bo.steps = 5;
    bo.warmup = 2;
    bo.repeat = 3;
    cli_parser parser = {"tessel bench",      options, usage_bench, &bo.run.common,
                         handle_bench_option, &bo};
    int code = cli_parse(&parser, argc, argv);
    if (code)
        return code < 0 ? 0 : code;
    if ((code = check_run_options(&parser, &bo.run)))
        return code;
    /* (the common options' parser takes --sched: here a list) */
    if (bo.run.common.config.scheduler)
        bo.scheds = bo.run.common.config.scheduler;
    bo.run.common.config.scheduler = NULL;
    char names[MAX_SCHEDS][32];
    int n = split_scheds(parser.command, bo.scheds, names);
    if (n < 0)
        return EXIT_USAGE;
    /* MPI up across the StarPUs (a context that did not start MPI leaves it running). */
    int mpi_up = 0, provided = 0;
    MPI_Initialized(&mpi_up);
    /* (what tsl_context_create() does when it starts MPI: Open MPI's idle ranks yield) */
    if (!mpi_up && bo.run.common.config.yield_when_idle)
        setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    if (!mpi_up && MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "tessel bench: MPI_Init_thread failed\n");
        return 1;
    }
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    if (rank == 0 && bo.json)
        code = check_output_path("--json", bo.json, 0);
    MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    sched_result *res = calloc((size_t)n, sizeof *res);
    double *secs = calloc((size_t)(n * bo.repeat), sizeof *secs);
    if (!code && (!res || !secs))
        code = fail_oom("for the results", (double)(n * bo.repeat) * sizeof *secs);
    if (!code && rank == 0)
        printf("tessel bench: model %s, data %s, batch %ld, plan %s, %d ranks; %ld warm-up "
               "steps, %ld x %ld timed steps per scheduler\n",
               bo.run.model, bo.run.data, bo.run.batch,
               bo.run.plan_text ? bo.run.plan_text : "default", ranks, bo.warmup, bo.repeat,
               bo.steps);
    for (int i = 0; i < n && !code; i++) {
        snprintf(res[i].name, sizeof res[i].name, "%s", names[i]);
        res[i].secs = secs + (size_t)i * (size_t)bo.repeat;
        code = bench_one(&bo, names[i], &res[i]);
        if (!code && rank == 0) {
            if (i == 0)
                printf("%-12s %12s %12s %12s %8s %8s %14s\n", "scheduler", "s/step median", "min",
                       "max", "busy", "idle", "bytes/step");
            printf("%-12s %12.4f %12.4f %12.4f %7.1f%% %7.1f%% %14.0f\n", res[i].name,
                   res[i].median, res[i].min, res[i].max, 100 * res[i].busy,
                   100 * (1 - res[i].busy), res[i].bytes_per_step);
            if (bo.critical_path)
                printf("%-12s traced step: task time %.4f s, critical path %.4f s (%.2fx)\n", "",
                       res[i].task_time, res[i].critical,
                       res[i].critical > 0 ? res[i].task_time / res[i].critical : 0);
            for (int dir = 0; dir < 2 && res[i].nmgrit[0] > 0; dir++) {
                printf("%-12s MGRIT %s residuals (last step):", "", dir ? "backward" : "forward");
                for (int32_t k = 0; k < res[i].nmgrit[dir]; k++)
                    printf(" %.3e", res[i].mgrit[dir][k]);
                printf("\n");
            }
            if (res[i].cuda) { /* where the scheduler put the work */
                double all = res[i].tasks[0] + res[i].tasks[1];
                printf("%-12s tasks on CUDA workers %.1f%% (busy %.1f%%), on CPU workers %.1f%% "
                       "(busy %.1f%%)\n",
                       "", all > 0 ? 100 * res[i].tasks[1] / all : 0, 100 * res[i].kind_busy[1],
                       all > 0 ? 100 * res[i].tasks[0] / all : 0, 100 * res[i].kind_busy[0]);
            }
            fflush(stdout);
        }
    }
    if (!code && bo.json) {
        const void *arg[4] = {&bo, res, &n, &ranks};
        int bad = rank == 0 && write_file_atomic(bo.json, write_json, arg) != 0;
        if (bad)
            fprintf(stderr, "tessel bench: cannot write '%s'\n", bo.json);
        MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
        code = bad;
    }
    free(res);
    free(secs);
    if (!mpi_up)
        MPI_Finalize();
    return code;
}
