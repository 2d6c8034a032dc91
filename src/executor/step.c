/* Training and evaluation steps: a batch in, forward, loss, backward, the optimizer's update;
 * evaluation and the forward alone. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "executor/executor.h"
#include "trace.h"

/* Where a batch comes from: x and labels on rank 0 (scattered), or a dataset and sample
 * indices (every rank reads its own tiles). */
typedef struct batch_source {
    const float *x;
    const int64_t *labels;
    const float *targets; /* (the host arrays of a loss on float targets) */
    tsl_dataset_t dataset;
    const int64_t *indices;
    tsl_tensor_t tx, tlabels; /* or tiled tensors the caller owns (tensors set) */
    const tsl_tensor_t *txs;  /* every input's, in the graph's order (txs[0] is tx), or NULL */
    int32_t ntx;
    int tensors;
    int read;              /* from the dataset */
    int take_ahead;        /* a batch the read-ahead holds is taken from it */
    const int64_t *next;   /* a training step's read-ahead: the next step's indices, or NULL */
    tsl_read_group *reads; /* set by load_batch(): where this batch's reads count */
} batch_source;

/* Waits for the read-ahead's reads and forgets it (its spare tiles stay for the next). */
static void drop_read_ahead(struct tsl_model *m)
{
    if (!m->ahead_indices)
        return;
    tsl_read_group *group = &m->ahead_reads[m->ahead_group];
    tsl_read_group_wait(m->ctx, group);
    group->status = TSL_OK; /* the failures of samples no step used */
    free(m->ahead_indices);
    m->ahead_indices = NULL;
}

/* Whether the read-ahead holds this batch, agreed by every rank (each compares its own
 * dataset and indices). */
static tsl_status read_ahead_holds(struct tsl_model *m, int64_t batch, const batch_source *src,
                                   int *holds)
{
    *holds = 0;
    if (!m->ahead_indices) /* (the same on every rank: read-aheads are collective) */
        return TSL_OK;
    int mine = m->ahead_dataset == src->dataset && m->ahead_batch == batch &&
               memcmp(m->ahead_indices, src->indices, (size_t)batch * sizeof *src->indices) == 0;
    if (MPI_Allreduce(&mine, holds, 1, MPI_INT, MPI_MIN, m->ctx->ctl_comm) != MPI_SUCCESS)
        return tsl_error(m->ctx, TSL_ERR_RUNTIME, "reading ahead: MPI_Allreduce failed");
    return TSL_OK;
}

/* The name of input k of the model's graph (a dataset's further input of that name). */
static const char *input_name(const struct tsl_model *m, int32_t k)
{
    return m->g->ops[m->g->values[tsl_graph_input_value(m->g, k)].producer].name;
}

/* A tensor for further input k of a batch, tiled and ordered as the instances make it. */
static tsl_status further_input_tensor(struct tsl_model *m, int64_t batch, int32_t k,
                                       tsl_tensor_t *t)
{
    int32_t v = tsl_graph_input_value(m->g, k);
    tsl_status st = tsl_exec_batch_tensor(m, batch, tsl_exec_value_stage(m, v),
                                          &m->g->values[v].shape, 1, TSL_F32, t);
    if (!st && tsl_exec_pipelined(m))
        tsl_tensor_order_by_samples(*t);
    return st;
}

/* Starts reading `next` (batch samples of src->dataset) into the spare tiles. */
static tsl_status read_ahead(struct tsl_model *m, int64_t batch, const batch_source *src)
{
    drop_read_ahead(m);
    tsl_status st = TSL_OK;
    const int32_t ninputs = tsl_graph_input_count(m->g);
    if (m->ahead_x && m->ahead_batch != batch) {
        tsl_tensor_destroy(m->ahead_x);
        tsl_tensor_destroy(m->ahead_labels);
        m->ahead_x = m->ahead_labels = NULL;
        for (int32_t k = 1; k < ninputs; k++) {
            tsl_tensor_destroy(m->ahead_more[k]);
            m->ahead_more[k] = NULL;
        }
    }
    if (!m->ahead_x && (st = tsl_exec_input_tensors(m, batch, &m->ahead_x, &m->ahead_labels)))
        return st;
    for (int32_t k = 1; k < ninputs && !st; k++) /* (made where the instance makes them) */
        if (!m->ahead_more[k])
            st = further_input_tensor(m, batch, k, &m->ahead_more[k]);
    if (st)
        return st;
    m->ahead_batch = batch;
    m->ahead_indices = malloc((size_t)batch * sizeof *m->ahead_indices);
    if (!m->ahead_indices)
        st = tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "reading ahead: out of memory");
    st = tsl_context_agree_all(m->ctx, st);
    if (st) {
        free(m->ahead_indices);
        m->ahead_indices = NULL;
        return st;
    }
    memcpy(m->ahead_indices, src->next, (size_t)batch * sizeof *src->next);
    m->ahead_dataset = src->dataset;
    tsl_trace_label(m->ctx, NULL, "data (read ahead)");
    st = tsl_read_samples_grouped(m->ahead_x, m->ahead_labels, src->dataset, src->next,
                                  &m->ahead_reads[m->ahead_group]);
    for (int32_t k = 1; k < ninputs && !st; k++)
        st = tsl_read_input_samples_grouped(m->ahead_more[k], src->dataset, input_name(m, k),
                                            src->next, &m->ahead_reads[m->ahead_group]);
    if (st) { /* refused before any task (collective checks): nothing is pending */
        free(m->ahead_indices);
        m->ahead_indices = NULL;
    }
    return st;
}

