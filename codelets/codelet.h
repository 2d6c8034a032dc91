/* What every codelet family shares: the check that aborts a codelet, the rank it prints,
 * element access in double, and TSL_CODELET, which defines a codelet and its history-based
 * perf model from one name.
 *
 * A family lives in codelets/<family>.h (its args struct, pure kernels and codelets) and
 * codelets/<family>.c (CPU functions, oneDNN / OpenBLAS / plain C), later <family>.cu (CUDA
 * functions). Codelets know nothing of ranks, graphs or plans and include nothing from src/. */
#ifndef TESSEL_CODELETS_CODELET_H
#define TESSEL_CODELETS_CODELET_H

#include <starpu.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "hd.h"
#include "tessel/tensor.h"

/* ---- checks ----
 * A codelet cannot return an error to StarPU, so a broken invariant aborts through this one
 * hook, which prints file, line and MPI rank. */

#ifdef __cplusplus
extern "C" {
#endif

/* MPI rank of this process, set by the context (-1 outside a context). */
extern int tsl_codelet_rank;

#ifdef __cplusplus
}
#endif

/* Print file, line, rank, what failed and why, and abort: the one path every check takes
 * (TSL_CODELET_CHECK here, the CUDA, cuDNN and cuBLAS checks of cuda_check.h). */
#define TSL_CODELET_FAIL(what, why)                                                                \
    do {                                                                                           \
        fprintf(stderr, "tessel[%d] codelet failure at %s:%d: %s (%s)\n", tsl_codelet_rank,        \
                __FILE__, __LINE__, (what), (why));                                                \
        abort();                                                                                   \
    } while (0)

#define TSL_CODELET_CHECK(cond, msg)                                                               \
    do {                                                                                           \
        if (!(cond))                                                                               \
            TSL_CODELET_FAIL((msg), #cond);                                                        \
    } while (0)

/* ---- element-wise kernels for the CPU's vector width ----
 * TSL_VECTOR_KERNEL on a function makes GCC build it three times, for AVX-512, AVX2 and
 * baseline x86-64, and pick one when the library loads (function multiversioning): the
 * library still runs on any x86-64, and its memory-bound loops use the widest vectors the
 * machine has. Put it on the function that holds (or inlines) the loop. The kernels' sources
 * are compiled with -ffp-contract=off (CMakeLists.txt), so no build fuses a multiply and an
 * add: every clone computes each element with the same IEEE operations and gives the same
 * bits; vectorising changes no sum's order (GCC reorders no floating-point reduction). */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__x86_64__) &&     \
    defined(__linux__)
#define TSL_VECTOR_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TSL_VECTOR_KERNEL
#endif

/* ---- element access for kernels that compute in double whatever the tile's float dtype ---- */

/* Element i of an f32 or f64 buffer, as a double (CPU and CUDA code). */
static inline TSL_HD double tsl_load(int dtype, const void *p, int64_t i)
{
    return dtype == TSL_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

/* Store v into element i of an f32 (rounded) or f64 buffer. */
static inline TSL_HD void tsl_store(int dtype, void *p, int64_t i, double v)
{
    if (dtype == TSL_F32)
        ((float *)p)[i] = (float)v;
    else
        ((double *)p)[i] = v;
}

/* ---- perf-model footprints ----
 * StarPU keeps one history per (symbol, footprint). By default the footprint hashes the sizes
 * of the task's buffers only, so two variants of one tile size (ReLU and tanh, SGD and Adam)
 * would share a history. A family's variant function hashes the fields of its args struct
 * that change the work (kind, dtype, layout, ...) into the data footprint; fields that do not
 * (a seed, a learning rate, a step, an offset) stay out, or every task would be new. */

/* h with v hashed in (both halves of a 64-bit value). */
static inline uint32_t tsl_hash_i64(uint32_t h, int64_t v)
{
    h = starpu_hash_crc32c_be((uint32_t)(uint64_t)v, h);
    return starpu_hash_crc32c_be((uint32_t)((uint64_t)v >> 32), h);
}

/* h with the n values of v hashed in, in order. */
static inline uint32_t tsl_hash_i64s(uint32_t h, const int64_t *v, int n)
{
    for (int i = 0; i < n; i++)
        h = tsl_hash_i64(h, v[i]);
    return h;
}

/* ---- one codelet and its perf model ----
 * TSL_CODELET(var, cl_name, cpu_fn, cuda_fn, variant_fn, buffers...) defines
 * `struct starpu_codelet var` named `cl_name` with CPU function cpu_fn, and its history-based
 * perf model `var_model`, whose symbol is `cl_name` (StarPU keys calibration files on it: keep it
 * stable). variant_fn (uint32_t (*)(struct starpu_task *), NULL for the data footprint alone)
 * gives the footprint. The CUDA slot, cuda_fn with STARPU_CUDA_ASYNC (the function launches on
 * starpu_cuda_get_local_stream()), exists only when TESSEL_USE_CUDA is defined, so a family
 * adds its CUDA function by naming it here; pass NULL until it has one. The remaining
 * arguments are the buffer fields: `.nbuffers = 2, .modes = {STARPU_R, STARPU_W}`, or
 * `.nbuffers = STARPU_VARIABLE_NBUFFERS` (modes given with each task). */
#ifdef TESSEL_USE_CUDA
#define TSL_CODELET_CUDA_SLOT(cuda_fn) .cuda_funcs = {cuda_fn}, .cuda_flags = {STARPU_CUDA_ASYNC},
#else
#define TSL_CODELET_CUDA_SLOT(cuda_fn)
#endif

/* clang-format off */
#define TSL_CODELET(var, cl_name, cpu_fn, cuda_fn, variant_fn, ...)                                \
    static struct starpu_perfmodel var##_model = {                                                 \
        .type = STARPU_HISTORY_BASED,                                                              \
        .symbol = cl_name,                                                                         \
        .footprint = variant_fn,                                                                   \
    };                                                                                             \
    struct starpu_codelet var = {                                                                  \
        .cpu_funcs = {cpu_fn},                                                                     \
        .cpu_funcs_name = {#cpu_fn},                                                               \
        TSL_CODELET_CUDA_SLOT(cuda_fn)                                                             \
        .model = &var##_model,                                                                     \
        .name = cl_name,                                                                           \
        __VA_ARGS__}
/* clang-format on */

#endif /* TESSEL_CODELETS_CODELET_H */
