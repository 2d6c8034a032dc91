/* Task traces (tsl_context_trace_begin(), tsl_context_trace_write()): every tile task a rank
 * runs, from StarPU's profiling interface, as Chrome/Perfetto trace-event JSON.
 *
 * While a trace is on, tsl_task_submit() gives each task of this rank a small record (its
 * name, the layer and pass labels current at submission) as its callback argument; the
 * callback, which runs once the task has ended, reads the task's profiling information (start,
 * end, worker) into the rank's event array and then does what the plain callback does. Labels
 * are interned: an event keeps an index. Times are microseconds since the barrier in
 * tsl_context_trace_begin(), which every rank leaves together (to within the barrier's skew),
 * so the ranks' clocks line up. With StarPU-MPI's communication statistics on
 * (STARPU_COMM_STATS, tessel train --comm-stats), the bytes each rank has sent to every other
 * are sampled at the start of every training step and at the end: counter events. Writing
 * formats each rank's events as JSON text, gathers the texts to rank 0 and writes one file. */
#include <mpi.h>
#include <pthread.h>
#include <starpu.h>
#include <starpu_mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "critical_path.h"
#include "host_cache.h"
#include "trace.h"

typedef struct trace_event {
    const char *name; /* the task's name (static: the codelet's or the description's) */
    int32_t layer;    /* label index, -1: none */
    int32_t pass;     /* label index, -1: none */
    int32_t worker;
    int64_t seq;       /* its place among the submitted tasks (tsl_trace_submitted), -1: none */
    double start, end; /* us since the trace began */
} trace_event;

struct tsl_trace {
    pthread_mutex_t lock;
    double t0; /* starpu_timing_now() at the start barrier */
    trace_event *events;
    int64_t n, cap, max_events, dropped;
    /* With StarPU-MPI's communication statistics on: the bytes this rank sent to each rank
     * (size values a sample) at every step's start and at the end, counted from the start
     * (base); times in times[]. */
    int comm;
    size_t *base, *sent;
    double *times;
    int64_t nsamples, cap_samples;
    /* After every change of StarPU's buffers in use (the host cache's count): its time, the
     * bytes in use and of those the bytes StarPU-MPI receives into; a "buffers" counter track
     * of two series. */
    struct mem_sample {
        double t;
        size_t in_use, received;
    } * mem;
    int64_t nmem, cap_mem;
    char **labels; /* interned */
    int32_t nlabels, cap_labels;
    int32_t layer, pass; /* the current labels (the submitting thread's) */
    /* Every task submitted while the trace is on, on this rank: task k's name hash sub_name[k],
     * its data (StarPU-MPI tags) acc_id[sub_first[k] .. sub_first[k + 1] - 1] and how it
     * accesses them (TSL_ACCESS_*). Every rank submits every task, so the lists agree across
     * ranks and rank 0's, with every rank's durations, gives the critical path. */
    int64_t nsub, cap_sub, nacc, cap_acc;
    int64_t *sub_first, *acc_id;
    uint32_t *sub_name;
    uint8_t *acc_mode;
    int sub_failed; /* out of memory: no critical path */
};

typedef struct trace_record {
    struct tsl_context *ctx;
    struct starpu_task *task;
    const char *name;
    int32_t layer, pass;
    int64_t seq;
} trace_record;