/* The batch into the input (and the labels when asked). A dataset batch that the read-ahead
 * holds is taken from it where src->take_ahead (its tiles swapped with the instance's); else it
 * is read. Then the read-ahead of src->next starts. */
static tsl_status load_batch(struct tsl_model *m, instance *in, int64_t batch, batch_source *src,
                             int with_labels)
{
    if (src->tensors) { /* tile tasks from the caller's tiling into the model's */
        tsl_status st = tsl_tensor_redistribute(in->act[m->g->input], src->tx);
        for (int32_t k = 1; k < src->ntx && !st; k++)
            st = tsl_tensor_redistribute(in->act[tsl_graph_input_value(m->g, k)], src->txs[k]);
        if (!st && with_labels)
            st = tsl_tensor_redistribute(in->labels, src->tlabels);
        return st;
    }
    if (!src->read) {
        tsl_status st = tsl_tensor_scatter(in->act[m->g->input], 0, src->x);
        if (!st && with_labels)
            st = m->targets ? tsl_tensor_scatter(in->labels, 0, src->targets)
                            : tsl_tensor_scatter_labels(in->labels, 0, src->labels);
        return st;
    }
    int holds = 0;
    tsl_status st = src->take_ahead ? read_ahead_holds(m, batch, src, &holds) : TSL_OK;
    if (st)
        return st;
    if (holds) {
        tsl_tensor_t x = in->act[m->g->input], labels = in->labels;
        in->act[m->g->input] = m->ahead_x;
        in->labels = m->ahead_labels;
        m->ahead_x = x;
        m->ahead_labels = labels;
        for (int32_t k = 1; k < tsl_graph_input_count(m->g); k++) {
            int32_t v = tsl_graph_input_value(m->g, k);
            tsl_tensor_t t = in->act[v];
            in->act[v] = m->ahead_more[k];
            m->ahead_more[k] = t;
        }
        src->reads = &m->ahead_reads[m->ahead_group];
        m->ahead_group ^= 1;
        free(m->ahead_indices);
        m->ahead_indices = NULL;
    } else {
        src->reads = &m->ctx->reads;
        st = tsl_tensors_read_samples(in->act[m->g->input], with_labels ? in->labels : NULL,
                                      src->dataset, src->indices);
        for (int32_t k = 1; k < tsl_graph_input_count(m->g) && !st; k++)
            st = tsl_read_input_samples_grouped(in->act[tsl_graph_input_value(m->g, k)],
                                                src->dataset, input_name(m, k), src->indices,
                                                &m->ctx->reads);
    }
    if (!st && src->next)
        st = read_ahead(m, batch, src);
    return st;
}

/* Term t's target value on the tile grid and layout of x, the value it compares: the value's
 * own tensor when they match, else a copy moved there (made once per instance and term). */
static tsl_status against_of(struct tsl_model *m, instance *in, int32_t t, tsl_tensor_t x,
                             tsl_tensor_t *out)
{
    tsl_tensor_t a = in->act[m->loss[t].against - 1];
    *out = a;
    if (!memcmp(a->grid.splits, x->grid.splits, sizeof a->grid.splits) && a->layout == x->layout)
        return TSL_OK;
    tsl_tensor_t *slot = &in->against[t];
    if (*slot && (memcmp((*slot)->grid.splits, x->grid.splits, sizeof x->grid.splits) ||
                  (*slot)->layout != x->layout)) { /* (the loss changed since) */
        tsl_tensor_destroy(*slot);
        *slot = NULL;
    }
    tsl_status st = *slot ? TSL_OK
                          : tsl_tensor_create_transient(slot, m->ctx, TSL_F32, &x->shape, &x->grid,
                                                        &x->owners, x->layout);
    if (!st)
        st = tsl_tensor_redistribute(*slot, a);
    *out = *slot;
    return st;
}

