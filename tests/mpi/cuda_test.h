// What the CUDA codelet tests share (tests/mpi/test_cuda*.cpp): the skip where the process has no
// CUDA worker, a runner that executes one codelet on a CUDA worker over host vectors, random
// inputs, poisoned outputs and the error measure.
//
// Each family's CUDA functions are checked against its CPU functions on the same inputs. Where the
// process has no CUDA worker (a build without TESSEL_USE_CUDA, or no GPU) every test skips and
// says why. Each rank runs its own tasks on its own data (no communication).
#ifndef TESSEL_TESTS_MPI_CUDA_TEST_H
#define TESSEL_TESTS_MPI_CUDA_TEST_H

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "codelets/reduce.h"
#include "mpi_test_env.h"

#ifdef TESSEL_USE_CUDA
#include "codelets/cuda_check.h"
#endif

namespace tsltest
{

// Why the CUDA tests cannot run here, or nullptr when they can.
inline const char *no_cuda_reason()
{
#ifndef TESSEL_USE_CUDA
    return "built without CUDA (TESSEL_CUDA off)";
#else
    if (starpu_cuda_worker_get_count() == 0)
        return "no CUDA worker in this process (no GPU, or STARPU_NCUDA=0)";
    return nullptr;
#endif
}

#define SKIP_WITHOUT_CUDA()                                                                        \
    do {                                                                                           \
        if (const char *why = tsltest::no_cuda_reason())                                           \
            GTEST_SKIP() << why;                                                                   \
    } while (0)

// One buffer of a task run by run_on_cuda: a host vector of any element type and its mode.
struct CudaBuf {
    void *data;
    size_t count;
    size_t elem_size;
    enum starpu_data_access_mode mode;
};

template <typename T> CudaBuf cuda_buf(std::vector<T> &v, enum starpu_data_access_mode mode)
{
    return CudaBuf{v.data(), v.size(), sizeof(T), mode};
}

// Exact accumulators travel as the library registers them: vectors of 64-bit words.
inline CudaBuf cuda_buf(std::vector<tsl_acc> &v, enum starpu_data_access_mode mode)
{
    static_assert(sizeof(tsl_acc) % sizeof(int64_t) == 0, "accumulators are 64-bit words");
    return CudaBuf{v.data(), v.size() * (sizeof(tsl_acc) / sizeof(int64_t)), sizeof(int64_t), mode};
}

// Runs `cl` with the packed argument `args` (one STARPU_VALUE, as the library's tasks pass their
// args struct) over `bufs` on a CUDA worker and waits; the results are back in the host vectors
// when it returns.
template <typename A>
void run_on_cuda(struct starpu_codelet &cl, const A &args, std::vector<CudaBuf> bufs)
{
    std::vector<starpu_data_handle_t> handles(bufs.size());
    for (size_t i = 0; i < bufs.size(); i++)
        starpu_vector_data_register(&handles[i], STARPU_MAIN_RAM, (uintptr_t)bufs[i].data,
                                    (uint32_t)bufs[i].count, bufs[i].elem_size);
    // STARPU_TASK_SET_MODE writes the modes of a codelet with a fixed buffer count into the
    // codelet itself: they are put back once the task has run, so that later tasks of the
    // codelet (the model tests') see its own.
    const std::vector<enum starpu_data_access_mode> declared(cl.modes, cl.modes + STARPU_NMAXBUFS);
    struct starpu_task *task = starpu_task_create();
    task->cl = &cl;
    task->where = STARPU_CUDA;
    task->synchronous = 1;
    task->nbuffers = (int)bufs.size();
    for (size_t i = 0; i < bufs.size(); i++) {
        STARPU_TASK_SET_HANDLE(task, handles[i], i);
        STARPU_TASK_SET_MODE(task, bufs[i].mode, i);
    }
    starpu_codelet_pack_args(&task->cl_arg, &task->cl_arg_size, STARPU_VALUE, &args, sizeof args,
                             0);
    task->cl_arg_free = 1;
    EXPECT_EQ(starpu_task_submit(task), 0) << cl.name;
    std::copy(declared.begin(), declared.end(), cl.modes);
    for (starpu_data_handle_t h : handles)
        starpu_data_unregister(h); // brings the results back to the host vectors
}

// n values uniform in [lo, hi), from the run's seed and `salt`.
template <typename T> std::vector<T> random_values(size_t n, uint64_t salt, T lo, T hi)
{
    std::mt19937_64 gen(seed + salt);
    std::uniform_real_distribution<double> dist((double)lo, (double)hi);
    std::vector<T> v(n);
    for (T &x : v)
        x = (T)dist(gen);
    return v;
}

// Whether two vectors hold the same bits.
template <typename T> bool same_bits(const std::vector<T> &a, const std::vector<T> &b)
{
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// n accumulators of garbage bytes: an output a kernel forgets to zero stays garbage.
inline std::vector<tsl_acc> garbage_accs(size_t n)
{
    std::vector<tsl_acc> v(n);
    std::memset(v.data(), 0x5a, n * sizeof(tsl_acc));
    return v;
}

// n poisoned values (NaN): an output element a kernel forgets to write stays NaN.
template <typename T> std::vector<T> poisoned(size_t n)
{
    return std::vector<T>(n, std::numeric_limits<T>::quiet_NaN());
}

template <typename T> int dtype_of();
template <> inline int dtype_of<float>()
{
    return TSL_F32;
}
template <> inline int dtype_of<double>()
{
    return TSL_F64;
}

// The largest |got - want| / (1 + |want|) over the elements; infinity where the sizes differ or
// where one is NaN and the other is not (a poisoned element left unwritten).
template <typename T> double worst_error(const std::vector<T> &got, const std::vector<T> &want)
{
    if (got.size() != want.size())
        return std::numeric_limits<double>::infinity();
    double worst = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double g = (double)got[i], w = (double)want[i];
        if (std::isnan(g) != std::isnan(w))
            return std::numeric_limits<double>::infinity();
        if (std::isnan(w))
            continue;
        worst = std::max(worst, std::fabs(g - w) / (1 + std::fabs(w)));
    }
    return worst;
}

} // namespace tsltest

#endif /* TESSEL_TESTS_MPI_CUDA_TEST_H */
