/* The critical path of a task graph given as StarPU builds it: tasks in submission order, each
 * with the data it reads and writes; a task waits for the last writer of every datum it
 * accesses, and a writer also for the readers since that write (sequential consistency, which
 * StarPU applies to every handle; StarPU-MPI's messages are not tasks and cost nothing here).
 * Data are named by 64-bit ids (StarPU-MPI tags, unique within a context), kept in an
 * open-addressing table. */
#include <stdlib.h>
#include <string.h>

#include "critical_path.h"

typedef struct datum {
    int64_t id;
    double written; /* when its last writer ended */
    double read;    /* when the last of the readers since then ended */
    int used;
} datum;

static uint64_t mix(int64_t id)
{
    uint64_t x = (uint64_t)id;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static datum *find(datum *table, uint64_t mask, int64_t id)
{
    for (uint64_t h = mix(id) & mask;; h = (h + 1) & mask)
        if (!table[h].used || table[h].id == id)
            return &table[h];
}

int tsl_critical_path(int64_t ntasks, const int64_t *first, const int64_t *ids,
                      const uint8_t *access, const double *duration, double *critical,
                      double *total)
{
    int64_t naccess = ntasks > 0 ? first[ntasks] : 0;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)naccess + 16)
        size *= 2;
    datum *table = calloc(size, sizeof *table);
    if (!table)
        return -1;
    double longest = 0, sum = 0;
    for (int64_t t = 0; t < ntasks; t++) {
        double start = 0;
        for (int64_t a = first[t]; a < first[t + 1]; a++) {
            datum *d = find(table, size - 1, ids[a]);
            if (!d->used)
                continue;
            double ready = d->written;
            if ((access[a] & TSL_ACCESS_W) && d->read > ready)
                ready = d->read;
            if (ready > start)
                start = ready;
        }
        double end = start + (duration[t] > 0 ? duration[t] : 0);
        sum += duration[t] > 0 ? duration[t] : 0;
        if (end > longest)
            longest = end;
        for (int64_t a = first[t]; a < first[t + 1]; a++) {
            datum *d = find(table, size - 1, ids[a]);
            if (!d->used) {
                d->used = 1;
                d->id = ids[a];
                d->written = d->read = 0;
            }
            if (access[a] & TSL_ACCESS_W) {
                d->written = end;
                d->read = 0;
            } else if (end > d->read) {
                d->read = end;
            }
        }
    }
    free(table);
    *critical = longest;
    *total = sum;
    return 0;
}