/* The model's loss (tsl_model_set_loss): each term of the value it reads (the output, or
 * another value) against the batch's labels or targets, or against another value taken as a
 * constant; with `with_grad`, its gradient, scaled by the term's weight, lands in the value's
 * gradient: written there by the value's first term, else made in scratch[v] and added, in
 * term order. The backward then adds the gradients of the ops reading the value. */
/* Where a term's gradient of value v goes: grad[v] (*added 0) or, when grad[v] holds one
 * already, scratch[v] (*added 1: to be added). NULL without a gradient. */
static tsl_status term_grad(struct tsl_model *m, instance *in, int with_grad, int32_t v,
                            tsl_tensor_t *grad, int *added)
{
    *grad = NULL;
    *added = with_grad && in->written[v];
    if (!with_grad)
        return TSL_OK;
    if (!*added)
        *grad = in->grad[v];
    return *added ? tsl_exec_scratch_of(m, in, v, grad) : TSL_OK;
}

/* The term's gradient in grad, scaled by its weight, into value v's. */
static tsl_status term_grad_done(instance *in, int32_t v, tsl_tensor_t grad, int added, double w)
{
    tsl_status st = TSL_OK;
    if (grad && w != 1.0)
        st = tsl_tensor_scale(grad, w);
    if (!st && grad && added)
        st = tsl_tensor_axpy(in->grad[v], 1.0, grad);
    if (!st && grad)
        in->written[v] = 1;
    return st;
}

/* A difference or similarity term of values v and a: its loss, and its gradients into both. */
static tsl_status two_value_term(struct tsl_model *m, instance *in, int with_grad,
                                 tsl_model_loss_kind kind, int32_t v, int32_t a, double w,
                                 double *l)
{
    tsl_tensor_t gv, ga;
    int addv, adda;
    tsl_status st = term_grad(m, in, with_grad, v, &gv, &addv);
    if (!st)
        st = term_grad(m, in, with_grad, a, &ga, &adda);
    if (!st)
        st = kind == TSL_MODEL_LOSS_SIMILARITY
                 ? tsl_loss_similarity(in->act[v], in->act[a], gv, ga, l)
                 : tsl_loss_difference(in->act[v], in->act[a], gv, ga, l);
    if (!st)
        st = term_grad_done(in, v, gv, addv, w);
    return st ? st : term_grad_done(in, a, ga, adda, w);
}

static tsl_status model_loss(struct tsl_model *m, instance *in, int with_grad, double *loss)
{
    double total = 0;
    tsl_status st = TSL_OK;
    for (int32_t t = 0; t < m->nloss && !st; t++) {
        const tsl_loss_term *term = &m->loss[t];
        const int32_t v = tsl_loss_term_value(m->g, term);
        double l = 0, w = term->weight;
        if (tsl_model_loss_of_two_values(term->kind)) {
            st = two_value_term(m, in, with_grad, term->kind, v, term->against - 1, w, &l);
            total += w * l;
            continue;
        }
        tsl_tensor_t x = in->act[v], target = NULL, grad = NULL;
        int added = 0;
        st = term_grad(m, in, with_grad, v, &grad, &added);
        if (!st && term->against)
            st = against_of(m, in, t, x, &target);
        else if (!st)
            target = in->labels;
        if (!st)
            switch (term->kind) {
            case TSL_MODEL_LOSS_DICE:
                st = tsl_loss_dice(x, target, grad, 1.0, &l);
                break;
            case TSL_MODEL_LOSS_MSE:
                st = tsl_loss_mse(x, target, grad, &l);
                break;
            case TSL_MODEL_LOSS_L1:
                st = tsl_loss_l1(x, target, grad, &l);
                break;
            default:
                st = tsl_loss_cross_entropy(x, target, grad, &l);
                break;
            }
        if (!st)
            st = term_grad_done(in, v, grad, added, w);
        total += w * l;
    }
    if (!st)
        *loss = total;
    return st;
}

/* Argmax hits of the output against the labels: a task per output tile where it lives and an
 * exact sum (nothing is gathered). */
static tsl_status count_correct(struct tsl_model *m, instance *in, int64_t *correct)
{
    int64_t hits = 0;
    tsl_status st = m->targets ? TSL_OK /* no classes: 0 */
                               : tsl_argmax_hits(in->act[m->g->output], in->labels, &hits);
    if (!st && correct)
        *correct = hits;
    return st;
}

/* The caller's tensors against the model: its context, (batch, sample shape) f32 inputs,
 * (batch, label shape) labels of the model's label dtype, (batch, output shape) f32 outputs.
 * The same on every rank (the tensors are collective objects). */