static void trace_free(struct tsl_trace *t)
{
    if (!t)
        return;
    tsl_host_cache_unobserve(t);
    free(t->mem);
    for (int32_t i = 0; i < t->nlabels; i++)
        free(t->labels[i]);
    free(t->labels);
    free(t->events);
    free(t->base);
    free(t->sent);
    free(t->times);
    free(t->sub_first);
    free(t->sub_name);
    free(t->acc_id);
    free(t->acc_mode);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

void tsl_trace_destroy(struct tsl_context *ctx)
{
    trace_free(ctx->trace);
    ctx->trace = NULL;
}

/* The host cache's observer: a sample of the bytes in use now (under the cache's lock; past
 * max_events samples, or without memory, counted as dropped). */
static void memory_sample(void *arg, size_t in_use, size_t received)
{
    struct tsl_trace *t = arg;
    pthread_mutex_lock(&t->lock);
    if (t->nmem == t->cap_mem && t->nmem < t->max_events) {
        int64_t cap = t->cap_mem ? 2 * t->cap_mem : 1024;
        cap = cap < t->max_events ? cap : t->max_events;
        struct mem_sample *mem = realloc(t->mem, sizeof *mem * (size_t)cap);
        if (mem) {
            t->mem = mem;
            t->cap_mem = cap;
        }
    }
    if (t->nmem < t->cap_mem) {
        t->mem[t->nmem++] = (struct mem_sample){starpu_timing_now() - t->t0, in_use, received};
    } else {
        t->dropped++;
    }
    pthread_mutex_unlock(&t->lock);
}

tsl_status tsl_context_trace_begin(tsl_context_t ctx, int64_t max_events)
{
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_trace_begin: NULL context");
    if (max_events < 1 || max_events > ((int64_t)1 << 40))
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "tsl_context_trace_begin: max_events %lld is not in [1, 2^40]",
                         (long long)max_events);
    struct tsl_trace *t = calloc(1, sizeof *t);
    if (!t)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_context_trace_begin: out of memory");
    pthread_mutex_init(&t->lock, NULL);
    t->max_events = max_events;
    t->layer = t->pass = -1;
    /* Tasks submitted before this call end untraced (their records belong to no trace). */
    tsl_status st = tsl_context_wait(ctx);
    if (st) {
        trace_free(t);
        return st;
    }
    tsl_trace_destroy(ctx);
    starpu_profiling_status_set(STARPU_PROFILING_ENABLE);
    if (tsl_comm_stats_on())
        t->base = calloc((size_t)ctx->size, sizeof *t->base);
    t->comm = t->base != NULL;
    MPI_Barrier(ctx->ctl_comm);
    t->t0 = starpu_timing_now();
    if (t->comm)
        starpu_mpi_comm_amounts_retrieve(t->base);
    ctx->trace = t;
    tsl_host_cache_stats now;
    size_t kept;
    if (tsl_host_cache_query(&now, &kept)) { /* (counted only while installed) */
        memory_sample(t, now.in_use, now.received);
        tsl_host_cache_observe(memory_sample, t);
    }
    return TSL_OK;
}

/* A sample of the bytes sent so far to every rank, now (dropped without memory). */
static void sample_sent(struct tsl_context *ctx, struct tsl_trace *t)
{
    int n = ctx->size;
    if (t->nsamples == t->cap_samples) {
        int64_t cap = t->cap_samples ? 2 * t->cap_samples : 64;
        size_t *sent = realloc(t->sent, sizeof *sent * (size_t)(cap * n));
        if (sent)
            t->sent = sent;
        double *times = sent ? realloc(t->times, sizeof *times * (size_t)cap) : NULL;
        if (!times)
            return;
        t->times = times;
        t->cap_samples = cap;
    }
    size_t *row = t->sent + t->nsamples * n;
    starpu_mpi_comm_amounts_retrieve(row);
    for (int r = 0; r < n; r++)
        row[r] -= t->base[r];
    t->times[t->nsamples++] = starpu_timing_now() - t->t0;
}

/* Index of `label` among the interned labels (added if new), -1 for NULL or no memory. */
static int32_t intern(struct tsl_trace *t, const char *label)
{
    if (!label)
        return -1;
    for (int32_t i = t->nlabels - 1; i >= 0; i--)
        if (strcmp(t->labels[i], label) == 0)
            return i;
    if (t->nlabels == t->cap_labels) {
        int32_t cap = t->cap_labels ? 2 * t->cap_labels : 64;
        char **grown = realloc(t->labels, sizeof *grown * (size_t)cap);
        if (!grown)
            return -1;
        t->labels = grown;
        t->cap_labels = cap;
    }
    char *copy = strdup(label);
    if (!copy)
        return -1;
    t->labels[t->nlabels] = copy; /* (only the submitting thread touches labels) */
    return t->nlabels++;
}

void tsl_trace_label(struct tsl_context *ctx, const char *layer, const char *pass)
{
    struct tsl_trace *t = ctx->trace;
    if (!t)
        return;
    t->layer = intern(t, layer);
    t->pass = intern(t, pass);
    if (t->comm && pass && strcmp(pass, "data") == 0) /* a training step begins */
        sample_sent(ctx, t);
}

void tsl_trace_label_save(struct tsl_context *ctx, int32_t saved[2])
{
    struct tsl_trace *t = ctx->trace;
    saved[0] = t ? t->layer : -1;
    saved[1] = t ? t->pass : -1;
}

void tsl_trace_label_restore(struct tsl_context *ctx, const int32_t saved[2])
{
    struct tsl_trace *t = ctx->trace;
    if (!t)
        return;
    t->layer = saved[0];
    t->pass = saved[1];
}

