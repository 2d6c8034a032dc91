/* Training checkpoints of `tessel train` (--checkpoint, --resume): a directory of snapshots,
 * each complete before it is named by DIR/latest. */
#define _XOPEN_SOURCE 700
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define STATE_FORMAT "tessel-checkpoint"
/* 2: the optimizer's settings beyond lr and momentum are kept (1: their defaults then);
 * 3: the loss (2: cross-entropy then) */
#define STATE_VERSION 4
#define STATE_VERSION_TEXT "4"
#define SNAPSHOT_PREFIX "step-"

/* Make a directory's entries (a rename, a new file) durable. */
static int sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* rm -r PATH; a missing PATH is fine. */
static int remove_tree(const char *path)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : -1;
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int mgrit_schedule_valid(const char *text);

typedef struct state_file {
    const run_settings *settings;
    const run_progress *progress;
} state_file;

/* Doubles are written with 17 digits: they read back bit for bit. */
static int write_state(FILE *f, const void *arg)
{
    const state_file *sf = arg;
    const run_settings *s = sf->settings;
    const run_progress *p = sf->progress;
    fprintf(f, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"settings\": {\n    \"model\": ",
            STATE_FORMAT, STATE_VERSION);
    json_string(f, s->model);
    fprintf(f, ",\n    \"data\": ");
    json_string(f, s->data);
    fprintf(f,
            ",\n    \"optimizer\": \"%s\",\n    \"batch\": %ld,\n    \"epochs\": %ld,\n"
            "    \"lr\": %.17g,\n    \"momentum\": %.17g,\n    \"weight_decay\": %.17g,\n"
            "    \"dampening\": %.17g,\n    \"nesterov\": %s,\n    \"betas\": [%.17g, %.17g],\n"
            "    \"eps\": %.17g,\n    \"lr_schedule\": \"%s\",\n    \"warmup_steps\": %ld,\n"
            "    \"loss\": \"%s\",\n    \"mgrit\": \"%s\",\n    \"seed\": \"%llu\",\n"
            "    \"shuffle\": %s\n  },\n",
            s->optimizer, s->batch, s->epochs, s->lr, s->momentum, s->weight_decay, s->dampening,
            s->nesterov ? "true" : "false", s->beta1, s->beta2, s->eps, s->lr_schedule, s->warmup,
            s->loss, s->mgrit, s->seed, s->shuffle ? "true" : "false");
    fprintf(f,
            "  \"progress\": {\n    \"epoch\": %lld,\n    \"batch\": %lld,\n    \"steps\": %lld,\n"
            "    \"loss_sum\": %.17g,\n    \"hits\": %lld,\n    \"seen\": %lld,\n"
            "    \"seconds\": %.17g\n  },\n  \"finished_epochs\": [",
            (long long)p->epoch, (long long)p->batch, (long long)p->steps, p->loss_sum,
            (long long)p->hits, (long long)p->seen, p->seconds);
    for (int64_t e = 0; e < p->nepochs; e++) {
        const epoch_metrics *m = &p->epochs[e];
        fprintf(f, "%s\n    [%.17g, %.17g, %.17g, %.17g, %.17g, %.17g, %.17g]", e ? "," : "",
                m->train_loss, m->train_accuracy, m->test_loss, m->test_accuracy, m->seconds,
                m->samples_per_second, m->peak_mib);
    }
    fprintf(f, "%s]\n}\n", p->nepochs ? "\n  " : "");
    return 0;
}

static int write_latest(FILE *f, const void *arg)
{
    return fprintf(f, "%s\n", (const char *)arg) < 0;
}

