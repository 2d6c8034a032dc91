/* The batch loader (include/tessel/data.h): epochs cut into batches, the next batch read on
 * a background thread into the buffer the caller is not using (double buffering), or, for
 * batches over LOADER_PREFETCH_MAX_BYTES, into the one buffer when the caller asks for it.
 * Built on the public dataset calls only; pure C and pthreads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tessel/data.h"

#define LOADER_MESSAGE_MAX 512

/* A batch larger than this (samples and labels) is not read ahead: a second buffer would
 * hold as much again on the rank that reads (a 2496^2 segmentation sample with its per-pixel
 * labels is 71 MiB), while reading one takes a small part of the training step it feeds. */
#define LOADER_PREFETCH_MAX_BYTES ((int64_t)64 << 20)

/* One of the two buffers, with the batch it holds and how reading it went. */
typedef struct loader_slot {
    float *x;
    int64_t *y;     /* a dataset of class labels' */
    float *targets; /* a dataset of float targets' (info.targets) */
    int64_t *indices;
    int64_t count;
    int64_t epoch;
    int64_t index;
    int32_t last;
    tsl_status status;
    char message[LOADER_MESSAGE_MAX];
} loader_slot;

struct tsl_loader {
    tsl_dataset_t dataset;
    tsl_dataset_info info;
    int64_t batch_size;
    int64_t batches_per_epoch;
    uint64_t seed;
    int32_t shuffle;

    /* Where the reader is: touched by the reading thread only. */
    int64_t *order; /* the current epoch's order */
    int64_t epoch;
    int64_t next_batch;

    loader_slot slots[2];

    /* Shared with the thread, under lock. */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int fill_slot; /* the slot the thread fills next, which the caller does not hold */
    int filled;    /* slots[fill_slot] is ready */
    int nslots;    /* 2: read ahead; 1: read a batch when tsl_loader_next() asks */
    int requested; /* one slot: tsl_loader_next() waits for a batch not read yet */
    int stop;
    tsl_status error; /* sticky: once a read failed, every later call reports it */
    char error_message[LOADER_MESSAGE_MAX];
    pthread_t thread;
    int thread_started;
};

/* Read the next batch of the schedule into `slot`; on failure keep the message. */
static tsl_status read_next_batch(struct tsl_loader *ld, loader_slot *slot)
{
    int64_t samples = ld->info.samples;
    tsl_status st = TSL_OK;
    if (ld->next_batch == 0)
        st = tsl_dataset_epoch_order(ld->order, samples, ld->seed, ld->epoch, ld->shuffle);
    int64_t start = ld->next_batch * ld->batch_size;
    int64_t count = samples - start < ld->batch_size ? samples - start : ld->batch_size;
    memcpy(slot->indices, ld->order + start, (size_t)count * sizeof *slot->indices);
    slot->count = count;
    slot->epoch = ld->epoch;
    slot->index = ld->next_batch;
    slot->last = ld->next_batch + 1 == ld->batches_per_epoch;
    if (!st)
        st = tsl_dataset_read(ld->dataset, slot->indices, count, slot->x, slot->y);
    /* float targets: each sample's whole box */
    int64_t origin[TSL_MAX_DIMS] = {0};
    for (int64_t i = 0; i < count && !st && slot->targets; i++)
        st = tsl_dataset_read_target_box(ld->dataset, slot->indices[i], origin,
                                         ld->info.label_shape.dims,
                                         slot->targets + i * ld->info.label_numel);
    slot->status = st;
    if (st)
        snprintf(slot->message, sizeof slot->message, "%s", tsl_last_error());
    if (++ld->next_batch == ld->batches_per_epoch) {
        ld->next_batch = 0;
        ld->epoch++;
    }
    return st;
}

static void *loader_thread(void *arg)
{
    struct tsl_loader *ld = arg;
    pthread_mutex_lock(&ld->lock);
    for (;;) {
        while (!ld->stop && (ld->filled || (ld->nslots == 1 && !ld->requested)))
            pthread_cond_wait(&ld->changed, &ld->lock);
        if (ld->stop)
            break;
        loader_slot *slot = &ld->slots[ld->fill_slot];
        ld->requested = 0;
        pthread_mutex_unlock(&ld->lock);
        tsl_status st = read_next_batch(ld, slot);
        pthread_mutex_lock(&ld->lock);
        ld->filled = 1;
        pthread_cond_broadcast(&ld->changed);
        if (st)
            break; /* the caller gets the error; nothing more is read */
    }
    pthread_mutex_unlock(&ld->lock);
    return NULL;
}

static void stop_thread(struct tsl_loader *ld)
{
    if (!ld->thread_started)
        return;
    pthread_mutex_lock(&ld->lock);
    ld->stop = 1;
    pthread_cond_broadcast(&ld->changed);
    pthread_mutex_unlock(&ld->lock);
    pthread_join(ld->thread, NULL);
    ld->thread_started = 0;
}

tsl_status tsl_loader_destroy(tsl_loader_t ld)
{
    if (!ld)
        return TSL_OK;
    stop_thread(ld);
    pthread_cond_destroy(&ld->changed);
    pthread_mutex_destroy(&ld->lock);
    for (int s = 0; s < 2; s++) {
        free(ld->slots[s].x);
        free(ld->slots[s].y);
        free(ld->slots[s].targets);
        free(ld->slots[s].indices);
    }
    free(ld->order);
    free(ld);
    return TSL_OK;
}