tsl_status tsl_trace_totals(struct tsl_context *ctx, int32_t n, const char *const *layers,
                            double *seconds, double *busy, int64_t *ntasks)
{
    struct tsl_trace *t = ctx->trace;
    if (!t)
        return tsl_error(ctx, TSL_ERR_STATE, "trace totals: no trace is on");
    int32_t *of = malloc(sizeof *of * ((size_t)t->nlabels + 1));
    if (!of)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY, "trace totals: out of memory");
    for (int32_t l = 0; l < t->nlabels; l++) { /* each label's entry in layers, or -1 */
        of[l] = -1;
        for (int32_t i = 0; i < n && of[l] < 0; i++)
            if (layers[i] && strcmp(layers[i], t->labels[l]) == 0)
                of[l] = i;
    }
    for (int32_t i = 0; i < n; i++)
        seconds[i] = 0;
    *busy = 0;
    pthread_mutex_lock(&t->lock);
    for (int64_t k = 0; k < t->n; k++) {
        const trace_event *e = &t->events[k];
        double s = (e->end - e->start) * 1e-6;
        *busy += s;
        if (e->layer >= 0 && of[e->layer] >= 0)
            seconds[of[e->layer]] += s;
    }
    *ntasks = t->n;
    pthread_mutex_unlock(&t->lock);
    free(of);
    return TSL_OK;
}