static tsl_status check_tensor(struct tsl_model *m, tsl_tensor_t t, const char *what, int64_t batch,
                               const tsl_shape *sample, tsl_dtype dtype, const char *fn)
{
    tsl_status st = tsl_tensor_check(t, fn);
    if (st)
        return tsl_error(m->ctx, st, "%s: %s: %s", fn, what, tsl_last_error());
    if (t->ctx != m->ctx)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: %s belongs to another context", fn,
                         what);
    int fits = t->shape.ndim == sample->ndim + 1 && t->shape.dims[0] == batch;
    for (int32_t d = 0; fits && d < sample->ndim; d++)
        fits = t->shape.dims[d + 1] == sample->dims[d];
    if (!fits)
        return tsl_error(m->ctx, TSL_ERR_SHAPE,
                         "%s: %s must be (batch %lld, the model's %d-axis shape), not %d axes of "
                         "%lld samples",
                         fn, what, (long long)batch, (int)sample->ndim, (int)t->shape.ndim,
                         (long long)t->shape.dims[0]);
    if (t->dtype != dtype)
        return tsl_error(m->ctx, TSL_ERR_DTYPE, "%s: %s is %s, the model takes %s", fn, what,
                         tsl_dtype_name(t->dtype), tsl_dtype_name(dtype));
    return TSL_OK;
}

/* The label shape of the model: none per sample, or the spatial shape of a (classes,
 * spatial...) output. */
static tsl_shape label_shape(const struct tsl_model *m)
{
    tsl_shape out = m->g->values[m->g->output].shape, ls;
    if (m->targets) /* float targets: the output's shape */
        return out;
    memset(&ls, 0, sizeof ls);
    ls.ndim = out.ndim - 1;
    for (int d = 1; d < out.ndim; d++)
        ls.dims[d - 1] = out.dims[d];
    return ls;
}

static tsl_status check_tensors(struct tsl_model *m, int64_t batch, const batch_source *src,
                                int need_labels, const char *fn)
{
    tsl_shape ls = label_shape(m);
    tsl_status st = TSL_OK;
    if (src->txs) {
        int32_t n = tsl_graph_input_count(m->g);
        if (src->ntx != n)
            return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                             "%s: %d input tensors for a model of %d input%s", fn, (int)src->ntx,
                             (int)n, n == 1 ? "" : "s");
        for (int32_t k = 0; k < n && !st; k++) {
            int32_t v = tsl_graph_input_value(m->g, k);
            char what[TSL_GRAPH_NAME_MAX + 32];
            snprintf(what, sizeof what, "xs[%d] (input '%s')", (int)k,
                     m->g->ops[m->g->values[v].producer].name);
            st = check_tensor(m, src->txs[k], what, batch, &m->g->values[v].shape, TSL_F32, fn);
        }
    } else {
        st = check_tensor(m, src->tx, "x", batch, &m->g->values[m->g->input].shape, TSL_F32, fn);
    }
    if (!st && need_labels)
        st = check_tensor(m, src->tlabels, "labels", batch, &ls, tsl_model_label_dtype(m), fn);
    return st;
}

/* The dataset gives every further input of the model, of its shape (every rank agrees). */
static tsl_status dataset_inputs_fit(struct tsl_model *m, tsl_dataset_t dataset, const char *fn)
{
    tsl_status st = TSL_OK;
    for (int32_t k = 1; k < tsl_graph_input_count(m->g) && !st; k++) {
        const tsl_shape *want = &m->g->values[tsl_graph_input_value(m->g, k)].shape;
        tsl_shape got;
        if ((st = tsl_dataset_input_shape(dataset, input_name(m, k), &got))) {
            st = tsl_error(m->ctx, st, "%s: the model's input '%s': %s", fn, input_name(m, k),
                           tsl_last_error());
            break;
        }
        int fits = got.ndim == want->ndim;
        for (int32_t d = 0; fits && d < got.ndim; d++)
            fits = got.dims[d] == want->dims[d];
        if (!fits)
            st = tsl_error(m->ctx, TSL_ERR_SHAPE,
                           "%s: the dataset's input '%s' has %d-axis samples (%lld first), the "
                           "model's input of that name %d axes (%lld first)",
                           fn, input_name(m, k), (int)got.ndim, (long long)got.dims[0],
                           (int)want->ndim, (long long)want->dims[0]);
    }
    return tsl_context_agree_all(m->ctx, st);
}