tsl_status tsl_loader_create(tsl_loader_t *loader, tsl_dataset_t dataset, int64_t batch_size,
                             uint64_t seed, int32_t shuffle, int32_t drop_last)
{
    if (!loader || !dataset || batch_size < 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_loader_create: need a loader, a dataset and batch_size >= 1");
    tsl_dataset_info info;
    tsl_status st = tsl_dataset_get_info(dataset, &info);
    if (st)
        return st;
    int64_t batches =
        drop_last ? info.samples / batch_size : (info.samples + batch_size - 1) / batch_size;
    if (batches == 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_loader_create: %lld samples make no complete batch of %lld (drop "
                         "incomplete batches off, or use a smaller batch)",
                         (long long)info.samples, (long long)batch_size);
    int64_t rows = batch_size < info.samples ? batch_size : info.samples;
    struct tsl_loader *ld = calloc(1, sizeof *ld);
    if (!ld)
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_loader_create: out of memory");
    ld->dataset = dataset;
    ld->info = info;
    ld->batch_size = batch_size;
    ld->batches_per_epoch = batches;
    ld->seed = seed;
    ld->shuffle = shuffle;
    pthread_mutex_init(&ld->lock, NULL);
    pthread_cond_init(&ld->changed, NULL);
    int64_t batch_bytes =
        rows * (info.sample_numel * (int64_t)sizeof(float) +
                info.label_numel * (int64_t)(info.targets ? sizeof(float) : sizeof(int64_t)));
    ld->nslots = batch_bytes > LOADER_PREFETCH_MAX_BYTES ? 1 : 2;
    int ok = (ld->order = malloc((size_t)info.samples * sizeof *ld->order)) != NULL;
    for (int s = 0; s < ld->nslots && ok; s++) {
        loader_slot *slot = &ld->slots[s];
        size_t labels = (size_t)(rows * info.label_numel);
        ok = (slot->x = malloc((size_t)(rows * info.sample_numel) * sizeof *slot->x)) &&
             (info.targets ? (slot->targets = malloc(labels * sizeof *slot->targets)) != NULL
                           : (slot->y = malloc(labels * sizeof *slot->y)) != NULL) &&
             (slot->indices = malloc((size_t)rows * sizeof *slot->indices));
    }
    if (!ok) {
        tsl_loader_destroy(ld);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY,
                         "tsl_loader_create: cannot allocate %d batches of %lld samples",
                         ld->nslots, (long long)rows);
    }
    if (pthread_create(&ld->thread, NULL, loader_thread, ld) != 0) {
        tsl_loader_destroy(ld);
        return tsl_error(NULL, TSL_ERR_RESOURCE, "tsl_loader_create: cannot start a thread");
    }
    ld->thread_started = 1;
    *loader = ld;
    return TSL_OK;
}

tsl_status tsl_loader_next(tsl_loader_t ld, tsl_batch *batch)
{
    if (!ld || !batch)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_loader_next: NULL argument");
    pthread_mutex_lock(&ld->lock);
    if (ld->nslots == 1 && !ld->filled) {
        /* The caller gives the previous batch back: read the next into its buffer. */
        ld->requested = 1;
        pthread_cond_broadcast(&ld->changed);
    }
    while (!ld->error && !ld->filled)
        pthread_cond_wait(&ld->changed, &ld->lock);
    const loader_slot *slot = &ld->slots[ld->fill_slot];
    if (!ld->error && slot->status) {
        ld->error = slot->status;
        memcpy(ld->error_message, slot->message, sizeof ld->error_message);
    }
    tsl_status error = ld->error;
    if (error) {
        char message[LOADER_MESSAGE_MAX];
        memcpy(message, ld->error_message, sizeof message);
        pthread_mutex_unlock(&ld->lock);
        return tsl_error(NULL, error, "%s", message);
    }
    batch->x = slot->x;
    batch->y = slot->y;
    batch->targets = slot->targets;
    batch->indices = slot->indices;
    batch->count = slot->count;
    batch->epoch = slot->epoch;
    batch->index = slot->index;
    batch->last = slot->last;
    ld->filled = 0;
    ld->fill_slot = (ld->fill_slot + 1) % ld->nslots;
    pthread_cond_broadcast(&ld->changed);
    pthread_mutex_unlock(&ld->lock);
    return TSL_OK;
}

tsl_status tsl_loader_batches_per_epoch(tsl_loader_t ld, int64_t *batches)
{
    if (!ld || !batches)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_loader_batches_per_epoch: NULL argument");
    *batches = ld->batches_per_epoch;
    return TSL_OK;
}

tsl_status tsl_loader_seek(tsl_loader_t ld, int64_t epoch, int64_t batch)
{
    if (!ld)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_loader_seek: loader is NULL");
    if (epoch < 0 || batch < 0 || batch >= ld->batches_per_epoch)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_loader_seek: epoch %lld, batch %lld outside [0, %lld) batches",
                         (long long)epoch, (long long)batch, (long long)ld->batches_per_epoch);
    stop_thread(ld);
    /* The reader computes an epoch's order when it starts the epoch's first batch. */
    tsl_status st =
        batch ? tsl_dataset_epoch_order(ld->order, ld->info.samples, ld->seed, epoch, ld->shuffle)
              : TSL_OK;
    ld->epoch = epoch;
    ld->next_batch = batch;
    ld->fill_slot = 0;
    ld->filled = 0;
    ld->requested = 0;
    ld->stop = 0;
    ld->error = st;
    if (st)
        snprintf(ld->error_message, sizeof ld->error_message, "%s", tsl_last_error());
    else if (pthread_create(&ld->thread, NULL, loader_thread, ld) != 0)
        return tsl_error(NULL, TSL_ERR_RESOURCE, "tsl_loader_seek: cannot start a thread");
    else
        ld->thread_started = 1;
    return st;
}