tsl_status tsl_trace_busy_between(struct tsl_context *ctx, double from, double to, double *busy,
                                  int64_t *ntasks)
{
    struct tsl_trace *t = ctx->trace;
    if (!t)
        return tsl_error(ctx, TSL_ERR_STATE, "trace busy time: no trace is on");
    *busy = 0;
    *ntasks = 0;
    pthread_mutex_lock(&t->lock);
    for (int64_t k = 0; k < t->n; k++) {
        const trace_event *e = &t->events[k];
        if (e->start >= from - t->t0 && e->start < to - t->t0) {
            *busy += (e->end - e->start) * 1e-6;
            ++*ntasks;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return TSL_OK;
}

static void traced_task_done(void *arg)
{
    trace_record *r = arg;
    struct tsl_trace *t = r->ctx->trace;
    struct starpu_profiling_task_info *pi = r->task->profiling_info;
    if (t && pi) {
        trace_event e = {
            .name = r->name,
            .layer = r->layer,
            .pass = r->pass,
            .worker = pi->workerid,
            .seq = r->seq,
            .start = starpu_timing_timespec_to_us(&pi->start_time) - t->t0,
            .end = starpu_timing_timespec_to_us(&pi->end_time) - t->t0,
        };
        pthread_mutex_lock(&t->lock);
        if (t->n == t->cap && t->cap < t->max_events) {
            int64_t cap = t->cap ? 2 * t->cap : 4096;
            cap = cap < t->max_events ? cap : t->max_events;
            trace_event *grown = realloc(t->events, sizeof *grown * (size_t)cap);
            if (grown) {
                t->events = grown;
                t->cap = cap;
            }
        }
        if (t->n < t->cap)
            t->events[t->n++] = e;
        else
            t->dropped++;
        pthread_mutex_unlock(&t->lock);
    }
    struct tsl_context *ctx = r->ctx;
    free(r);
    tsl_task_finished(ctx);
}

static uint32_t name_hash(const char *s)
{
    return (uint32_t)tsl_fnv1a(TSL_FNV1A_START, s ? s : "", s ? strlen(s) : 0);
}

int64_t tsl_trace_submitted(struct tsl_context *ctx, const struct starpu_data_descr *descrs, int n,
                            const char *name)
{
    struct tsl_trace *t = ctx->trace;
    if (!t || t->sub_failed)
        return -1;
    if (t->nsub >= t->max_events) { /* as many as the events kept: no critical path past that */
        t->sub_failed = 1;
        return -1;
    }
    if (t->nsub + 1 >= t->cap_sub) {
        int64_t cap = t->cap_sub ? 2 * t->cap_sub : 4096;
        int64_t *first = realloc(t->sub_first, sizeof *first * (size_t)cap);
        if (first)
            t->sub_first = first;
        uint32_t *names = first ? realloc(t->sub_name, sizeof *names * (size_t)cap) : NULL;
        if (!names) {
            t->sub_failed = 1;
            return -1;
        }
        t->sub_name = names;
        t->cap_sub = cap;
    }
    if (t->nacc + n > t->cap_acc) {
        int64_t cap = t->cap_acc ? 2 * t->cap_acc : 16384;
        while (cap < t->nacc + n)
            cap *= 2;
        int64_t *ids = realloc(t->acc_id, sizeof *ids * (size_t)cap);
        if (ids)
            t->acc_id = ids;
        uint8_t *modes = ids ? realloc(t->acc_mode, (size_t)cap) : NULL;
        if (!modes) {
            t->sub_failed = 1;
            return -1;
        }
        t->acc_mode = modes;
        t->cap_acc = cap;
    }
    int64_t k = t->nsub++;
    t->sub_first[k] = t->nacc;
    t->sub_name[k] = name_hash(name);
    for (int i = 0; i < n; i++) {
        enum starpu_data_access_mode m = descrs[i].mode;
        if (m & STARPU_SCRATCH) /* a worker's private buffer: no dependency */
            continue;
        t->acc_id[t->nacc] = (int64_t)starpu_mpi_data_get_tag(descrs[i].handle);
        t->acc_mode[t->nacc++] = (uint8_t)(((m & STARPU_R) ? TSL_ACCESS_R : 0) |
                                           ((m & (STARPU_W | STARPU_REDUX)) ? TSL_ACCESS_W : 0));
    }
    t->sub_first[k + 1] = t->nacc;
    return k;
}

void tsl_trace_task(struct tsl_context *ctx, struct starpu_task *task, const char *name,
                    int64_t seq)
{
    struct tsl_trace *t = ctx->trace;
    trace_record *r = t ? malloc(sizeof *r) : NULL;
    if (!r) /* (no memory: the task runs untraced, with the plain callback) */
        return;
    *r = (trace_record){ctx, task, name, t->layer, t->pass, seq};
    task->callback_func = traced_task_done;
    task->callback_arg = r;
    task->callback_arg_free = 0;
}

/* A growing text buffer. */
typedef struct text {
    char *s;
    size_t n, cap;
    int failed;
} text;

static void append(text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void append(text *b, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !b->failed; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int len = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (len < 0) {
            b->failed = 1;
        } else if (b->s && (size_t)len < b->cap - b->n) {
            b->n += (size_t)len;
            return;
        } else {
            size_t cap = b->cap ? b->cap : 1 << 16;
            while (cap < b->n + (size_t)len + 1)
                cap *= 2;
            char *grown = realloc(b->s, cap);
            if (!grown)
                b->failed = 1;
            else {
                b->s = grown;
                b->cap = cap;
            }
        }
    }
}

/* `s` as the inside of a JSON string. */
static void append_escaped(text *b, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            append(b, "\\%c", c);
        else if (c < 0x20)
            append(b, "\\u%04x", c);
        else
            append(b, "%c", c);
    }
}

/* This rank's events and its process and thread names, as trace-event objects each followed
 * by ",\n". */
static void format_rank(struct tsl_context *ctx, struct tsl_trace *t, text *b)
{
    append(b,
           "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n",
           ctx->rank, ctx->rank);
    unsigned nworkers = starpu_worker_get_count();
    for (unsigned w = 0; w < nworkers; w++) {
        char name[64];
        starpu_worker_get_name((int)w, name, sizeof name);
        append(b,
               "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%u,\"args\":{\"name\":\"",
               ctx->rank, w);
        append_escaped(b, name);
        append(b, "\"}},\n");
    }
    /* StarPU-MPI's bytes sent, a counter track per rank with a series per destination */
    for (int64_t k = 0; k < t->nsamples; k++) {
        append(b, "{\"name\":\"bytes sent\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,\"args\":{",
               t->times[k], ctx->rank);
        for (int r = 0; r < ctx->size; r++)
            append(b, "%s\"to rank %d\":%zu", r ? "," : "", r, t->sent[k * ctx->size + r]);
        append(b, "}},\n");
    }
    /* the bytes of StarPU buffers in use, a counter track per rank: all of them, and those
     * StarPU-MPI received into (allocated as the receive was posted) */
    for (int64_t k = 0; k < t->nmem; k++)
        append(b,
               "{\"name\":\"buffers\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,\"args\":{\"MiB\":%.4f,"
               "\"received MiB\":%.4f}},\n",
               t->mem[k].t, ctx->rank, (double)t->mem[k].in_use / 1048576.0,
               (double)t->mem[k].received / 1048576.0);
    for (int64_t i = 0; i < t->n; i++) {
        const trace_event *e = &t->events[i];
        append(b, "{\"name\":\"");
        append_escaped(b, e->name ? e->name : "task");
        append(b, "\",\"cat\":\"");
        append_escaped(b, e->pass >= 0 ? t->labels[e->pass] : "other");
        append(b, "\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{",
               e->start, e->end - e->start, ctx->rank, e->worker);
        append(b, "\"layer\":\"");
        append_escaped(b, e->layer >= 0 ? t->labels[e->layer] : "");
        append(b, "\"}},\n");
    }
}

tsl_status tsl_context_trace_write(tsl_context_t ctx, const char *path)
{
    if (!ctx)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_context_trace_write: NULL context");
    struct tsl_trace *t = ctx->trace;
    /* Every rank learns whether the call can go on (a trace on every rank, a path on root). */
    int ok = t != NULL && (ctx->rank != 0 || path != NULL), all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, ctx->ctl_comm);
    if (!all)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG,
                         "tsl_context_trace_write: no trace begun on some rank, or no path on "
                         "rank 0");
    tsl_status st = tsl_context_wait(ctx); /* every traced task has ended */
    if (t->comm)
        sample_sent(ctx, t);
    ctx->trace = NULL;
    tsl_host_cache_unobserve(t); /* (no sample lands while its samples are formatted) */
    starpu_profiling_status_set(STARPU_PROFILING_DISABLE);
    text b = {0};
    format_rank(ctx, t, &b);
    long long mine[2] = {b.failed ? -1 : (long long)b.n, (long long)t->dropped};
    int size = ctx->size;
    long long *counts = ctx->rank == 0 ? calloc((size_t)size * 2, sizeof *counts) : NULL;
    int root_ok = ctx->rank != 0 || counts;
    MPI_Gather(mine, 2, MPI_LONG_LONG, counts, 2, MPI_LONG_LONG, 0, ctx->ctl_comm);
    /* Sizes that fit MPI_Gatherv's int counts and displacements, on root. */
    int *lens = NULL, *displs = NULL;
    char *all_text = NULL;
    long long total = 0, dropped = 0;
    if (ctx->rank == 0 && counts) {
        lens = calloc((size_t)size, sizeof *lens);
        displs = calloc((size_t)size, sizeof *displs);
        for (int r = 0; r < size; r++) {
            if (counts[2 * r] < 0 || total + counts[2 * r] > 0x7fffffffLL - 1)
                root_ok = 0;
            else if (lens && displs) {
                lens[r] = (int)counts[2 * r];
                displs[r] = (int)total;
                total += counts[2 * r];
            }
            dropped += counts[2 * r + 1];
        }
        all_text = lens && displs ? malloc((size_t)total + 1) : NULL;
        root_ok = root_ok && all_text;
    }
    MPI_Bcast(&root_ok, 1, MPI_INT, 0, ctx->ctl_comm);
    int my_ok = !b.failed && b.n <= 0x7fffffff, every = 0;
    MPI_Allreduce(&my_ok, &every, 1, MPI_INT, MPI_LAND, ctx->ctl_comm);
    tsl_status out = TSL_OK;
    if (!root_ok || !every) {
        out = tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY,
                        "tsl_context_trace_write: out of memory, or more than 2 GiB of trace text");
    } else {
        MPI_Gatherv(b.s, (int)b.n, MPI_CHAR, all_text, lens, displs, MPI_CHAR, 0, ctx->ctl_comm);
        int written = 1;
        if (ctx->rank == 0) {
            /* the last event's ",\n" becomes "\n" */
            size_t body = total >= 2 ? (size_t)total - 2 : 0;
            FILE *f = fopen(path, "w");
            written = f && fputs("{\"traceEvents\":[\n", f) != EOF &&
                      fwrite(all_text, 1, body, f) == body &&
                      fprintf(f,
                              "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":"
                              "\"tessel\",\"ranks\":%d,\"dropped_events\":%lld}}\n",
                              size, dropped) > 0;
            if (f && fclose(f) != 0)
                written = 0;
        }
        MPI_Bcast(&written, 1, MPI_INT, 0, ctx->ctl_comm);
        if (!written)
            out = tsl_error(ctx, TSL_ERR_IO, "tsl_context_trace_write: cannot write '%s'",
                            ctx->rank == 0 ? path : "(rank 0's path)");
    }
    free(counts);
    free(lens);
    free(displs);
    free(all_text);
    free(b.s);
    trace_free(t);
    return st ? st : out;
}

