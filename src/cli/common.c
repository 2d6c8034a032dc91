/* What the commands of tessel share (cli.h): option parsing through getopt_long, failure
 * reports, the options, context, data and model of tessel train and tessel eval, evaluation,
 * agreement between ranks, and files written whole. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "tessel/version.h"

int32_t rank_of_process;

/* ---- option parsing ---- */

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

int parse_seed_arg(const char *text, unsigned long long *value)
{
    char *end;
    errno = 0;
    if (*text < '0' || *text > '9') /* strtoull would take a sign or spaces */
        return -1;
    unsigned long long v = strtoull(text, &end, 10);
    if (*end || errno)
        return -1;
    *value = v;
    return 0;
}

int parse_double_arg(const char *text, double min, double *value)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || v < min)
        return -1;
    *value = v;
    return 0;
}

/* A common option (value NULL when it is missing); OPTION_UNKNOWN when `id` is not one. */
static int parse_common(int id, const char *value, common_options *opts)
{
    long v;
    switch (id) {
    case OPT_NCPU:
        if (!value || parse_int_arg(value, 0, 4096, &v)) {
            fprintf(stderr, "tessel: --ncpu needs a number of workers\n");
            return OPTION_FAILED;
        }
        opts->config.ncpu = (int32_t)v;
        return OPTION_OK;
    case OPT_HOST_CACHE_MIB:
        if (!value || parse_int_arg(value, 0, 1L << 30, &v)) {
            fprintf(stderr, "tessel: --host-cache-mib needs a number of MiB (0 or more)\n");
            return OPTION_FAILED;
        }
        opts->config.host_cache_bytes = (int64_t)v << 20;
        return OPTION_OK;
    case OPT_SPIN:
        opts->config.yield_when_idle = 0;
        return OPTION_OK;
    case OPT_QUIET:
        opts->config.log_level = TSL_LOG_ERROR;
        return OPTION_OK;
    case OPT_VERBOSE:
        opts->config.log_level = TSL_LOG_INFO;
        return OPTION_OK;
    case OPT_LOG_LEVEL: {
        static const char *const names[] = {"error", "warn", "info", "debug"};
        for (int level = TSL_LOG_ERROR; value && level <= TSL_LOG_DEBUG; level++)
            if (strcmp(value, names[level]) == 0) {
                opts->config.log_level = (tsl_log_level)level;
                return OPTION_OK;
            }
        fprintf(stderr, "tessel: --log-level takes error, warn, info or debug\n");
        return OPTION_FAILED;
    }
    case OPT_SCHED:
        if (!value) {
            fprintf(stderr, "tessel: --sched needs a scheduler name\n");
            return OPTION_FAILED;
        }
        opts->config.scheduler = value;
        return OPTION_OK;
    }
    return OPTION_UNKNOWN;
}

/* One line instead of the whole usage, after a mistake. */
static void short_usage(const cli_parser *p)
{
    fprintf(stderr, "usage: %s [options]   ('%s --help' lists them)\n", p->command, p->command);
}

/* "--NAME" of option `id` in the parser's table. */
static const char *option_name(const cli_parser *p, int id, char *buf, size_t cap)
{
    for (const struct option *o = p->options; o->name; o++)
        if (o->val == id) {
            snprintf(buf, cap, "--%s", o->name);
            return buf;
        }
    snprintf(buf, cap, "-%c", id);
    return buf;
}

void print_version(void)
{
    printf("tessel %s\n", TSL_VERSION_STRING);
}

/* Edit distance between a[0..na) and b[0..nb) counting insertions, deletions, substitutions and
 * swaps of neighbours ("trian" is one edit from "train"); names of options are short. */
static size_t edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
    enum { CAP = 128 };
    size_t rows[3][CAP], *before = rows[0], *above = rows[1], *row = rows[2];
    if (nb >= CAP)
        return (size_t)-1;
    for (size_t j = 0; j <= nb; j++)
        above[j] = j;
    for (size_t i = 1; i <= na; i++) {
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t best = above[j - 1] + (a[i - 1] != b[j - 1]);
            if (above[j] + 1 < best)
                best = above[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                before[j - 2] + 1 < best)
                best = before[j - 2] + 1;
            row[j] = best;
        }
        size_t *oldest = before;
        before = above;
        above = row;
        row = oldest;
    }
    return above[nb];
}

