/* Timing helpers shared by the benchmarks. */
#ifndef TESSEL_BENCH_UTIL_H
#define TESSEL_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static inline int bench_compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of n timings (sorts them). */
static inline double bench_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_compare);
    return t[n / 2];
}

/* Exit with tessel's message when a tessel call fails. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        tsl_status st_ = (call);                                                                   \
        if (st_) {                                                                                 \
            fprintf(stderr, "%s: %s\n", #call, tsl_last_error());                                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* The same, for MPI programs: every rank stops (needs mpi.h). */
#define CHECK_ALL(call) /* every rank stops */                                                     \
    do {                                                                                           \
        tsl_status st_ = (call);                                                                   \
        if (st_) {                                                                                 \
            fprintf(stderr, "%s: %s\n", #call, tsl_last_error());                                  \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

#endif /* TESSEL_BENCH_UTIL_H */