/* Everything rank 0 does around the model's own files, before (phase 0) and after (1). */
static int save_on_root(const char *dir, const char *name, const char *partial, int phase,
                        const state_file *sf)
{
    char path[8192];
    if (phase == 0) {
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "tessel train: cannot create '%s': %s\n", dir, strerror(errno));
            return 1;
        }
        if (remove_tree(partial) != 0 || mkdir(partial, 0777) != 0) {
            fprintf(stderr, "tessel train: cannot create '%s': %s\n", partial, strerror(errno));
            return 1;
        }
        return 0;
    }
    char final[8192];
    snprintf(path, sizeof path, "%s/state.json", partial);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    if (write_file_atomic(path, write_state, sf) != 0 || sync_dir(partial) != 0 ||
        remove_tree(final) != 0 || rename(partial, final) != 0 || sync_dir(dir) != 0) {
        fprintf(stderr, "tessel train: cannot complete the checkpoint '%s': %s\n", final,
                strerror(errno));
        return 1;
    }
    snprintf(path, sizeof path, "%s/latest", dir);
    if (write_file_atomic(path, write_latest, name) != 0 || sync_dir(dir) != 0) {
        fprintf(stderr, "tessel train: cannot update '%s': %s\n", path, strerror(errno));
        return 1;
    }
    /* Only now may the previous snapshots (and leftovers of crashed saves) go. */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, SNAPSHOT_PREFIX, strlen(SNAPSHOT_PREFIX)) == 0 &&
            strcmp(e->d_name, name) != 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            remove_tree(path);
        }
    if (d)
        closedir(d);
    return 0;
}

int checkpoint_save(tsl_model_t model, tsl_optimizer_t opt, const char *dir,
                    const run_settings *settings, const run_progress *progress)
{
    char name[64], partial[4096];
    snprintf(name, sizeof name, SNAPSHOT_PREFIX "%012lld", (long long)progress->steps);
    if (snprintf(partial, sizeof partial, "%s/%s.partial", dir, name) >= (int)sizeof partial) {
        fprintf(stderr, "tessel train: checkpoint directory name too long\n");
        return EXIT_USAGE;
    }
    state_file sf = {settings, progress};
    int code = agree_exit(rank_of_process == 0 ? save_on_root(dir, name, partial, 0, &sf) : 0);
    if (code)
        return code;
    tsl_status st = tsl_model_save_checkpoint(model, opt, partial);
    if (st)
        return fail(st, "writing a checkpoint");
    return agree_exit(rank_of_process == 0 ? save_on_root(dir, name, partial, 1, &sf) : 0);
}

/* ---- reading ---- */

/* The whole of a file of at most `max` bytes (malloc'd), or NULL with *why saying why not. */
static char *read_text(const char *path, long max, const char **why)
{
    /* Not blocking on a named pipe; only a regular file is read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    FILE *f = NULL;
    *why = fd < 0 || fstat(fd, &sb) != 0 ? strerror(errno)
           : !S_ISREG(sb.st_mode)        ? "not a regular file"
           : !(f = fdopen(fd, "rb"))     ? strerror(errno)
                                         : NULL;
    if (*why) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char *text = malloc((size_t)max + 1);
    size_t n = text ? fread(text, 1, (size_t)max, f) : 0;
    *why = !text                                 ? "out of memory"
           : ferror(f)                           ? strerror(errno)
           : n == (size_t)max && fgetc(f) != EOF ? "larger than such a file can be"
                                                 : NULL;
    fclose(f);
    if (*why) {
        free(text);
        return NULL;
    }
    text[n] = '\0';
    return text;
}

/* On rank 0: the snapshot's name and state.json's text (malloc'd). */
static int read_on_root(const char *dir, char *snapshot, size_t size, char **text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/latest", dir);
    const char *why;
    char *latest = read_text(path, 256, &why);
    if (!latest) {
        fprintf(stderr, "tessel train: '%s' is not a checkpoint directory (cannot read '%s': %s)\n",
                dir, path, why);
        return 1;
    }
    latest[strcspn(latest, "\n")] = '\0';
    int ok = strncmp(latest, SNAPSHOT_PREFIX, strlen(SNAPSHOT_PREFIX)) == 0 &&
             strspn(latest + strlen(SNAPSHOT_PREFIX), "0123456789") ==
                 strlen(latest + strlen(SNAPSHOT_PREFIX)) &&
             strlen(latest) > strlen(SNAPSHOT_PREFIX);
    if (!ok || snprintf(snapshot, size, "%s/%s", dir, latest) >= (int)size) {
        fprintf(stderr, "tessel train: '%s' does not name a snapshot\n", path);
        free(latest);
        return 1;
    }
    free(latest);
    snprintf(path, sizeof path, "%s/state.json", snapshot);
    if (!(*text = read_text(path, 1L << 26, &why))) {
        fprintf(stderr, "tessel train: cannot read '%s': %s\n", path, why);
        return 1;
    }
    return 0;
}

static int get_number(const cJSON *obj, const char *key, double *v)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return -1;
    *v = item->valuedouble;
    return 0;
}

