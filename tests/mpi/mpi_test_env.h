// Shared state of the distributed tests: one tessel context for the whole process.
#ifndef TESSEL_TESTS_MPI_TEST_ENV_H
#define TESSEL_TESTS_MPI_TEST_ENV_H

#include <cstdint>
#include <initializer_list>
#include <vector>
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

// A tensor of `dims` cut by `splits` (missing entries 1), zero-filled (fails the test on error).
tsl_tensor_t make_tensor(tsl_dtype dt, const std::vector<int64_t> &dims,
                         const std::vector<int32_t> &splits, const tsl_owner_map &owners,
                         tsl_layout layout = TSL_LAYOUT_PLAIN);

// Each f32 tensor gathered on rank 0 (NaN-filled vectors elsewhere).
std::vector<std::vector<float>> gather_all(std::initializer_list<tsl_tensor_t> tensors);

// Largest |got - ref| / (1 + |ref|) over two arrays of the same size.
double max_rel_diff(const std::vector<float> &got, const std::vector<float> &ref);

// Largest |got - ref| over max(1, largest |ref|): the relative error of a whole array, for
// results that are long sums whose single entries may cancel to near zero.
double max_norm_rel_diff(const std::vector<float> &got, const std::vector<float> &ref);

// Owner maps for tests: tiles dealt round the ranks in row-major order, and contiguous runs
// in reverse order (the last tiles on rank 0), so owners are unrelated to position.
int32_t round_robin(const int32_t *tile, int32_t ndim, const tsl_tile_grid *grid, int32_t nranks,
                    void *user);
int32_t reversed(const int32_t *tile, int32_t ndim, const tsl_tile_grid *grid, int32_t nranks,
                 void *user);
} // namespace tsltest

#endif