static tsl_status check_batch(struct tsl_model *m, int64_t batch, const batch_source *src,
                              int need_labels, const char *fn)
{
    if (!m)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: model is NULL", fn);
    int32_t inputs = tsl_graph_input_count(m->g);
    if (inputs > 1 && !src->txs && !src->read) /* (datasets give each input by its name) */
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                         "%s: the model has %d inputs, and this call feeds one: pass them all to "
                         "tsl_model_train_step_inputs(), tsl_model_evaluate_inputs() or "
                         "tsl_model_forward_values_inputs(), or read them from a dataset",
                         fn, (int)inputs);
    if (src->tensors) /* (the batch is x's) */
        return check_tensors(m, batch, src, need_labels, fn);
    tsl_status st = TSL_OK;
    const char *family = m->targets ? "float targets" : "class labels";
    if (batch < 1)
        st = tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: batch %lld < 1", fn, (long long)batch);
    else if (src->read) /* checked by every rank in tsl_tensors_read_samples(); the further
                           inputs here, before any read is submitted */
        return inputs > 1 ? dataset_inputs_fit(m, src->dataset, fn) : TSL_OK;
    else if (need_labels && (src->targets != NULL) != (m->targets != 0))
        st = tsl_error(
            m->ctx, TSL_ERR_INVALID_ARG, "%s: the model's loss (%s) takes %s: use %s", fn,
            tsl_model_loss_name(m->loss[tsl_loss_batch_term(m->nloss, m->loss)].kind), family,
            m->targets ? "tsl_model_train_step_targets() or tsl_model_evaluate_targets()"
                       : "the steps that take int64 labels");
    else if (m->ctx->rank == 0 && (!src->x || (need_labels && !src->labels && !src->targets)))
        st = tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: the batch data is NULL on rank 0", fn);
    return tsl_context_agree(m->ctx, 0, st);
}

/* Forward, loss and backward: gradients land in the parameters' grad tensors. */
static tsl_status gradients(struct tsl_model *m, int64_t batch, batch_source *src, double *loss,
                            instance **used)
{
    instance *in;
    tsl_status st = tsl_exec_instance_for(m, batch, &in);
    tsl_trace_label(m->ctx, NULL, "data");
    if (st || (st = load_batch(m, in, batch, src, 1)) || (st = tsl_exec_forward(m, in, 1)))
        return st;
    memset(in->written, 0, (size_t)m->g->nvalues);
    double l = 0;
    tsl_trace_label(
        m->ctx,
        m->nloss == 1 && m->loss[0].kind == TSL_MODEL_LOSS_CROSS_ENTROPY ? "cross_entropy" : "loss",
        "loss");
    st = model_loss(m, in, 1, &l);
    if (st && src->read) { /* a sample that could not be read poisoned its labels: say so */
        tsl_status unread = tsl_read_group_check(m->ctx, src->reads);
        if (unread)
            return unread;
    }
    in->written[m->g->output] = 1; /* (its first term wrote it) */
    for (int32_t i = m->g->nops - 1; i >= 0 && !st; i--) {
        const tsl_mgrit_segment *seg = tsl_mgrit_segment_ending(m, i);
        if (seg) { /* the segment's adjoint by multigrid in time; then the op before it */
            st = tsl_mgrit_backward(m, in, seg);
            i = seg->s.first_op;
            continue;
        }
        char label[48];
        tsl_trace_label(m->ctx, tsl_exec_op_label(m, i, label, sizeof label), "backward");
        /* a later pipeline stage's first layer with weights: its input gradient first */
        m->ctx->param_grad_priority = m->defers[i] ? TSL_DEFERRED_PRIORITY : 0;
        st = tsl_exec_op_backward(m, in, i); /* a bucket reduces once all its members are in */
        m->ctx->param_grad_priority = 0;
        tsl_tensor_release(in->pidx[i]);
        tsl_tensor_release(in->mask[i]);
        if (!st && !m->fused[i]) {
            int32_t out =
                m->relu_of[i] >= 0 ? m->g->ops[m->relu_of[i]].output : m->g->ops[i].output;
            tsl_tensor_release(in->grad[out]);
            tsl_tensor_release(in->scratch[out]);
            if (out != m->g->output)
                tsl_tensor_release(in->act[out]);
        }
    }
    tsl_trace_label(m->ctx, NULL, "gradient reduction");
    for (int32_t b = 0; b < m->nbuckets; b++) { /* members without partials: left alone */
        tsl_status fin = tsl_bucket_finish(m->buckets[b]);
        st = st ? st : fin;
    }
    tsl_mgrit_finish(m); /* (collective whatever st: every rank submitted the same sums) */
    if (!st)
        st = tsl_exec_add_shared_grads(m);
    if (!st && loss)
        *loss = l;
    *used = in;
    return st;
}