/* A whole number in [min, max] (compared as a double before the conversion, which would be
 * undefined outside int64's range). */
static int get_int(const cJSON *obj, const char *key, int64_t min, int64_t max, int64_t *v)
{
    double d;
    if (get_number(obj, key, &d) != 0 || d < (double)min || d > (double)max || d != floor(d))
        return -1;
    *v = (int64_t)d;
    return 0;
}

/* Element i of a JSON array, a finite number. */
static int get_array_number(const cJSON *array, int i, double *v)
{
    const cJSON *item = cJSON_GetArrayItem(array, i);
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return -1;
    *v = item->valuedouble;
    return 0;
}

static int get_string(const cJSON *obj, const char *key, char *out, size_t size)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(item) || strlen(item->valuestring) >= size)
        return -1;
    strcpy(out, item->valuestring);
    return 0;
}

/* The most steps a run may have taken (an optimizer's step count stays exact as a double). */
#define MAX_STEPS (INT64_C(1) << 53)

/* Parse state.json, holding every setting to the range its command-line option has. Returns
 * NULL, or what is wrong (the name of the first missing, malformed or out-of-range entry). */
static const char *parse_state(const char *text, run_settings *s, run_progress *p)
{
    cJSON *root = cJSON_Parse(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(root, "settings");
    const cJSON *pro = cJSON_GetObjectItemCaseSensitive(root, "progress");
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(root, "finished_epochs");
    const cJSON *shuffle = cJSON_GetObjectItemCaseSensitive(set, "shuffle");
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(set, "seed");
    const cJSON *nesterov = cJSON_GetObjectItemCaseSensitive(set, "nesterov");
    const cJSON *betas = cJSON_GetObjectItemCaseSensitive(set, "betas");
    int64_t version, batch = 0, epochs = 0, warmup = 0;
    lr_schedule schedule;
    tsl_loss_term loss_terms[TSL_MAX_LOSS_TERMS];
    int32_t nloss = 0;
    const char *bad = NULL;
    if (!root)
        bad = "the JSON syntax";
    else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, STATE_FORMAT) != 0)
        bad = "format (not \"" STATE_FORMAT "\")";
    else if (get_int(root, "version", 1, INT32_MAX, &version) || version > STATE_VERSION)
        bad = "version (1 to " STATE_VERSION_TEXT ")";
    else if (get_string(set, "model", s->model, sizeof s->model))
        bad = "settings.model";
    else if (get_string(set, "data", s->data, sizeof s->data))
        bad = "settings.data";
    else if (get_string(set, "optimizer", s->optimizer, sizeof s->optimizer) ||
             !optimizer_known(s->optimizer))
        bad = "settings.optimizer (sgd, adam or adamw)";
    else if (get_int(set, "batch", 1, MAX_BATCH, &batch))
        bad = "settings.batch (1 to 2^24, as --batch)";
    else if (get_int(set, "epochs", 1, MAX_EPOCHS, &epochs))
        bad = "settings.epochs (1 to 1000000, as --epochs)";
    else if (get_number(set, "lr", &s->lr) || s->lr < MIN_LR)
        bad = "settings.lr (a positive number, as --lr)";
    else if (get_number(set, "momentum", &s->momentum) || s->momentum < 0 || s->momentum >= 1)
        bad = "settings.momentum (at least 0 and below 1, as --momentum)";
    else if (version >= 2 &&
             (get_number(set, "weight_decay", &s->weight_decay) || s->weight_decay < 0))
        bad = "settings.weight_decay (at least 0, as --weight-decay)";
    else if (version >= 2 &&
             (get_number(set, "dampening", &s->dampening) || s->dampening < 0 || s->dampening > 1))
        bad = "settings.dampening (0 to 1, as --dampening)";
    else if (version >= 2 && (!cJSON_IsBool(nesterov) ||
                              (cJSON_IsTrue(nesterov) && (s->momentum <= 0 || s->dampening != 0))))
        bad = "settings.nesterov (true or false; true needs momentum above 0 and dampening 0)";
    else if (version >= 2 &&
             (cJSON_GetArraySize(betas) != 2 || get_array_number(betas, 0, &s->beta1) ||
              get_array_number(betas, 1, &s->beta2) || s->beta1 < 0 || s->beta1 >= 1 ||
              s->beta2 < 0 || s->beta2 >= 1))
        bad = "settings.betas (two numbers, each at least 0 and below 1, as --betas)";
    else if (version >= 2 && (get_number(set, "eps", &s->eps) || !(s->eps > 0)))
        bad = "settings.eps (above 0, as --eps)";
    else if (version >= 2 &&
             (get_string(set, "lr_schedule", s->lr_schedule, sizeof s->lr_schedule) ||
              parse_lr_schedule(s->lr_schedule, &schedule) ||
              (schedule.kind == SCHEDULE_COSINE && schedule.min > s->lr)))
        bad = "settings.lr_schedule (constant, step:N:G or cosine:T[:MIN], as --lr-schedule)";
    else if (version >= 2 && get_int(set, "warmup_steps", 0, INT64_C(1) << 40, &warmup))
        bad = "settings.warmup_steps (0 to 2^40, as --warmup-steps)";
    else if (version >= 3 && (get_string(set, "loss", s->loss, sizeof s->loss) ||
                              parse_loss(s->loss, loss_terms, &nloss)))
        bad = "settings.loss (NAME[:WEIGHT],... of cross_entropy, dice, mse and l1, as --loss)";
    else if (version >= 4 && (get_string(set, "mgrit", s->mgrit, sizeof s->mgrit) ||
                              !mgrit_schedule_valid(s->mgrit)))
        bad = "settings.mgrit (\"\" or levels=L,cf=M,iters=F,biters=B,relax=F|FCF,skip=K)";
    else if (!cJSON_IsString(seed) || parse_seed_arg(seed->valuestring, &s->seed))
        bad = "settings.seed (a string of a whole number in [0, 2^64), as --seed)";
    else if (!cJSON_IsBool(shuffle))
        bad = "settings.shuffle";
    else if (get_int(pro, "epoch", 0, MAX_EPOCHS, &p->epoch))
        bad = "progress.epoch";
    else if (get_int(pro, "batch", 0, MAX_STEPS, &p->batch))
        bad = "progress.batch";
    else if (get_int(pro, "steps", 0, MAX_STEPS - 1, &p->steps))
        bad = "progress.steps (0 to 2^53)";
    else if (get_number(pro, "loss_sum", &p->loss_sum))
        bad = "progress.loss_sum";
    else if (get_int(pro, "hits", 0, INT64_MAX / 2, &p->hits) ||
             get_int(pro, "seen", 0, INT64_MAX / 2, &p->seen))
        bad = "progress.hits or progress.seen";
    else if (get_number(pro, "seconds", &p->seconds) || p->seconds < 0)
        bad = "progress.seconds";
    else if (!cJSON_IsArray(fin) || cJSON_GetArraySize(fin) != p->epoch)
        bad = "finished_epochs (one row per finished epoch)";
    if (!bad && version < 2) { /* before the settings were kept: their defaults then */
        s->weight_decay = s->dampening = 0;
        s->nesterov = 0;
        s->beta1 = 0.9;
        s->beta2 = 0.999;
        s->eps = 1e-8;
        snprintf(s->lr_schedule, sizeof s->lr_schedule, "constant");
    }
    if (!bad && version < 3) /* before the loss was a setting */
        snprintf(s->loss, sizeof s->loss, "cross_entropy");
    if (!bad && version < 4) /* before layer-parallel MGRIT */
        s->mgrit[0] = '\0';
    if (!bad) {
        s->batch = (long)batch;
        s->epochs = (long)epochs;
        s->shuffle = cJSON_IsTrue(shuffle);
        s->nesterov = version >= 2 && cJSON_IsTrue(nesterov);
        s->warmup = (long)warmup;
        p->nepochs = p->epoch;
    }
    int64_t cap = p->nepochs > epochs ? p->nepochs : epochs;
    if (!bad && !(p->epochs = calloc((size_t)cap + 1, sizeof *p->epochs)))
        bad = "finished_epochs (no memory for them)";
    for (int64_t e = 0; !bad && e < p->nepochs; e++) {
        const cJSON *row = cJSON_GetArrayItem(fin, (int)e);
        double v[7];
        for (int k = 0; k < 7 && !bad; k++) {
            const cJSON *item = cJSON_GetArrayItem(row, k);
            if (!cJSON_IsNumber(item))
                bad = "finished_epochs (rows of 7 numbers)";
            v[k] = bad ? 0 : item->valuedouble;
        }
        if (!bad)
            p->epochs[e] = (epoch_metrics){.train_loss = v[0],
                                           .train_accuracy = v[1],
                                           .test_loss = v[2],
                                           .test_accuracy = v[3],
                                           .seconds = v[4],
                                           .samples_per_second = v[5],
                                           .peak_mib = v[6],
                                           .owned_mib = -1,
                                           .buffer_peak_mib = -1,
                                           .sent_per_step = -1,
                                           .received_per_step = -1,
                                           .cached_peak_mib = -1,
                                           .busy = -1,
                                           .ranks = NULL};
    }
    cJSON_Delete(root);
    return bad;
}