const char *closest_name(const char *typed, const char *const *names, int count)
{
    size_t len = strcspn(typed, "="), best_distance = (size_t)-1;
    const char *best = NULL;
    for (int i = 0; i < count && names[i]; i++) {
        size_t d = edit_distance(typed, len, names[i], strlen(names[i]));
        if (d < best_distance) {
            best_distance = d;
            best = names[i];
        }
    }
    /* A typo: at most a third of the name changed (one edit for short names). */
    size_t allowed = len / 3 > 1 ? len / 3 : 1;
    return best && best_distance <= allowed && best_distance < len ? best : NULL;
}

/* An unknown option: the message, the closest long option, and a short usage line. */
static int unknown_option(const cli_parser *p, const char *text)
{
    fprintf(stderr, "%s: unknown option '%s'\n", p->command, text);
    if (strncmp(text, "--", 2) == 0 && text[2]) {
        const char *names[128];
        int n = 0;
        for (const struct option *o = p->options; o->name && n < 128; o++)
            names[n++] = o->name;
        const char *near = closest_name(text + 2, names, n);
        if (near)
            fprintf(stderr, "did you mean --%s?\n", near);
    }
    short_usage(p);
    return EXIT_USAGE;
}

/* Hand option `id` to the common options, then to the command's handler, and report what
 * they refuse. */
static int take_option(const cli_parser *p, int id, const char *value, const char *text)
{
    char name[64];
    int got = p->common ? parse_common(id, value, p->common) : OPTION_UNKNOWN;
    if (got == OPTION_UNKNOWN)
        got = p->handle(p, id, value);
    switch (got) {
    case OPTION_OK:
        return 0;
    case OPTION_BAD_VALUE:
        fprintf(stderr, "%s: bad value '%s' for %s\n", p->command, value,
                option_name(p, id, name, sizeof name));
        return EXIT_USAGE;
    case OPTION_UNKNOWN:
        return unknown_option(p, text);
    }
    return EXIT_USAGE;
}

int cli_parse(const cli_parser *p, int argc, char **argv)
{
    /* The command's name is getopt's argv[0]; '-' returns other arguments in place (as 1),
     * ':' tells a missing value (':') from an unknown option ('?'). */
    int args = argc - 1;
    char **arg = argv + 1;
    char name[64];
    opterr = 0;
    optind = 1;
    for (;;) {
        int before = optind;
        int id = getopt_long(args, arg, "-:hqv", p->options, NULL);
        if (id == -1) {
            /* "--" ends getopt's options; tessel has no arguments after options. */
            if (before < args && strcmp(arg[before], "--") == 0)
                return unknown_option(p, "--");
            break;
        }
        const char *text = arg[optind - 1];
        if (id == OPT_HELP) {
            p->usage(stdout);
            return -1;
        }
        if (id == OPT_VERSION) {
            print_version();
            return -1;
        }
        if (id == 1) /* not an option */
            return unknown_option(p, optarg);
        if (id == '?') {
            if (optopt == 0) /* an unknown long option (or an ambiguous abbreviation) */
                return unknown_option(p, text);
            if (strncmp(text, "--", 2) != 0) { /* an unknown short option */
                snprintf(name, sizeof name, "-%c", optopt);
                return unknown_option(p, name);
            }
            fprintf(stderr, "%s: %s takes no value\n", p->command,
                    option_name(p, optopt, name, sizeof name));
            return EXIT_USAGE;
        }
        if (id == ':') { /* a value-taking option at the end, without its value */
            if (p->common && parse_common(optopt, NULL, p->common) == OPTION_FAILED)
                return EXIT_USAGE;
            fprintf(stderr, "%s: '%s' needs a value\n", p->command, text);
            short_usage(p);
            return EXIT_USAGE;
        }
        int code = take_option(p, id, optarg, text);
        if (code)
            return code;
    }
    /* StarPU's own messages (binding and calibration warnings) only from the info level on;
     * a STARPU_SILENT the user set wins. */
    if (p->common && p->common->config.log_level < TSL_LOG_INFO)
        setenv("STARPU_SILENT", "1", 0);
    return 0;
}