tsl_status tsl_model_gradients(tsl_model_t m, int64_t batch, const float *x, const int64_t *labels,
                               double *loss)
{
    batch_source src = {.x = x, .labels = labels};
    tsl_status st = check_batch(m, batch, &src, 1, "tsl_model_gradients");
    instance *in;
    return st ? st : gradients(m, batch, &src, loss, &in);
}

tsl_status tsl_model_gradients_targets(tsl_model_t m, int64_t batch, const float *x,
                                       const float *targets, double *loss)
{
    batch_source src = {.x = x, .targets = targets};
    tsl_status st = check_batch(m, batch, &src, 1, "tsl_model_gradients_targets");
    instance *in;
    return st ? st : gradients(m, batch, &src, loss, &in);
}

static tsl_status train_step(tsl_model_t m, int64_t batch, batch_source *src, tsl_optimizer_t opt,
                             double *loss, int64_t *correct, const char *fn)
{
    tsl_status st = check_batch(m, batch, src, 1, fn);
    if (st)
        return st;
    if (!opt)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: optimizer is NULL", fn);
    instance *in;
    if ((st = gradients(m, batch, src, loss, &in)))
        return st;
    /* A sample that could not be read stops the step before any parameter changes. */
    if (src->read && (st = tsl_read_group_check(m->ctx, src->reads)))
        return st;
    if (correct && (st = count_correct(m, in, correct)))
        return st;
    tsl_tensor_t *ps = malloc(sizeof *ps * (size_t)(m->g->nparams + 1));
    tsl_tensor_t *gs = malloc(sizeof *gs * (size_t)(m->g->nparams + 1));
    if (!ps || !gs) {
        free(ps);
        free(gs);
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int32_t n = 0;
    for (int32_t i = 0; i < m->g->nparams; i++)
        if (m->pgrads[i] && tsl_graph_param_source(m->g, i) == i) { /* not a shared op's copy */
            ps[n] = m->params[i];
            gs[n++] = m->pgrads[i];
        }
    tsl_trace_label(m->ctx, NULL, "update");
    st = n ? tsl_optimizer_step(opt, n, ps, gs) : TSL_OK;
    tsl_trace_label(m->ctx, NULL, NULL);
    free(ps);
    free(gs);
    return st; /* the next forward reads the updated shards back (sync_replicas) */
}

tsl_status tsl_model_train_step(tsl_model_t m, int64_t batch, const float *x, const int64_t *labels,
                                tsl_optimizer_t opt, double *loss, int64_t *correct)
{
    batch_source src = {.x = x, .labels = labels};
    return train_step(m, batch, &src, opt, loss, correct, "tsl_model_train_step");
}

tsl_status tsl_model_train_step_targets(tsl_model_t m, int64_t batch, const float *x,
                                        const float *targets, tsl_optimizer_t opt, double *loss)
{
    batch_source src = {.x = x, .targets = targets};
    return train_step(m, batch, &src, opt, loss, NULL, "tsl_model_train_step_targets");
}

tsl_status tsl_model_train_step_read(tsl_model_t m, tsl_dataset_t dataset, int64_t batch,
                                     const int64_t *indices, tsl_optimizer_t opt, double *loss,
                                     int64_t *correct)
{
    batch_source src = {.dataset = dataset, .indices = indices, .read = 1, .take_ahead = 1};
    return train_step(m, batch, &src, opt, loss, correct, "tsl_model_train_step_read");
}

tsl_status tsl_model_train_step_read_next(tsl_model_t m, tsl_dataset_t dataset, int64_t batch,
                                          const int64_t *indices, const int64_t *next,
                                          tsl_optimizer_t opt, double *loss, int64_t *correct)
{
    batch_source src = {
        .dataset = dataset, .indices = indices, .read = 1, .take_ahead = 1, .next = next};
    return train_step(m, batch, &src, opt, loss, correct, "tsl_model_train_step_read_next");
}

static tsl_status evaluate(tsl_model_t m, int64_t batch, batch_source *src, double *loss,
                           int64_t *correct, const char *fn)
{
    tsl_status st = check_batch(m, batch, src, 1, fn);
    instance *in;
    if (st || (st = tsl_exec_instance_for(m, batch, &in)) ||
        (st = load_batch(m, in, batch, src, 1)) || (st = tsl_exec_forward(m, in, 0)))
        return st;
    double l = 0;
    st = model_loss(m, in, 0, &l);
    if (src->read) { /* (the cause, where a sample could not be read) */
        tsl_status unread = tsl_read_group_check(m->ctx, src->reads);
        st = unread ? unread : st;
    }
    if (!st && loss)
        *loss = l;
    if (!st && correct)
        st = count_correct(m, in, correct);
    return st;
}

tsl_status tsl_model_evaluate(tsl_model_t m, int64_t batch, const float *x, const int64_t *labels,
                              double *loss, int64_t *correct)
{
    batch_source src = {.x = x, .labels = labels};
    return evaluate(m, batch, &src, loss, correct, "tsl_model_evaluate");
}

tsl_status tsl_model_evaluate_targets(tsl_model_t m, int64_t batch, const float *x,
                                      const float *targets, double *loss)
{
    batch_source src = {.x = x, .targets = targets};
    return evaluate(m, batch, &src, loss, NULL, "tsl_model_evaluate_targets");
}

tsl_status tsl_model_evaluate_read(tsl_model_t m, tsl_dataset_t dataset, int64_t batch,
                                   const int64_t *indices, double *loss, int64_t *correct)
{
    batch_source src = {.dataset = dataset, .indices = indices, .read = 1};
    return evaluate(m, batch, &src, loss, correct, "tsl_model_evaluate_read");
}

tsl_status tsl_model_evaluate_read_next(tsl_model_t m, tsl_dataset_t dataset, int64_t batch,
                                        const int64_t *indices, const int64_t *next, double *loss,
                                        int64_t *correct)
{
    batch_source src = {
        .dataset = dataset, .indices = indices, .read = 1, .take_ahead = 1, .next = next};
    return evaluate(m, batch, &src, loss, correct, "tsl_model_evaluate_read_next");
}

tsl_dtype tsl_model_label_dtype(tsl_model_t m)
{
    if (m && m->targets)
        return TSL_F32;
    return m ? tsl_graph_label_dtype(m->g->values[m->g->output].shape.dims[0]) : TSL_U8;
}

/* The batch of a caller's x tensor (its first dimension), 0 when x is not a tensor. */
static int64_t batch_of(tsl_tensor_t x)
{
    return tsl_tensor_check(x, "") == TSL_OK && x->shape.ndim > 0 ? x->shape.dims[0] : 0;
}

tsl_status tsl_model_train_step_tensors(tsl_model_t m, tsl_tensor_t x, tsl_tensor_t labels,
                                        tsl_optimizer_t opt, double *loss, int64_t *correct)
{
    batch_source src = {.tx = x, .tlabels = labels, .tensors = 1};
    return train_step(m, batch_of(x), &src, opt, loss, correct, "tsl_model_train_step_tensors");
}

tsl_status tsl_model_evaluate_tensors(tsl_model_t m, tsl_tensor_t x, tsl_tensor_t labels,
                                      double *loss, int64_t *correct)
{
    batch_source src = {.tx = x, .tlabels = labels, .tensors = 1};
    return evaluate(m, batch_of(x), &src, loss, correct, "tsl_model_evaluate_tensors");
}

tsl_status tsl_model_forward_tensors(tsl_model_t m, tsl_tensor_t x, int32_t train, tsl_tensor_t out)
{
    const char *fn = "tsl_model_forward_tensors";
    batch_source src = {.tx = x, .tensors = 1};
    int64_t batch = batch_of(x);
    tsl_status st = check_batch(m, batch, &src, 0, fn);
    instance *in;
    if (st ||
        (st = check_tensor(m, out, "out", batch, &m->g->values[m->g->output].shape, TSL_F32, fn)) ||
        (st = tsl_exec_instance_for(m, batch, &in)) || (st = load_batch(m, in, batch, &src, 0)) ||
        (st = tsl_exec_forward(m, in, train)))
        return st;
    return tsl_tensor_redistribute(out, in->act[m->g->output]);
}

/* The source of the *_inputs calls: count tensors, one per input of the model; *st set when
 * they are missing. */
static batch_source inputs_source(tsl_model_t m, int32_t count, const tsl_tensor_t *xs,
                                  tsl_tensor_t labels, tsl_status *st, const char *fn)
{
    batch_source src = {.tlabels = labels, .tensors = 1, .txs = xs, .ntx = count};
    *st = TSL_OK;
    if (!m)
        *st = tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: model is NULL", fn);
    else if (count < 1 || !xs)
        *st = tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                        "%s: %d input tensors%s (want one per input "
                        "of the model: %d)",
                        fn, (int)count, xs ? "" : " at NULL", (int)tsl_graph_input_count(m->g));
    else
        src.tx = xs[0];
    return src;
}

