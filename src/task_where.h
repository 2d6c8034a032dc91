/* Where a context's tile tasks may run: the scheduler's choice among every worker that has
 * a function for the codelet, CPU workers only, CUDA workers wherever the codelet can run
 * there, or (the default) CUDA workers wherever the codelet can run there when the process
 * has any and the scheduler's choice otherwise. StarPU fixes its workers when it starts, once per
 * process; this choice, made per task in tsl_task_submit(), lets one process compare the CUDA
 * codelets with the CPU ones on whole models (tests/mpi/test_cuda_model.cpp) and time a step with
 * every task that can on the GPU.
 *
 * The default follows the GPU measurements of bench/RESULTS.md: a model's tiles are cut for
 * the CUDA workers where there are any (one sample tile per GPU), and a task of such a tile
 * that the scheduler gives a CPU worker holds up the step (dmdas with 15 CPU workers beside an
 * H200, calibrated: 3x slower than the GPU alone).
 *
 * The environment variable TSL_TASK_WHERE (any, cpu, cuda or auto) sets it when a context is
 * created or attached; tsl_context_set_task_where() changes it for the tasks submitted after
 * it. Usable from C and C++ (the tests). Never installed. */
#ifndef TESSEL_SRC_TASK_WHERE_H
#define TESSEL_SRC_TASK_WHERE_H

#include "tessel/context.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tsl_task_where {
    /* any worker with a function for the codelet that accepts the task (StarPU decides) */
    TSL_TASK_WHERE_ANY = 0,
    /* CPU workers only */
    TSL_TASK_WHERE_CPU = 1,
    /* CUDA workers for every task whose codelet has a CUDA function that accepts it (its
     * can_execute, asked for the first CUDA worker); CPU workers for the others, and for
     * every task where the process has no CUDA worker */
    TSL_TASK_WHERE_CUDA = 2,
    /* the default: TSL_TASK_WHERE_CUDA where the process has a CUDA worker, else
     * TSL_TASK_WHERE_ANY */
    TSL_TASK_WHERE_AUTO = 3,
} tsl_task_where;

/* Tasks submitted after this call run where `where` says; tasks already submitted keep their
 * choice. Not collective, but every rank should make the same choice. TSL_ERR_INVALID_ARG on
 * a NULL context or an unknown value. */
tsl_status tsl_context_set_task_where(tsl_context_t ctx, tsl_task_where where);

/* The current choice (TSL_TASK_WHERE_AUTO for a NULL context). */
tsl_task_where tsl_context_task_where(tsl_context_t ctx);

/* "any", "cpu", "cuda" or "auto" to the value; TSL_ERR_INVALID_ARG (and *out unchanged) otherwise.
 */
tsl_status tsl_task_where_parse(const char *text, tsl_task_where *out);

#ifdef __cplusplus
}
#endif

#endif