int under_mpi_launcher(void)
{
    static const char *const variables[] = {
        "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",    "PMI_RANK", "PMIX_RANK",
        "MPI_LOCALNRANKS",      "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof variables / sizeof *variables; i++)
        if (getenv(variables[i]))
            return 1;
    return 0;
}

/* Report a failed call; a rejected argument is a usage error (exit 2), anything else 1. */
int fail(tsl_status st, const char *what)
{
    const char *message = tsl_last_error();
    if (*message)
        fprintf(stderr, "tessel[%d]: %s failed: %s (%s)\n", rank_of_process, what, message,
                tsl_status_string(st));
    else
        fprintf(stderr, "tessel[%d]: %s failed: %s\n", rank_of_process, what,
                tsl_status_string(st));
    return st == TSL_ERR_INVALID_ARG ? EXIT_USAGE : 1;
}

int fail_collective(tsl_status mine, const char *what)
{
    char line[1024] = "";
    if (mine != TSL_OK) {
        const char *message = tsl_last_error();
        snprintf(line, sizeof line, "%s failed: %s%s%s%s", what, message, *message ? " (" : "",
                 tsl_status_string(mine), *message ? ")" : "");
    }
    /* FNV-1a of the line: equal lines on every rank print once. */
    unsigned long long hash = 1469598103934665603ULL;
    for (const char *c = line; *c; c++)
        hash = (hash ^ (unsigned char)*c) * 1099511628211ULL;
    unsigned long long mine_hash[2] = {hash, ~hash}, most[2];
    int own = mine, worst = 0;
    MPI_Allreduce(&own, &worst, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD); /* errors are negative */
    if (worst == TSL_OK)
        return 0;
    MPI_Allreduce(mine_hash, most, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    int alike = most[0] == hash && most[1] == ~hash; /* the largest and the smallest hash */
    int all_alike = 0;
    MPI_Allreduce(&alike, &all_alike, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all_alike && rank_of_process == 0)
        fprintf(stderr, "tessel: %s\n", line);
    else if (!all_alike && mine != TSL_OK)
        fprintf(stderr, "tessel[%d]: %s\n", rank_of_process, line);
    return worst == TSL_ERR_INVALID_ARG ? EXIT_USAGE : 1;
}

int fail_oom(const char *what, double bytes)
{
    fprintf(stderr, "tessel[%d]: out of memory %s (%.1f MiB)\n", rank_of_process, what,
            bytes / 1048576.0);
    return 1;
}

/* ---- tessel train and tessel eval ---- */

void train_options_init(train_options *o)
{
    memset(o, 0, sizeof *o);
    tsl_context_config_init(&o->common.config);
    o->model = "cnn";
    o->optimizer = "adam";
    o->epochs = 1;
    o->batch = 64;
    o->lr = -1;
    o->momentum = 0.9;
    o->weight_decay = -1;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->lr_schedule = "constant";
    o->loss = "cross_entropy";
    parse_loss(o->loss, o->loss_terms, &o->nloss);
    o->seed = 1;
    o->shuffle = 1;
}

int parse_run_option(const cli_parser *parser, int id, const char *value)
{
    train_options *o = parser->state;
    switch (id) {
    case OPT_MODEL:
        o->model = value;
        o->given |= SET_MODEL;
        return OPTION_OK;
    case OPT_DATA:
        o->data = value;
        o->given |= SET_DATA;
        return OPTION_OK;
    case OPT_BATCH:
        o->given |= SET_BATCH;
        return parse_int_arg(value, 1, MAX_BATCH, &o->batch) ? OPTION_BAD_VALUE : OPTION_OK;
    case OPT_LOAD_PARAMS:
        o->load_params = value;
        return OPTION_OK;
    case OPT_PLAN:
        if (strcmp(value, "auto") == 0) { /* chosen once the model is known (session_open) */
            o->plan_auto = 1;
            o->plan_text = NULL;
            return OPTION_OK;
        }
        o->plan_auto = 0;
        if (tsl_plan_parse(value, &o->plan) != TSL_OK) {
            fprintf(stderr, "%s: %s\n", parser->command, tsl_last_error());
            return OPTION_FAILED;
        }
        o->plan_text = value;
        return OPTION_OK;
    case OPT_LOSS:
        o->loss = value;
        o->given |= SET_LOSS;
        return strlen(value) >= sizeof(((run_settings *)0)->loss) ||
                       parse_loss(value, o->loss_terms, &o->nloss)
                   ? OPTION_BAD_VALUE
                   : OPTION_OK;
    }
    return OPTION_UNKNOWN;
}

int check_run_options(const cli_parser *parser, const train_options *o)
{
    if (!o->data && !o->resume) {
        fprintf(stderr, "%s: --data is required\n", parser->command);
        short_usage(parser);
        return EXIT_USAGE;
    }
    return 0;
}

tsl_status agree(tsl_status st)
{
    int v = st;
    MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return (tsl_status)v;
}

int agree_exit(int code)
{
    MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return code;
}

/* Whether `dir` takes a new file: one is made and removed (access() alone says yes to root on
 * read-only file systems such as /proc). NULL, or the reason. */
static const char *dir_takes_files(const char *dir)
{
    char probe[4200];
    if (snprintf(probe, sizeof probe, "%s/.tessel-write-check.XXXXXX", dir) >= (int)sizeof probe)
        return "too long a path";
    int fd = mkstemp(probe);
    if (fd < 0) {
        static char why[300];
        snprintf(why, sizeof why, "a new file cannot be made there (%s)", strerror(errno));
        return why;
    }
    close(fd);
    unlink(probe);
    return NULL;
}

int check_output_path(const char *option, const char *path, int is_dir)
{
    struct stat sb;
    char parent[4096];
    const char *why = NULL;
    if (!*path) {
        fprintf(stderr, "tessel: %s needs a path\n", option);
        return EXIT_USAGE;
    }
    if (stat(path, &sb) == 0) {
        if (is_dir && !S_ISDIR(sb.st_mode))
            why = "it exists and is not a directory";
        else if (!is_dir && S_ISDIR(sb.st_mode))
            why = "it is a directory";
        else if (!is_dir && !S_ISREG(sb.st_mode))
            why = "it exists and is not a regular file";
        else if (is_dir)
            why = dir_takes_files(path);
        if (why || is_dir) {
            if (why)
                fprintf(stderr, "tessel: cannot write %s '%s': %s\n", option, path, why);
            return why ? EXIT_USAGE : 0;
        }
    } else if (errno != ENOENT) {
        fprintf(stderr, "tessel: cannot write %s '%s': %s\n", option, path, strerror(errno));
        return EXIT_USAGE;
    }
    /* A new entry, or a file replaced by a rename: its directory must take new entries. */
    if (snprintf(parent, sizeof parent, "%s", path) >= (int)sizeof parent) {
        fprintf(stderr, "tessel: %s '%.64s...' is too long a path\n", option, path);
        return EXIT_USAGE;
    }
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') /* "out/" names the directory "out" */
        parent[--n] = '\0';
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else
        slash[slash == parent] = '\0'; /* "/x" has the parent "/" */
    if (stat(parent, &sb) != 0)
        why = strerror(errno);
    else if (!S_ISDIR(sb.st_mode))
        why = "not a directory";
    else
        why = dir_takes_files(parent);
    if (why) {
        fprintf(stderr, "tessel: cannot write %s '%s': its directory '%s': %s\n", option, path,
                parent, why);
        return EXIT_USAGE;
    }
    return 0;
}

tsl_status agree_all(tsl_status st)
{
    int v = st, worst = 0;
    MPI_Allreduce(&v, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return (tsl_status)worst;
}

tsl_status evaluate(tsl_model_t model, tsl_dataset_t ds, const tsl_dataset_info *info,
                    int64_t batch, double *loss, double *accuracy)
{
    /* this batch's samples, then the next one's (read ahead while this one is evaluated) */
    int64_t *idx = malloc(sizeof *idx * (size_t)(2 * batch));
    if (!idx)
        fail_oom("for a batch's sample numbers", (double)(sizeof *idx * (size_t)(2 * batch)));
    tsl_status st = agree_all(idx ? TSL_OK : TSL_ERR_OUT_OF_MEMORY);
    double loss_sum = 0;
    int64_t hits = 0;
    for (int64_t first = 0; first < info->samples && !st; first += batch) {
        int64_t count = info->samples - first < batch ? info->samples - first : batch;
        for (int64_t i = 0; i < 2 * count; i++)
            idx[i] = first + i;
        /* (read ahead only a next batch of this size) */
        const int64_t *next = first + 2 * count <= info->samples ? idx + count : NULL;
        double l = 0;
        int64_t c = 0;
        if ((st = tsl_model_evaluate_read_next(model, ds, count, idx, next, &l, &c)))
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

void session_end(session *s)
{
    tsl_model_destroy(s->model);
    tsl_dataset_destroy(s->train);
    tsl_dataset_destroy(s->test);
    if (s->ctx)
        tsl_context_destroy(s->ctx);
}

int session_context(session *s, const train_options *o)
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
    int32_t n = tsl_graph_op_count(g), states = optimizer_states(o->optimizer, o->momentum);
    int32_t *stage = calloc((size_t)n + 1, sizeof *stage);
    if (!stage) {
        fail_oom("for the stage of each layer", (double)((size_t)n + 1) * sizeof *stage);
        return TSL_ERR_OUT_OF_MEMORY;
    }
    tsl_status st = tsl_plan_stages(&o->plan, g, o->batch, states, stage);
    for (int32_t i = 0; i < n && !st; i++) {
        int32_t out;
        if (!(st = tsl_graph_op_info(g, i, NULL, NULL, &out)))
            st = tsl_graph_set_stage(g, out, stage[i]);
    }
    free(stage);
    return st;
}

/* --plan auto: the fastest predicted plan that fits this node's memory (auto_plan.c). */
static int choose_plan(session *s, train_options *o, tsl_graph_t g)
{
    int32_t ranks = 1, workers = 1, nops = tsl_graph_op_count(g), count = 0, total = 0, cached = 0;
    tsl_context_size(s->ctx, &ranks);
    tsl_context_worker_count(s->ctx, TSL_WORKER_CPU, &workers);
    double *op_seconds = calloc(6 * (size_t)nops + 1, sizeof *op_seconds);
    tsl_plan_prediction ranked[5];
    tsl_plan_costs costs = {0};
    tsl_status st = op_seconds ? TSL_OK : TSL_ERR_OUT_OF_MEMORY;
    if (!st)
        st = auto_costs(s->ctx, g, o->batch, ranks, op_seconds, &costs, &cached);
    if (!st)
        st = tsl_plan_candidates(g, ranks, workers, o->batch, NULL, 0, &total);
    if (!st)
        st = tsl_plan_search(g, ranks, workers, o->batch,
                             optimizer_states(o->optimizer, o->momentum), &costs,
                             auto_budget_bytes(0, PLAN_OVERHEAD_MIB, 0), TSL_OBJECTIVE_TIME, NULL,
                             NULL, ranked, 5, &count);
    free(op_seconds);
    if (st)
        return fail_collective(st, "choosing a plan (--plan auto)");
    o->plan = ranked[0].plan;
    o->plan_predicted = ranked[0].seconds;
    tsl_plan_format(&o->plan, o->plan_auto_text, sizeof o->plan_auto_text);
    o->plan_text = o->plan_auto_text;
    if (rank_of_process == 0) {
        print_ranked(ranked, count < 5 ? count : 5, count, total);
        printf("plan auto: chose %s (predicted %.4g s/step; calibration %s)\n", o->plan_auto_text,
               ranked[0].seconds, cached ? "from the cache" : "measured now");
        fflush(stdout);
    }
    return 0;
}

int session_open(session *s, train_options *o, int need_train)
{
    tsl_status st = TSL_OK;
    int code;
    if (need_train)
        st = tsl_dataset_open(&s->train, o->data, TSL_SPLIT_TRAIN);
    if (!st)
        st = tsl_dataset_open(&s->test, o->data, TSL_SPLIT_TEST);
    if ((code = fail_collective(st, "opening the data")))
        return code;
    if (s->train)
        tsl_dataset_get_info(s->train, &s->train_info);
    tsl_dataset_get_info(s->test, &s->test_info);
    const tsl_dataset_info *info = s->train ? &s->train_info : &s->test_info;
    tsl_graph_t g;
    /* A dataset of float targets: the model's classes are the targets' channels, so its output
     * has the targets' shape. */
    st = tsl_model_graph(o->model, info->sample_shape.ndim, info->sample_shape.dims,
                         info->targets ? info->label_shape.dims[0] : info->classes, &g);
    if ((code = fail_collective(st, "building the model")))
        return code;
    /* A model of several inputs: the data gives each further one by its name (NAME.npy). */
    char mismatch[512] = "";
    s->ninputs = tsl_graph_input_count(g);
    s->output_value = tsl_graph_output(g);
    for (int32_t k = 0; k < s->ninputs; k++) {
        int32_t v = s->input_values[k] = tsl_graph_input_value(g, k);
        tsl_graph_value_shape(g, v, &s->input_shapes[k]);
        for (int32_t op = 0; op < tsl_graph_op_count(g); op++) {
            int32_t out = -1;
            const char *n = NULL;
            tsl_graph_op_info(g, op, NULL, &n, &out);
            if (out == v)
                snprintf(s->input_names[k], sizeof s->input_names[k], "%s", n);
        }
    }
    for (int32_t k = 1; k < s->ninputs && !st && !mismatch[0]; k++) {
        const char *name = s->input_names[k];
        tsl_shape want = s->input_shapes[k], got;
        for (int d = 0; d < 2 && !st && !mismatch[0]; d++) {
            tsl_dataset_t ds = d ? s->test : s->train;
            if (!ds || (st = tsl_dataset_input_shape(ds, name, &got)))
                continue;
            int fits = got.ndim == want.ndim;
            for (int32_t a = 0; fits && a < got.ndim; a++)
                fits = got.dims[a] == want.dims[a];
            if (!fits)
                snprintf(mismatch, sizeof mismatch,
                         "the data's input '%s' has %d-axis samples of %lld channels, and model "
                         "'%s' takes %d axes of %lld",
                         name, (int)got.ndim, (long long)got.dims[0], o->model, (int)want.ndim,
                         (long long)want.dims[0]);
        }
    }
    if ((code = fail_collective(st, "reading the model's further inputs")) || mismatch[0]) {
        if (mismatch[0] && rank_of_process == 0) /* (alike on every rank) */
            fprintf(stderr, "tessel: %s\n", mismatch);
        tsl_graph_destroy(g);
        return code ? code : EXIT_USAGE;
    }
    tsl_shape out;
    tsl_graph_value_shape(g, tsl_graph_output(g), &out);
    s->output_shape = out;
    if (info->targets) {
        int fits = out.ndim == info->label_shape.ndim;
        for (int32_t d = 0; fits && d < out.ndim; d++)
            fits = out.dims[d] == info->label_shape.dims[d];
        if (!fits) {
            tsl_graph_destroy(g);
            if (rank_of_process == 0)
                fprintf(stderr,
                        "tessel: model '%s' has a %d-axis output of %lld channels but the data's "
                        "float targets are %d axes of %lld channels per sample\n",
                        o->model, (int)out.ndim, (long long)out.dims[0],
                        (int)info->label_shape.ndim, (long long)info->label_shape.dims[0]);
            return EXIT_USAGE;
        }
    } else if (out.ndim - 1 != info->label_shape.ndim) {
        tsl_graph_destroy(g);
        if (rank_of_process == 0) /* alike on every rank */
            fprintf(stderr, "tessel: model '%s' is a %s network but the data has %s labels\n",
                    o->model, out.ndim == 1 ? "classification" : "segmentation",
                    info->label_shape.ndim ? "per-voxel" : "per-sample");
        return EXIT_USAGE;
    }
    if (o->plan_auto && !o->plan_text && (code = choose_plan(s, o, g))) {
        tsl_graph_destroy(g);
        return code;
    }
    if (o->plan_text && tsl_plan_depth(&o->plan) > 1 && (st = set_stages(g, o))) {
        tsl_graph_destroy(g);
        return fail(st, "splitting the model into stages");
    }
    /* The loss: its terms on the batch from --loss (or the checkpoint's), else the model
     * file's, else cross-entropy; then the file's terms between values of the network. */
    tsl_loss_term file_terms[TSL_MAX_LOSS_TERMS], terms[TSL_MAX_LOSS_TERMS];
    int32_t file_count = 0, count = 0;
    tsl_graph_loss(g, &file_count, file_terms);
    if (!(o->given & SET_LOSS) && file_count > 0) {
        size_t n = 0;
        o->nloss = 0;
        for (int32_t k = 0; k < file_count && n < sizeof o->loss_text; k++) {
            if (file_terms[k].against)
                continue;
            n += (size_t)snprintf(o->loss_text + n, sizeof o->loss_text - n, "%s%s:%.17g",
                                  n ? "," : "", tsl_model_loss_name(file_terms[k].kind),
                                  file_terms[k].weight);
            o->loss_terms[o->nloss++] = file_terms[k];
        }
        o->loss = o->loss_text;
    }
    for (int32_t k = 0; k < o->nloss; k++)
        terms[count++] = o->loss_terms[k];
    for (int32_t k = 0; k < file_count; k++)
        if (file_terms[k].against) {
            if (count == TSL_MAX_LOSS_TERMS) {
                tsl_graph_destroy(g);
                if (rank_of_process == 0)
                    fprintf(stderr,
                            "tessel: --loss and the model file's terms between values make more "
                            "than %d loss terms\n",
                            TSL_MAX_LOSS_TERMS);
                return EXIT_USAGE;
            }
            terms[count++] = file_terms[k];
        }
    st = tsl_model_create_plan(&s->model, s->ctx, g, o->seed, o->plan_text ? &o->plan : NULL);
    tsl_graph_destroy(g);
    if (st)
        return fail_collective(st, "creating the model");
    if ((st = tsl_model_set_loss(s->model, count, terms)))
        return fail_collective(st, "setting --loss");
    tsl_model_loss_kind first = o->nloss > 0 ? o->loss_terms[0].kind : TSL_MODEL_LOSS_CROSS_ENTROPY;
    if (tsl_model_loss_takes_targets(first) != (info->targets != 0)) {
        if (rank_of_process == 0)
            fprintf(stderr,
                    "tessel: the loss %s takes %s, and the data gives %s (float targets come "
                    "from an npy directory whose y is f32; mse and l1 take them)\n",
                    tsl_model_loss_name(first),
                    tsl_model_loss_takes_targets(first) ? "float targets of the output's shape"
                                                        : "class labels",
                    info->targets ? "float targets" : "class labels");
        return EXIT_USAGE;
    }
    if (o->load_params && (st = tsl_model_load_params(s->model, o->load_params)))
        return fail_collective(st, "loading parameters");
    return 0;
}

/* ---- files ---- */

int write_file_atomic(const char *path, int (*write)(FILE *f, const void *arg), const void *arg)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (!f)
        return -1;
    errno = 0;
    int bad = write(f, arg) != 0;
    bad |= ferror(f);
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    int error = errno ? errno : EIO; /* the first failure's */
    bad |= fclose(f) != 0;
    if (!bad && rename(tmp, path) == 0)
        return 0;
    if (!bad)
        error = errno;
    unlink(tmp);
    errno = error;
    return -1;
}

void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

int parse_lr_schedule(const char *text, lr_schedule *s)
{
    memset(s, 0, sizeof *s);
    char extra;
    if (strcmp(text, "constant") == 0)
        return 0;
    if (sscanf(text, "step:%ld:%lf%c", &s->every, &s->gamma, &extra) == 2)
        s->kind = SCHEDULE_STEP;
    else if (sscanf(text, "cosine:%ld:%lf%c", &s->t_max, &s->min, &extra) == 2 ||
             (sscanf(text, "cosine:%ld%c", &s->t_max, &extra) == 1 && (s->min = 0, 1)))
        s->kind = SCHEDULE_COSINE;
    else
        return -1;
    if (s->kind == SCHEDULE_STEP)
        return s->every >= 1 && s->every <= (1L << 40) && isfinite(s->gamma) && s->gamma > 0 &&
                       s->gamma <= 1
                   ? 0
                   : -1;
    return s->t_max >= 1 && s->t_max <= (1L << 40) && isfinite(s->min) && s->min >= 0 ? 0 : -1;
}

int parse_loss(const char *text, tsl_loss_term *terms, int32_t *count)
{
    *count = 0;
    const char *p = text;
    while (*p) {
        if (*count == TSL_MAX_LOSS_TERMS)
            return -1;
        size_t len = strcspn(p, ",");
        char term[64];
        if (len == 0 || len >= sizeof term)
            return -1;
        memcpy(term, p, len);
        term[len] = '\0';
        char *colon = strchr(term, ':');
        double weight = 1.0;
        if (colon) {
            *colon = '\0';
            if (parse_double_arg(colon + 1, 0, &weight) || !isfinite(weight) || !(weight > 0))
                return -1;
        }
        tsl_loss_term *t = &terms[(*count)++];
        memset(t, 0, sizeof *t); /* on the output, against the batch */
        if (tsl_model_loss_parse(term, &t->kind))
            return -1;
        t->weight = weight;
        p += len;
        if (*p == ',' && *++p == '\0')
            return -1; /* a trailing comma */
    }
    return *count ? 0 : -1;
}

double scheduled_lr(const lr_schedule *s, double lr, int64_t steps)
{
    double v = lr;
    if (s->kind == SCHEDULE_STEP)
        v = lr * pow(s->gamma, (double)(steps / s->every));
    else if (s->kind == SCHEDULE_COSINE) {
        int64_t k = steps < s->t_max ? steps : s->t_max;
        const double pi = 3.14159265358979323846;
        v = s->min + (lr - s->min) * (1 + cos(pi * (double)k / (double)s->t_max)) / 2;
    }
    if (s->warmup > 0 && steps < s->warmup)
        v *= (double)(steps + 1) / (double)s->warmup;
    return v;
}

int optimizer_known(const char *name)
{
    return strcmp(name, "sgd") == 0 || strcmp(name, "adam") == 0 || strcmp(name, "adamw") == 0;
}

double weight_decay_of(const train_options *o)
{
    return o->weight_decay >= 0 ? o->weight_decay : strcmp(o->optimizer, "adamw") == 0 ? 0.01 : 0;
}

int32_t optimizer_states(const char *name, double momentum)
{
    return strcmp(name, "sgd") != 0 ? 2 : momentum > 0 ? 1 : 0;
}

int check_optimizer_options(train_options *o, const char *cmd)
{
    int sgd = strcmp(o->optimizer, "sgd") == 0;
    const char *wrong = sgd && (o->given & SET_BETAS)        ? "--betas"
                        : sgd && (o->given & SET_EPS)        ? "--eps"
                        : !sgd && (o->given & SET_DAMPENING) ? "--dampening"
                        : !sgd && (o->given & SET_NESTEROV)  ? "--nesterov"
                        : !sgd && (o->given & SET_MOMENTUM)  ? "--momentum"
                                                             : NULL;
    if (wrong) {
        fprintf(stderr, "%s: %s is not an option of --optimizer %s (%s)\n", cmd, wrong,
                o->optimizer,
                sgd ? "--betas and --eps are adam's and adamw's"
                    : "--momentum, --dampening and --nesterov are sgd's");
        return EXIT_USAGE;
    }
    if (o->momentum >= 1 || o->dampening > 1) {
        fprintf(stderr, "%s: --%s must be below 1\n", cmd,
                o->momentum >= 1 ? "momentum" : "dampening (at most 1)");
        return EXIT_USAGE;
    }
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0)) {
        fprintf(stderr, "%s: --nesterov needs --momentum above 0 and --dampening 0\n", cmd);
        return EXIT_USAGE;
    }
    if (o->beta1 >= 1 || o->beta2 >= 1) {
        fprintf(stderr, "%s: --betas B1,B2 must each be at least 0 and below 1\n", cmd);
        return EXIT_USAGE;
    }
    if (o->schedule.kind == SCHEDULE_COSINE && o->lr >= 0 && o->schedule.min > o->lr) {
        fprintf(stderr, "%s: --lr-schedule cosine's MIN %g is above --lr %g\n", cmd,
                o->schedule.min, o->lr);
        return EXIT_USAGE;
    }
    return 0;
}

tsl_status create_optimizer(const train_options *o, tsl_context_t ctx, tsl_optimizer_t *opt)
{
    int sgd = strcmp(o->optimizer, "sgd") == 0;
    double lr = o->lr >= 0 ? o->lr : sgd ? 0.01 : 0.001;
    double decay = weight_decay_of(o);
    if (sgd) {
        tsl_sgd_config c;
        tsl_sgd_config_init(&c);
        c.lr = lr;
        c.momentum = o->momentum;
        c.dampening = o->dampening;
        c.weight_decay = decay;
        c.nesterov = o->nesterov;
        return tsl_optimizer_create_sgd(opt, ctx, &c);
    }
    tsl_adam_config c;
    tsl_adam_config_init(&c);
    c.lr = lr;
    c.beta1 = o->beta1;
    c.beta2 = o->beta2;
    c.eps = o->eps;
    c.weight_decay = decay;
    c.decoupled = strcmp(o->optimizer, "adamw") == 0;
    return tsl_optimizer_create_adam(opt, ctx, &c);
}
