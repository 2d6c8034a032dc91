// Shared state of the distributed tests: one tessel context for the whole process.
#ifndef TESSEL_TESTS_MPI_TEST_ENV_H
#define TESSEL_TESTS_MPI_TEST_ENV_H

#include <cstdint>
#include <mpi.h>

#include "tessel/starpu.h"
#include "tessel/tessel.h"

namespace tsltest
{
extern tsl_context_t ctx;
extern int rank;
extern int size;
extern uint64_t seed; // the run's seed, the same on every rank, printed by rank 0

// True on every rank iff `ok` holds on every rank (collective).
bool all_ranks(bool ok);

// Owner maps for tests: tiles dealt round the ranks in row-major order, and contiguous runs
// in reverse order (the last tiles on rank 0), so owners are unrelated to position.
int32_t round_robin(const int32_t *tile, int32_t ndim, const tsl_tile_grid *grid, int32_t nranks,
                    void *user);
int32_t reversed(const int32_t *tile, int32_t ndim, const tsl_tile_grid *grid, int32_t nranks,
                 void *user);
} // namespace tsltest

#endif