tsl_status tsl_model_train_step_inputs(tsl_model_t m, int32_t count, const tsl_tensor_t *xs,
                                       tsl_tensor_t labels, tsl_optimizer_t opt, double *loss,
                                       int64_t *correct)
{
    const char *fn = "tsl_model_train_step_inputs";
    tsl_status st;
    batch_source src = inputs_source(m, count, xs, labels, &st, fn);
    return st ? st : train_step(m, batch_of(src.tx), &src, opt, loss, correct, fn);
}

tsl_status tsl_model_evaluate_inputs(tsl_model_t m, int32_t count, const tsl_tensor_t *xs,
                                     tsl_tensor_t labels, double *loss, int64_t *correct)
{
    const char *fn = "tsl_model_evaluate_inputs";
    tsl_status st;
    batch_source src = inputs_source(m, count, xs, labels, &st, fn);
    return st ? st : evaluate(m, batch_of(src.tx), &src, loss, correct, fn);
}

#define MAX_FORWARD_VALUES 64

static tsl_status forward_values(tsl_model_t m, batch_source *in_src, int32_t train, int32_t count,
                                 const int32_t *values, tsl_tensor_t *outs, const char *fn)
{
    batch_source src = *in_src;
    int64_t batch = batch_of(src.tx);
    tsl_status st = check_batch(m, batch, &src, 0, fn);
    if (st)
        return st;
    if (count < 1 || count > MAX_FORWARD_VALUES || !values || !outs)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: %d values (want 1 to %d, not NULL)", fn,
                         (int)count, MAX_FORWARD_VALUES);
    for (int32_t k = 0; k < count; k++) {
        int32_t v = values[k];
        if (v < 0 || v >= m->g->nvalues)
            return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                             "%s: values[%d] = %d is no value of the model's graph (%d values)", fn,
                             (int)k, (int)v, (int)m->g->nvalues);
        for (int32_t j = 0; j < k; j++)
            if (values[j] == v)
                return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "%s: value %d is asked for twice", fn,
                                 (int)v);
        const char *why = tsl_exec_value_not_kept(m, v);
        if (why)
            return tsl_error(m->ctx, TSL_ERR_INVALID_ARG,
                             "%s: value %d %s: this model does not make it (name it in a loss "
                             "term of the graph, or ask for the value after it)",
                             fn, (int)v, why);
        char what[32];
        snprintf(what, sizeof what, "outs[%d]", (int)k);
        if ((st = check_tensor(m, outs[k], what, batch, &m->g->values[v].shape, TSL_F32, fn)))
            return st;
    }
    if (!m->keep && !(m->keep = calloc((size_t)m->g->nvalues, 1)))
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    instance *in;
    for (int32_t k = 0; k < count; k++)
        m->keep[values[k]] = 1;
    if (!(st = tsl_exec_instance_for(m, batch, &in)) && !(st = load_batch(m, in, batch, &src, 0)))
        st = tsl_exec_forward(m, in, train);
    memset(m->keep, 0, (size_t)m->g->nvalues);
    for (int32_t k = 0; k < count && !st; k++)
        st = tsl_tensor_redistribute(outs[k], in->act[values[k]]);
    return st;
}