int checkpoint_read(const char *dir, run_settings *settings, run_progress *progress, char *snapshot,
                    size_t size)
{
    memset(settings, 0, sizeof *settings);
    memset(progress, 0, sizeof *progress);
    char *text = NULL;
    int code = agree_exit(rank_of_process == 0 ? read_on_root(dir, snapshot, size, &text) : 0);
    if (code)
        return code;
    long long len = rank_of_process == 0 ? (long long)strlen(text) : 0;
    MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    if (rank_of_process != 0 && !(text = malloc((size_t)len + 1)))
        abort();
    MPI_Bcast(text, (int)len + 1, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(snapshot, (int)size, MPI_CHAR, 0, MPI_COMM_WORLD);
    const char *bad = parse_state(text, settings, progress);
    free(text);
    if (bad) {
        if (rank_of_process == 0)
            fprintf(stderr,
                    "tessel train: '%s/state.json' is not a valid checkpoint state: bad or "
                    "missing %s\n",
                    snapshot, bad);
        free(progress->epochs);
        progress->epochs = NULL;
        return 1;
    }
    return 0;
}

void mgrit_schedule(const tsl_plan *p, char *text, size_t size)
{
    if (!p || p->levels <= 1)
        snprintf(text, size, "%s", "");
    else
        snprintf(text, size, "levels=%d,cf=%d,iters=%d,biters=%d,relax=%s,skip=%d", (int)p->levels,
                 (int)p->cf, (int)p->iters, (int)p->biters, p->relax == TSL_RELAX_F ? "F" : "FCF",
                 (int)p->skip);
}

/* Whether a checkpoint's "mgrit" is "" or a schedule as mgrit_schedule() writes it. */
static int mgrit_schedule_valid(const char *text)
{
    if (!*text)
        return 1;
    tsl_plan p;
    char again[128];
    if (tsl_plan_parse(text, &p) != TSL_OK)
        return 0;
    mgrit_schedule(&p, again, sizeof again);
    return strcmp(again, text) == 0;
}

/* Take the trajectory settings the command line left out from the checkpoint; those given
 * must match it (--epochs may differ: it extends or shortens the run). */
int merge_resumed(train_options *o, const run_settings *r)
{
    const char *diff = NULL;
    /* The MGRIT schedule changes a step's values: the plan must keep it (its layers=, data=
     * and space= may change with the rank count). */
    char mine[128];
    mgrit_schedule(o->plan_text ? &o->plan : NULL, mine, sizeof mine);
    if (strcmp(mine, r->mgrit) != 0) {
        if (rank_of_process == 0)
            fprintf(stderr,
                    "tessel train: the checkpoint being resumed was trained with %s%s%s; give a "
                    "--plan with %s%s%s (the MGRIT schedule changes the steps; layers=, data= and "
                    "space= may change)\n",
                    *r->mgrit ? "the MGRIT schedule '" : "the serial executor", r->mgrit,
                    *r->mgrit ? "'" : "", *r->mgrit ? "'" : "levels=1", r->mgrit,
                    *r->mgrit ? "'" : "");
        return EXIT_USAGE;
    }
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
    else if ((o->given & SET_WEIGHT_DECAY) && o->weight_decay != r->weight_decay)
        diff = "--weight-decay";
    else if ((o->given & SET_DAMPENING) && o->dampening != r->dampening)
        diff = "--dampening";
    else if ((o->given & SET_NESTEROV) && o->nesterov != r->nesterov)
        diff = "--nesterov";
    else if ((o->given & SET_BETAS) && (o->beta1 != r->beta1 || o->beta2 != r->beta2))
        diff = "--betas";
    else if ((o->given & SET_EPS) && o->eps != r->eps)
        diff = "--eps";
    else if ((o->given & SET_SCHEDULE) && strcmp(o->lr_schedule, r->lr_schedule))
        diff = "--lr-schedule";
    else if ((o->given & SET_WARMUP) && o->schedule.warmup != r->warmup)
        diff = "--warmup-steps";
    else if ((o->given & SET_LOSS) && strcmp(o->loss, r->loss))
        diff = "--loss";
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
    o->weight_decay = r->weight_decay;
    o->dampening = r->dampening;
    o->nesterov = r->nesterov;
    o->beta1 = r->beta1;
    o->beta2 = r->beta2;
    o->eps = r->eps;
    o->lr_schedule = r->lr_schedule;
    parse_lr_schedule(r->lr_schedule, &o->schedule); /* checked when read */
    o->schedule.warmup = r->warmup;
    o->loss = r->loss;
    parse_loss(r->loss, o->loss_terms, &o->nloss); /* checked when read */
    o->given |= SET_LOSS;                          /* (over the model file's) */
    o->seed = r->seed;
    o->shuffle = r->shuffle;
    if (!(o->given & SET_EPOCHS))
        o->epochs = r->epochs;
    return 0;
}

void settings_of(const train_options *o, run_settings *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->model, sizeof r->model, "%s", o->model);
    snprintf(r->data, sizeof r->data, "%s", o->data);
    snprintf(r->optimizer, sizeof r->optimizer, "%s", o->optimizer);
    r->batch = o->batch;
    r->epochs = o->epochs;
    r->lr = o->lr;
    r->momentum = o->momentum;
    r->weight_decay = weight_decay_of(o);
    r->dampening = o->dampening;
    r->nesterov = o->nesterov;
    r->beta1 = o->beta1;
    r->beta2 = o->beta2;
    r->eps = o->eps;
    snprintf(r->lr_schedule, sizeof r->lr_schedule, "%s", o->lr_schedule);
    r->warmup = o->schedule.warmup;
    snprintf(r->loss, sizeof r->loss, "%s", o->loss);
    mgrit_schedule(o->plan_text ? &o->plan : NULL, r->mgrit, sizeof r->mgrit);
    r->seed = o->seed;
    r->shuffle = o->shuffle;
}