tsl_status tsl_context_trace_critical_path(tsl_context_t ctx, double *critical_s, double *task_s)
{
    const char *fn = "tsl_context_trace_critical_path";
    if (!ctx || !critical_s || !task_s)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    struct tsl_trace *t = ctx->trace;
    int ok = t != NULL, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, ctx->ctl_comm);
    if (!all)
        return tsl_error(ctx, TSL_ERR_INVALID_ARG, "%s: no trace begun on some rank", fn);
    tsl_status st = tsl_context_wait(ctx); /* every traced task has ended */
    if (st)
        return st;
    /* This rank's events as (submission number, microseconds, name hash) triples. */
    pthread_mutex_lock(&t->lock);
    int64_t n = t->n;
    double *mine = malloc(sizeof *mine * (size_t)(3 * (n > 0 ? n : 1)));
    for (int64_t i = 0; mine && i < n; i++) {
        const trace_event *e = &t->events[i];
        mine[3 * i] = (double)e->seq;
        mine[3 * i + 1] = e->end - e->start;
        mine[3 * i + 2] = e->seq >= 0 && e->seq < t->nsub ? (double)t->sub_name[e->seq] : -1;
    }
    pthread_mutex_unlock(&t->lock);
    /* per rank: events, submitted tasks, and whether it can take part */
    long long info[3] = {(long long)n, (long long)t->nsub,
                         mine && !t->sub_failed && !t->dropped && 3 * n < 0x7fffffff};
    int size = ctx->size;
    long long *infos = ctx->rank == 0 ? malloc(sizeof *infos * (size_t)(3 * size)) : NULL;
    int *lens = ctx->rank == 0 ? malloc(sizeof *lens * (size_t)size) : NULL;
    int *displs = ctx->rank == 0 ? malloc(sizeof *displs * (size_t)size) : NULL;
    MPI_Gather(info, 3, MPI_LONG_LONG, infos, 3, MPI_LONG_LONG, 0, ctx->ctl_comm);
    /* 0: fine; 1: out of memory or too many events; 2: the ranks submitted different tasks */
    int why = 0;
    long long total = 0;
    if (ctx->rank == 0) {
        if (!infos || !lens || !displs)
            why = 1;
        for (int r = 0; !why && r < size; r++) {
            if (!infos[3 * r + 2] || total + 3 * infos[3 * r] > 0x7fffffffLL)
                why = 1;
            else if (infos[3 * r + 1] != t->nsub)
                why = 2;
            lens[r] = (int)(3 * infos[3 * r]);
            displs[r] = (int)total;
            total += 3 * infos[3 * r];
        }
    }
    MPI_Bcast(&why, 1, MPI_INT, 0, ctx->ctl_comm);
    double *events = NULL, result[2] = {0, 0};
    if (!why) {
        events = ctx->rank == 0 ? malloc(sizeof *events * (size_t)(total > 0 ? total : 1)) : NULL;
        MPI_Gatherv(mine, (int)(3 * n), MPI_DOUBLE, events, lens, displs, MPI_DOUBLE, 0,
                    ctx->ctl_comm);
        if (ctx->rank == 0) {
            double *duration = events ? calloc((size_t)(t->nsub + 1), sizeof *duration) : NULL;
            why = duration ? 0 : 1;
            for (long long i = 0; !why && i < total; i += 3) {
                int64_t seq = (int64_t)events[i];
                if (seq < 0 || seq >= t->nsub || events[i + 2] != (double)t->sub_name[seq])
                    why = 2; /* a task rank 0 did not submit at that place */
                else
                    duration[seq] = events[i + 1];
            }
            if (!why && tsl_critical_path(t->nsub, t->sub_first, t->acc_id, t->acc_mode, duration,
                                          &result[0], &result[1]))
                why = 1;
            free(duration);
        }
        MPI_Bcast(&why, 1, MPI_INT, 0, ctx->ctl_comm);
        MPI_Bcast(result, 2, MPI_DOUBLE, 0, ctx->ctl_comm);
    }
    free(mine);
    free(infos);
    free(lens);
    free(displs);
    free(events);
    if (why == 2)
        return tsl_error(ctx, TSL_ERR_STATE,
                         "%s: the ranks submitted different tasks while the trace was on", fn);
    if (why)
        return tsl_error(ctx, TSL_ERR_OUT_OF_MEMORY,
                         "%s: out of memory, or the trace saw more tasks than its limit", fn);
    *critical_s = result[0] * 1e-6;
    *task_s = result[1] * 1e-6;
    return TSL_OK;
}