tsl_status tsl_model_forward_values_tensors(tsl_model_t m, tsl_tensor_t x, int32_t train,
                                            int32_t count, const int32_t *values,
                                            tsl_tensor_t *outs)
{
    batch_source src = {.tx = x, .tensors = 1};
    return forward_values(m, &src, train, count, values, outs, "tsl_model_forward_values_tensors");
}

tsl_status tsl_model_forward_values_inputs(tsl_model_t m, int32_t ninputs, const tsl_tensor_t *xs,
                                           int32_t train, int32_t count, const int32_t *values,
                                           tsl_tensor_t *outs)
{
    const char *fn = "tsl_model_forward_values_inputs";
    tsl_status st;
    batch_source src = inputs_source(m, ninputs, xs, NULL, &st, fn);
    return st ? st : forward_values(m, &src, train, count, values, outs, fn);
}

tsl_status tsl_model_forward(tsl_model_t m, int64_t batch, const float *x, int32_t train,
                             float *out)
{
    batch_source src = {.x = x};
    tsl_status st = check_batch(m, batch, &src, 0, "tsl_model_forward");
    instance *in;
    if (st || (st = tsl_exec_instance_for(m, batch, &in)) ||
        (st = load_batch(m, in, batch, &src, 0)) || (st = tsl_exec_forward(m, in, train)))
        return st;
    return tsl_tensor_gather(in->act[m->g->output], 0, out);
}

tsl_status tsl_model_step(tsl_model_t m, int64_t *step)
{
    if (!m || !step)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG, "tsl_model_step: NULL argument");
    *step = (int64_t)m->step;
    return TSL_OK;
}

tsl_status tsl_model_set_step(tsl_model_t m, int64_t step)
{
    if (!m || step < 0)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG, "tsl_model_set_step: %s",
                         m ? "step below 0" : "model is NULL");
    m->step = (uint64_t)step;
    return TSL_OK;
}
