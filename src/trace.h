/* Task traces (src/trace.c): what tsl_task_submit() and the model executor call. */
#ifndef TESSEL_SRC_TRACE_H
#define TESSEL_SRC_TRACE_H

#include <starpu.h>
#include <stdint.h>

#include "tessel/status.h"

struct tsl_context;

/* While a trace is on: a task of `n` data `descrs` named `name` is being submitted (on every
 * rank, whichever runs it); its place in the submission order, or -1 (no trace, no memory). */
int64_t tsl_trace_submitted(struct tsl_context *ctx, const struct starpu_data_descr *descrs, int n,
                            const char *name);

/* While a trace is on: `task` (built for this rank, not yet submitted; `seq` from
 * tsl_trace_submitted) is recorded when it ends, under `name` and the current labels. Nothing
 * otherwise. */
void tsl_trace_task(struct tsl_context *ctx, struct starpu_task *task, const char *name,
                    int64_t seq);

/* The labels of the tasks submitted from now on: the layer (an op's name) and the pass
 * ("forward", "backward", "loss", "update", ...); NULL for none. Nothing while no trace is on. */
void tsl_trace_label(struct tsl_context *ctx, const char *layer, const char *pass);

/* The current labels (layer, pass) as tsl_trace_label_restore() takes them back. */
void tsl_trace_label_save(struct tsl_context *ctx, int32_t saved[2]);
void tsl_trace_label_restore(struct tsl_context *ctx, const int32_t saved[2]);

/* While a trace is on, after the traced tasks have ended: this rank's tasks' run time per
 * layer label (seconds[i] for layers[i]; a task of a layer not listed counts in *busy only),
 * the run time of all its tasks (*busy, seconds) and their count (*ntasks). */
tsl_status tsl_trace_totals(struct tsl_context *ctx, int32_t n, const char *const *layers,
                            double *seconds, double *busy, int64_t *ntasks);

/* While a trace is on, after the traced tasks have ended: the run time (*busy, seconds) and
 * number (*ntasks) of this rank's tasks that started at or after `from` and before `to`
 * (starpu_timing_now() microseconds). */
tsl_status tsl_trace_busy_between(struct tsl_context *ctx, double from, double to, double *busy,
                                  int64_t *ntasks);

/* Frees the context's trace, if any (tsl_context_destroy()). */
void tsl_trace_destroy(struct tsl_context *ctx);

#endif
