/* Plan strings (include/tessel/plan.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"
#include "tessel/plan.h"

#define PLAN_MAX_VALUE (1L << 20)

tsl_status tsl_plan_init(tsl_plan *plan)
{
    if (!plan)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_init: plan is NULL");
    memset(plan, 0, sizeof *plan);
    plan->data = plan->stages = plan->micro = plan->tiles = 1;
    plan->shard = TSL_PLAN_SHARD_DEFAULT;
    plan->bucket = TSL_PLAN_BUCKET_DEFAULT;
    plan->space[0] = plan->space[1] = plan->space[2] = 1;
    return TSL_OK;
}

/* One integer in [1, PLAN_MAX_VALUE] from text[0 .. len); -1 if not. */
static long plan_int(const char *text, size_t len)
{
    char buf[16];
    if (len == 0 || len >= sizeof buf || text[0] == '-' || text[0] == '+')
        return -1;
    memcpy(buf, text, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    long v = strtol(buf, &end, 10);
    if (errno || *end || v < 1 || v > PLAN_MAX_VALUE)
        return -1;
    return v;
}

static const char *const balance_names[] = {"memory", "layers", "time"};

tsl_status tsl_plan_parse(const char *text, tsl_plan *out)
{
    const char *fn = "tsl_plan_parse";
    if (!text || !out)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    tsl_plan p;
    tsl_plan_init(&p);
    static const char *const keys[] = {"data",  "space",   "stages", "micro",    "tiles",
                                       "shard", "balance", "bucket", "recompute"};
    enum { NKEYS = 9 };
    int seen[NKEYS] = {0};
    const char *at = text;
    while (*at) {
        size_t len = strcspn(at, ",");
        const char *eq = memchr(at, '=', len);
        if (!eq)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "plan '%s': '%.*s' is not KEY=VALUE (keys: data, space, stages, "
                             "micro, balance, tiles, shard, bucket, recompute)",
                             text, (int)len, at);
        size_t klen = (size_t)(eq - at), vlen = len - klen - 1;
        int k = -1;
        for (int i = 0; i < NKEYS; i++)
            if (strlen(keys[i]) == klen && strncmp(at, keys[i], klen) == 0)
                k = i;
        if (k < 0)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "plan '%s': unknown part '%.*s' (keys: data, space, stages, micro, "
                             "balance, tiles, shard, bucket, recompute)",
                             text, (int)klen, at);
        if (seen[k]++)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "plan '%s': '%s' given twice", text,
                             keys[k]);
        const char *v = eq + 1;
        if (k == 1) { /* AxBxC */
            int n = 0;
            size_t off = 0;
            while (off <= vlen) {
                size_t part = strcspn(v + off, "x,");
                if (off + part > vlen)
                    part = vlen - off;
                long value = n < 3 ? plan_int(v + off, part) : -1;
                if (value < 0)
                    return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                     "plan '%s': space='%.*s' is not A, AxB or AxBxC with "
                                     "integers in [1, %ld]",
                                     text, (int)vlen, v, PLAN_MAX_VALUE);
                p.space[n++] = (int32_t)value;
                off += part + 1;
            }
            p.space_ndim = n;
        } else if (k == 6) {
            p.balance = -1;
            for (int b = 0; b < 3; b++)
                if (strlen(balance_names[b]) == vlen && strncmp(v, balance_names[b], vlen) == 0)
                    p.balance = b;
            if (p.balance < 0)
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "plan '%s': balance='%.*s' is not memory, layers or time", text,
                                 (int)vlen, v);
        } else if (k == 7) { /* bucket=0 turns packing off */
            long value = vlen == 1 && v[0] == '0' ? 0 : plan_int(v, vlen);
            if (value < 0)
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "plan '%s': bucket='%.*s' is not an integer in [0, %ld]", text,
                                 (int)vlen, v, PLAN_MAX_VALUE);
            p.bucket = (int32_t)value;
        } else if (k == 8) {
            if (vlen != 1 || (v[0] != '0' && v[0] != '1'))
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "plan '%s': recompute='%.*s' is not 0 or 1", text, (int)vlen, v);
            p.recompute = v[0] == '1';
        } else {
            long value = plan_int(v, vlen);
            if (value < 0)
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "plan '%s': %s='%.*s' is not an integer in [1, %ld]", text,
                                 keys[k], (int)vlen, v, PLAN_MAX_VALUE);
            int32_t *slot[NKEYS] = {&p.data, NULL, &p.stages, &p.micro, &p.tiles, &p.shard};
            *slot[k] = (int32_t)value;
        }
        at += len;
        if (*at == ',' && !*++at)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "plan '%s': ends with a comma", text);
    }
    *out = p;
    return TSL_OK;
}

int64_t tsl_plan_ranks(const tsl_plan *p)
{
    if (!p)
        return 0;
    return (int64_t)p->data * p->space[0] * p->space[1] * p->space[2] * p->stages;
}

tsl_status tsl_plan_format(const tsl_plan *p, char *text, size_t size)
{
    if (!p || !text)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_format: NULL argument");
    char buf[160] = "";
    size_t n = 0;
#define PART(...) n += (size_t)snprintf(buf + n, sizeof buf - n, __VA_ARGS__)
    if (p->data != 1)
        PART("%sdata=%d", n ? "," : "", (int)p->data);
    if (p->space_ndim > 0) {
        PART("%sspace=%d", n ? "," : "", (int)p->space[0]);
        for (int d = 1; d < p->space_ndim && d < 3; d++)
            PART("x%d", (int)p->space[d]);
    }
    if (p->stages != 1)
        PART("%sstages=%d", n ? "," : "", (int)p->stages);
    if (p->micro != 1)
        PART("%smicro=%d", n ? "," : "", (int)p->micro);
    if (p->balance > 0 && p->balance < 3)
        PART("%sbalance=%s", n ? "," : "", balance_names[p->balance]);
    if (p->tiles != 1)
        PART("%stiles=%d", n ? "," : "", (int)p->tiles);
    if (p->shard != TSL_PLAN_SHARD_DEFAULT)
        PART("%sshard=%d", n ? "," : "", (int)p->shard);
    if (p->bucket != TSL_PLAN_BUCKET_DEFAULT)
        PART("%sbucket=%d", n ? "," : "", (int)p->bucket);
    if (p->recompute)
        PART("%srecompute=1", n ? "," : "");
    if (!n)
        PART("data=1");
#undef PART
    if (n >= size)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_format: %zu bytes do not hold '%s'",
                         size, buf);
    memcpy(text, buf, n + 1);
    return TSL_OK;
}

tsl_status tsl_plan_check(const tsl_plan *plan, const tsl_shape *input, int32_t nranks)
{
    const char *fn = "tsl_plan_check";
    if (!plan || !input)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    char text[160] = "";
    tsl_plan_format(plan, text, sizeof text);
    if (tsl_plan_ranks(plan) != nranks)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "plan '%s' needs %lld ranks, this run has %d",
                         text, (long long)tsl_plan_ranks(plan), (int)nranks);
    if (plan->balance < 0 || plan->balance > 2)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "plan '%s': balance %d is not a balance", text,
                         (int)plan->balance);
    if (plan->space_ndim > input->ndim - 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s' splits %d spatial dimensions, the samples have %d", text,
                         (int)plan->space_ndim, (int)input->ndim - 1);
    return TSL_OK;
}

/* The wanted tiles per spatial dimension of the input: space[d], times T on the longest. */
static int wanted_splits(const tsl_plan *plan, const tsl_shape *input, int32_t splits[3])
{
    int spatial = input->ndim - 1, longest = 0;
    for (int d = 0; d < 3; d++) {
        splits[d] = plan && d < spatial ? plan->space[d] : 1;
        if (d < spatial && input->dims[1 + d] > input->dims[1 + longest])
            longest = d;
    }
    if (plan && spatial > 0)
        splits[longest] *= plan->tiles;
    return splits[0] * splits[1] * splits[2] > 1;
}

/* The stages of a plan (1 for NULL) and the ranks of each. */
static int32_t plan_stages(const tsl_plan *plan, int32_t nranks, int32_t *group)
{
    int32_t stages = plan && plan->stages > 1 ? plan->stages : 1;
    *group = nranks / stages > 0 ? nranks / stages : 1;
    return stages;
}

/* `map` on stage s's ranks (unchanged with one stage). */
static tsl_owner_map on_stage(tsl_owner_map map, int32_t stages, int32_t group, int32_t s)
{
    return stages > 1 ? tsl_owner_on_ranks(map, s * group, group) : map;
}

tsl_status tsl_plan_tensor_tiling(const tsl_plan *plan, const tsl_shape *input, int32_t nranks,
                                  int32_t stage, int32_t workers, int64_t batch,
                                  const tsl_shape *sample, int32_t first, tsl_tile_grid *grid,
                                  tsl_owner_map *owners)
{
    int32_t group, stages = plan_stages(plan, nranks, &group);
    if (!input || !sample || !grid || !owners || batch < 1 || nranks < 1 || stage < 0 ||
        stage >= stages)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_tensor_tiling: bad argument");
    int64_t micro = plan ? plan->micro : 1;
    int32_t splits[3];
    *grid = tsl_tile_grid_single();
    if (!wanted_splits(plan, input, splits) || sample->ndim <= first) {
        int64_t tiles = (int64_t)group * (workers > 0 ? workers : 1) * micro;
        grid->splits[0] = (int32_t)(tiles < batch ? tiles : batch);
        *owners = on_stage(tsl_owner_block(NULL), stages, group, stage);
        return TSL_OK;
    }
    int32_t procs[TSL_MAX_DIMS] = {0};
    int64_t sample_tiles = (int64_t)plan->data * micro;
    grid->splits[0] = (int32_t)(sample_tiles < batch ? sample_tiles : batch);
    procs[0] = plan->data;
    for (int d = 1; d <= sample->ndim && d < TSL_MAX_DIMS; d++) {
        int sp = d - 1 - first; /* spatial index, or < 0 for channels */
        procs[d] = sp >= 0 ? plan->space[sp] : 1;
        if (sp >= 0) {
            int64_t size = sample->dims[d - 1];
            grid->splits[d] = (int32_t)(splits[sp] < size ? splits[sp] : size);
        }
    }
    *owners = on_stage(tsl_owner_block(procs), stages, group, stage);
    return TSL_OK;
}

void tsl_batch_shape(int64_t batch, const tsl_shape *sample, tsl_shape *out)
{
    memset(out, 0, sizeof *out);
    out->ndim = sample->ndim + 1;
    out->dims[0] = batch;
    for (int d = 0; d < sample->ndim; d++)
        out->dims[d + 1] = sample->dims[d];
}

/* Add `per` times each shard's element count to its owner's count: the parameter `s` cut
 * along its first dimension into `splits` shards, owned as tsl_owner_block(NULL) deals them. */
static void add_shards(const tsl_shape *s, int32_t splits, int32_t nranks, int64_t per,
                       int64_t *count)
{
    int64_t row = tsl_shape_numel(s) / s->dims[0];
    for (int32_t k = 0; k < splits; k++) {
        int64_t start, extent;
        tsl_tile_extent(s->dims[0], splits, k, &start, &extent);
        count[(int64_t)k * nranks / splits] += per * row * extent;
    }
}

/* Add a (batch, sample...) tensor's tile bytes to the owners' counts. */
static tsl_status add_tensor(const tsl_plan *plan, const tsl_shape *input, int32_t nranks,
                             int32_t stage, int32_t workers, int64_t batch, const tsl_shape *sample,
                             int32_t first, int64_t elem, int64_t *bytes)
{
    tsl_tile_grid grid;
    tsl_owner_map owners;
    tsl_status st = tsl_plan_tensor_tiling(plan, input, nranks, stage, workers, batch, sample,
                                           first, &grid, &owners);
    if (st)
        return st;
    tsl_shape whole;
    tsl_batch_shape(batch, sample, &whole);
    int64_t ntiles = 1;
    for (int d = 0; d < whole.ndim; d++)
        ntiles *= grid.splits[d];
    for (int64_t t = 0; t < ntiles && !st; t++) {
        int32_t coords[TSL_MAX_DIMS] = {0};
        int64_t rest = t, count = elem;
        for (int d = whole.ndim - 1; d >= 0; d--) {
            coords[d] = (int32_t)(rest % grid.splits[d]);
            rest /= grid.splits[d];
            int64_t start, extent;
            tsl_tile_extent(whole.dims[d], grid.splits[d], coords[d], &start, &extent);
            count *= extent;
        }
        int32_t rank;
        if (!(st = tsl_owner_map_rank(&owners, coords, whole.ndim, &grid, nranks, &rank)))
            bytes[rank] += count;
    }
    return st;
}

/* The op of each parameter. */
static void param_ops(const struct tsl_graph *g, int32_t *op_of)
{
    for (int32_t o = 0; o < g->nops; o++)
        for (int32_t k = 0; k < g->ops[o].nparams; k++)
            if (g->ops[o].params[k] >= 0)
                op_of[g->ops[o].params[k]] = o;
}

/* Activation-sized tensors the executor keeps for value v: the activation and, except for
 * the input, its gradient; a spare gradient where several ops read the value (the model adds
 * their contributions there) or where an unfolded concatenation reads the input (its part of
 * the gradient is thrown away there); none for a batch norm's output that its fused ReLU
 * replaces (tsl_graph_fused_relu()), nor for a concatenation its convolution reads in place
 * (tsl_graph_folded_concat()). */
static int64_t value_copies(const struct tsl_graph *g, int32_t v, const int32_t *op_stage)
{
    int32_t p = g->values[v].producer;
    if (tsl_graph_fused_relu(g, p, op_stage) >= 0 || tsl_graph_folded_concat(g, p, op_stage) >= 0)
        return 0;
    int32_t readers = 0, concat = 0;
    for (int32_t o = 0; o < g->nops; o++)
        for (int32_t k = 0; k < g->ops[o].ninputs; k++)
            if (g->ops[o].inputs[k] == v) {
                readers++;
                concat |=
                    g->ops[o].kind == TSL_OP_CONCAT && tsl_graph_folded_concat(g, o, op_stage) < 0;
            }
    return v == g->input ? 1 + concat : 2 + (readers > 1);
}

/* The stage cost of op o (see tsl_plan_stages()). */
static double op_cost(const tsl_plan *plan, const struct tsl_graph *g, int32_t o, int64_t batch,
                      int32_t states)
{
    const tsl_graph_op *op = &g->ops[o];
    if (plan->balance == TSL_BALANCE_LAYERS)
        return op->kind == TSL_OP_INPUT ? 0 : 1;
    if (plan->balance == TSL_BALANCE_TIME) {
        double f = 0;
        tsl_graph_op_flops((tsl_graph_t)g, o, batch, &f);
        return f;
    }
    /* (fused ReLUs as on one stage: the stages are not known yet) */
    double bytes = 4.0 * (double)batch * (double)tsl_shape_numel(&g->values[op->output].shape) *
                   (double)value_copies(g, op->output, NULL);
    for (int32_t k = 0; k < op->nparams; k++) {
        const tsl_graph_param *p = &g->params[op->params[k]];
        bytes += 4.0 * (double)tsl_shape_numel(&p->shape) * (p->trainable ? 2 + states : 1);
    }
    return bytes;
}

/* Cut the m costs a[] into `parts` non-empty runs with the smallest largest sum: first[k] is
 * the first item of run k. Dynamic programming over prefixes, O(parts x m^2). */
static tsl_status split_runs(const double *a, int32_t m, int32_t parts, int32_t *first)
{
    size_t w = (size_t)m + 1;
    double *pre = malloc(sizeof *pre * w), *best = malloc(sizeof *best * w * (size_t)(parts + 1));
    int32_t *cut = malloc(sizeof *cut * w * (size_t)(parts + 1));
    if (!pre || !best || !cut) {
        free(pre);
        free(best);
        free(cut);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_stages: out of memory");
    }
    pre[0] = 0;
    for (int32_t i = 0; i < m; i++)
        pre[i + 1] = pre[i] + a[i];
    /* best[k][i]: the smallest largest sum of the first i items in k runs; cut[k][i]: where
     * its last run starts. */
    for (int32_t i = 1; i <= m; i++) {
        best[w + (size_t)i] = pre[i];
        cut[w + (size_t)i] = 0;
    }
    for (int32_t k = 2; k <= parts; k++)
        for (int32_t i = k; i <= m; i++) {
            double b = -1;
            int32_t at = k - 1;
            for (int32_t j = k - 1; j < i; j++) {
                double prev = best[(size_t)(k - 1) * w + (size_t)j], run = pre[i] - pre[j];
                double v = prev > run ? prev : run;
                if (b < 0 || v < b) {
                    b = v;
                    at = j;
                }
            }
            best[(size_t)k * w + (size_t)i] = b;
            cut[(size_t)k * w + (size_t)i] = at;
        }
    int32_t end = m;
    for (int32_t k = parts; k >= 1; k--) {
        first[k - 1] = cut[(size_t)k * w + (size_t)end];
        end = first[k - 1];
    }
    free(pre);
    free(best);
    free(cut);
    return TSL_OK;
}

static tsl_status estimate_peak(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                int32_t workers, int64_t batch, int32_t optimizer_states,
                                const int32_t *given, int64_t *bytes);
static tsl_status estimate_received(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                    int64_t batch, int32_t optimizer_states, const int32_t *given,
                                    int64_t *bytes);

/* Each op's stage when run k of the m items starts at item first[k] (ops before the first
 * item stay where they are: the input, on stage 0). */
static void assign_runs(const struct tsl_graph *g, const int32_t *item, int32_t m,
                        const int32_t *first, int32_t stages, int32_t *op_stage)
{
    for (int32_t k = 0; k < stages; k++)
        for (int32_t i = first[k]; i < (k + 1 < stages ? first[k + 1] : m); i++)
            for (int32_t o = item[i]; o < (i + 1 < m ? item[i + 1] : g->nops); o++)
                op_stage[o] = k;
}

/* How good a split is for balance=memory: the largest rank's estimated peak (live tiles,
 * tsl_plan_estimate_peak(), plus received copies, tsl_plan_estimate_received()), then, for
 * splits alike in that, the sum of every rank's squared. */
typedef struct split_score {
    int64_t most;
    double squares;
} split_score;

static tsl_status score_split(const tsl_plan *plan, tsl_graph_t g, int32_t nranks, int64_t batch,
                              int32_t states, const int32_t *op_stage, int64_t *peak,
                              int64_t *received, split_score *out)
{
    tsl_status st = estimate_peak(plan, g, nranks, 1, batch, states, op_stage, peak);
    if (!st)
        st = estimate_received(plan, g, nranks, batch, states, op_stage, received);
    out->most = 0;
    out->squares = 0;
    for (int32_t r = 0; r < nranks && !st; r++) {
        int64_t b = peak[r] + received[r];
        out->most = b > out->most ? b : out->most;
        out->squares += (double)b * (double)b;
    }
    return st;
}

/* balance=memory, past the runs of smallest largest additive cost: those costs count every
 * activation and gradient of a stage as if all lived at once, and none of the copies a stage
 * receives from others (a U-Net's long skips), so the runs are only where a search over the
 * estimate of what lives at once starts. Each cut in turn moves to the place between its
 * neighbours with the best score_split(), until a pass moves none; in a network of more than
 * REFINE_WHOLE items a pass tries only REFINE_WINDOW places either side of each cut (an
 * estimate costs time quadratic in the ops). A split whose estimate fails (a plan that does
 * not fit the input, reported where the plan is used) keeps the additive runs. */
#define REFINE_WHOLE 96
#define REFINE_WINDOW 12
static void refine_runs(const tsl_plan *plan, tsl_graph_t g, int64_t batch, int32_t states,
                        const int32_t *item, int32_t m, int32_t stages, int32_t *first,
                        int32_t *op_stage)
{
    int32_t nranks = (int32_t)tsl_plan_ranks(plan);
    int64_t *peak = calloc((size_t)nranks, sizeof *peak);
    int64_t *received = calloc((size_t)nranks, sizeof *received);
    int32_t *start = malloc(sizeof *start * (size_t)stages);
    split_score best, score;
    assign_runs(g, item, m, first, stages, op_stage);
    if (!peak || !received || !start ||
        score_split(plan, g, nranks, batch, states, op_stage, peak, received, &best))
        goto done;
    memcpy(start, first, sizeof *first * (size_t)stages);
    for (int pass = 0, moved = 1; moved && pass < 64; pass++) {
        moved = 0;
        for (int32_t k = 1; k < stages; k++) {
            int32_t at = first[k], lo = first[k - 1] + 1,
                    hi = k + 1 < stages ? first[k + 1] - 1 : m - 1;
            if (m > REFINE_WHOLE) { /* deep networks: a window around the cut per pass */
                lo = lo > at - REFINE_WINDOW ? lo : at - REFINE_WINDOW;
                hi = hi < at + REFINE_WINDOW ? hi : at + REFINE_WINDOW;
            }
            for (int32_t j = lo; j <= hi; j++) {
                if (j == at)
                    continue;
                int32_t keep = first[k];
                first[k] = j;
                assign_runs(g, item, m, first, stages, op_stage);
                first[k] = keep;
                if (score_split(plan, g, nranks, batch, states, op_stage, peak, received, &score)) {
                    memcpy(first, start, sizeof *first * (size_t)stages);
                    goto done;
                }
                if (score.most < best.most ||
                    (score.most == best.most && score.squares < best.squares)) {
                    best = score;
                    first[k] = j;
                }
            }
            moved |= first[k] != at;
        }
    }
done:
    assign_runs(g, item, m, first, stages, op_stage);
    free(peak);
    free(received);
    free(start);
}

tsl_status tsl_plan_stages(const tsl_plan *plan, tsl_graph_t g, int64_t batch,
                           int32_t optimizer_states, int32_t *op_stage)
{
    const char *fn = "tsl_plan_stages";
    if (!g || !op_stage || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    int32_t stages = plan && plan->stages > 1 ? plan->stages : 1, n = g->nops, by_hand = 0;
    for (int32_t o = 0; o < n; o++)
        by_hand |= g->ops[o].stage > 0;
    if (by_hand) {
        int32_t at = 0;
        for (int32_t o = 0; o < n; o++) {
            if (g->ops[o].stage > 0)
                at = g->ops[o].stage - 1;
            if (at >= stages)
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "%s: op %d (%s) is on stage %d, the plan has %d stage%s", fn,
                                 (int)o, tsl_op_kind_name(g->ops[o].kind), (int)at, (int)stages,
                                 stages == 1 ? "" : "s");
            op_stage[o] = at;
        }
        return TSL_OK;
    }
    memset(op_stage, 0, sizeof *op_stage * (size_t)n);
    if (stages == 1)
        return TSL_OK;
    /* The ops after the input, in order, as items to cut into runs: an op, or a batch norm with
     * the ReLU right after it that the executor fuses into it (kept on one stage, so the
     * fusion holds); the input op joins the first item. */
    int32_t m = 0;
    double *a = malloc(sizeof *a * (size_t)(n + 1));
    int32_t *item = malloc(sizeof *item * (size_t)(n + 1)),
            *first = malloc(sizeof *first * (size_t)stages);
    tsl_status st = a && item && first ? TSL_OK
                                       : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY,
                                                   "%s: out of "
                                                   "memory",
                                                   fn);
    double input_cost = 0;
    for (int32_t o = 0; o < n && !st; o++) {
        double c = op_cost(plan, g, o, batch, optimizer_states);
        if (g->ops[o].kind == TSL_OP_INPUT) {
            input_cost += c;
            continue;
        }
        if (m > 0 && item[m - 1] == o - 1 && tsl_graph_fused_relu(g, o - 1, NULL) == o) {
            a[m - 1] += c;
            continue;
        }
        a[m] = c;
        item[m++] = o;
    }
    if (!st && m < stages)
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                       "%s: %d stages need at least %d ops after the input (a batch norm and its "
                       "ReLU count as one), the network has %d",
                       fn, (int)stages, (int)stages, (int)m);
    if (!st) {
        a[0] += input_cost;
        st = split_runs(a, m, stages, first);
    }
    if (!st && plan->balance == TSL_BALANCE_MEMORY)
        refine_runs(plan, g, batch, optimizer_states, item, m, stages, first, op_stage);
    else if (!st)
        assign_runs(g, item, m, first, stages, op_stage);
    free(a);
    free(item);
    free(first);
    return st;
}

/* What the estimates share: the op stages (op_stage, nops entries: `given`, or else
 * tsl_plan_stages()) and the tensors that live
 * for the whole step, added to bytes: the labels (tsl_graph_label_dtype) on the output's
 * stage, and every parameter where tsl_plan_param_placement() puts it, with its gradient and
 * optimizer states, plus each sharded weight's whole value on every rank of its stage and
 * each replicated one's (tsl_plan_buckets()). */
static tsl_status estimate_setup(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                 int32_t workers, int64_t batch, int32_t optimizer_states,
                                 const int32_t *given, int32_t *op_stage, int64_t *bytes,
                                 const char *fn)
{
    int32_t out = tsl_graph_output(g);
    if (out < 0 || g->input < 0)
        return tsl_error(NULL, TSL_ERR_STATE, "%s: the graph needs an input and an output", fn);
    tsl_shape input, shape;
    tsl_graph_value_shape(g, g->input, &input);
    tsl_status st = plan ? tsl_plan_check(plan, &input, nranks) : TSL_OK;
    int32_t np = tsl_graph_param_count(g);
    tsl_tile_grid *grids = calloc((size_t)np + 1, sizeof *grids);
    tsl_owner_map *owners = calloc((size_t)np + 1, sizeof *owners);
    int32_t *sharded = calloc((size_t)np + 1, sizeof *sharded);
    int32_t *bucket_of = calloc((size_t)np + 1, sizeof *bucket_of),
            *replicated = calloc((size_t)np + 1, sizeof *replicated), nbuckets = 0;
    if (!st && (!grids || !owners || !sharded || !bucket_of || !replicated))
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (!st && given)
        memcpy(op_stage, given, sizeof *op_stage * (size_t)g->nops);
    else if (!st)
        st = tsl_plan_stages(plan, g, batch, optimizer_states, op_stage);
    if (!st) { /* labels: one per sample, or per position of a (classes, spatial...) output */
        tsl_graph_value_shape(g, out, &shape);
        tsl_shape labels;
        memset(&labels, 0, sizeof labels);
        labels.ndim = shape.ndim - 1;
        for (int d = 1; d < shape.ndim; d++)
            labels.dims[d - 1] = shape.dims[d];
        st = add_tensor(plan, &input, nranks, op_stage[g->values[out].producer], workers, batch,
                        &labels, 0, tsl_graph_label_dtype(shape.dims[0]) == TSL_U8 ? 1 : 4, bytes);
    }
    if (!st && np > 0 &&
        !(st = tsl_plan_param_placement(plan, g, nranks, op_stage, grids, owners, sharded)))
        st = tsl_plan_buckets(plan, g, nranks, owners, sharded, bucket_of, replicated, &nbuckets);
    int32_t group;
    plan_stages(plan, nranks, &group);
    for (int32_t i = 0; i < np && !st; i++) {
        int32_t trainable;
        if ((st = tsl_graph_param_info(g, i, NULL, &shape, &trainable)))
            break;
        int64_t copies = trainable ? 2 + optimizer_states : 1, numel = tsl_shape_numel(&shape);
        if (!sharded[i]) {
            const int32_t zero[TSL_MAX_DIMS] = {0};
            int32_t rank;
            if (!(st = tsl_owner_map_rank(&owners[i], zero, shape.ndim, &grids[i], nranks, &rank)))
                bytes[rank] += 4 * numel * copies;
            for (int32_t r = rank / group * group; replicated[i] && r < (rank / group + 1) * group;
                 r++) /* each rank's whole copy */
                bytes[r] += 4 * numel;
            continue;
        }
        int32_t first = owners[i].first_rank,
                size = owners[i].group_size > 0 ? owners[i].group_size : nranks;
        add_shards(&shape, grids[i].splits[0], size, 4 * copies, bytes + first);
        for (int32_t r = first; r < first + size; r++) /* each rank's whole copy */
            bytes[r] += 4 * numel;
    }
    free(grids);
    free(owners);
    free(sharded);
    free(bucket_of);
    free(replicated);
    return st;
}

tsl_status tsl_plan_estimate(const tsl_plan *plan, tsl_graph_t g, int32_t nranks, int32_t workers,
                             int64_t batch, int32_t optimizer_states, int64_t *bytes)
{
    if (!g || !bytes || nranks < 1 || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_estimate: bad argument");
    memset(bytes, 0, sizeof *bytes * (size_t)nranks);
    int32_t *op_stage = calloc((size_t)g->nops + 1, sizeof *op_stage);
    tsl_status st =
        op_stage ? estimate_setup(plan, g, nranks, workers, batch, optimizer_states, NULL, op_stage,
                                  bytes, "tsl_plan_estimate")
                 : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate: out of memory");
    tsl_shape input, shape;
    if (!st) /* else no input: the error stays the setup's */
        tsl_graph_value_shape(g, g->input, &input);
    for (int32_t v = 0; v < tsl_graph_value_count(g) && !st; v++) {
        tsl_graph_value_shape(g, v, &shape);
        st = add_tensor(plan, &input, nranks, op_stage[g->values[v].producer], workers, batch,
                        &shape, 1, 4 * value_copies(g, v, op_stage), bytes);
    }
    for (int32_t o = 0; o < g->nops && !st; o++) { /* max pooling's indices */
        int32_t ib = tsl_graph_pool_index_bytes(&g->ops[o]);
        tsl_graph_value_shape(g, g->ops[o].output, &shape);
        if (ib)
            st =
                add_tensor(plan, &input, nranks, op_stage[o], workers, batch, &shape, 1, ib, bytes);
    }
    free(op_stage);
    return st;
}

/* Add (sign 1) or take away (-1) value v's activation-sized tile bytes, size[v * nranks + r],
 * and keep each rank's largest total in peak. */
static void live_add(int64_t *live, int64_t *peak, const int64_t *size, int32_t v, int32_t nranks,
                     int sign)
{
    for (int32_t r = 0; r < nranks; r++) {
        live[r] += sign * size[(int64_t)v * nranks + r];
        peak[r] = live[r] > peak[r] ? live[r] : peak[r];
    }
}

tsl_status tsl_plan_estimate_peak(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                  int32_t workers, int64_t batch, int32_t optimizer_states,
                                  int64_t *bytes)
{
    if (!g || !bytes || nranks < 1 || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_estimate_peak: bad argument");
    return estimate_peak(plan, g, nranks, workers, batch, optimizer_states, NULL, bytes);
}

/* tsl_plan_estimate_peak() for the op stages `given` (NULL: tsl_plan_stages()). */
static tsl_status estimate_peak(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                int32_t workers, int64_t batch, int32_t optimizer_states,
                                const int32_t *given, int64_t *bytes)
{
    const char *fn = "tsl_plan_estimate_peak";
    memset(bytes, 0, sizeof *bytes * (size_t)nranks);
    int32_t nv = g->nvalues, n = g->nops;
    int32_t *op_stage = calloc((size_t)n + 1, sizeof *op_stage);
    int32_t *relu_of = calloc((size_t)n + 1, sizeof *relu_of);
    uint8_t *fused = calloc((size_t)n + 1, 1);
    int32_t *fold = calloc((size_t)n + 1, sizeof *fold);
    uint8_t *written = calloc((size_t)nv + 1, 1), *spare = calloc((size_t)nv + 1, 1);
    uint8_t *gone = calloc((size_t)nv + 1, 1);    /* released after the forward's last reader */
    uint8_t *dropped = calloc((size_t)nv + 1, 1); /* and made again for the backward */
    int64_t *size = calloc((size_t)nv * (size_t)nranks + 1, sizeof *size);
    int64_t *isize = calloc((size_t)n * (size_t)nranks + 1, sizeof *isize); /* max pool indices */
    int64_t *live = calloc((size_t)nranks, sizeof *live);
    tsl_status st = op_stage && relu_of && fused && fold && written && spare && gone && dropped &&
                            size && isize && live
                        ? estimate_setup(plan, g, nranks, workers, batch, optimizer_states, given,
                                         op_stage, live, fn)
                        : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    tsl_shape input, shape;
    if (!st) /* else no input: the error stays the setup's */
        tsl_graph_value_shape(g, g->input, &input);
    for (int32_t v = 0; v < nv && !st; v++) {
        tsl_graph_value_shape(g, v, &shape);
        st = add_tensor(plan, &input, nranks, op_stage[g->values[v].producer], workers, batch,
                        &shape, 1, 4, size + (int64_t)v * nranks);
    }
    for (int32_t o = 0; o < n && !st; o++) {
        int32_t ib = tsl_graph_pool_index_bytes(&g->ops[o]);
        tsl_graph_value_shape(g, g->ops[o].output, &shape);
        if (ib)
            st = add_tensor(plan, &input, nranks, op_stage[o], workers, batch, &shape, 1, ib,
                            isize + (int64_t)o * nranks);
    }
    if (!st) {
        memcpy(bytes, live, sizeof *bytes * (size_t)nranks);
        for (int32_t o = 0; o < n; o++) {
            relu_of[o] = tsl_graph_fused_relu(g, o, op_stage);
            if (relu_of[o] >= 0)
                fused[relu_of[o]] = 1;
            fold[o] = tsl_graph_folded_concat(g, o, op_stage);
        }
        /* Forward: every op's output made (a batch norm's with a fused ReLU is the ReLU's, a
         * folded concatenation's none); a value no backward reads, or one the backward makes
         * again (tsl_graph_recomputed()), goes after its last forward reader. */
        for (int32_t o = 0; o < n; o++) {
            if (relu_of[o] < 0 && fold[o] < 0)
                live_add(live, bytes, size, g->ops[o].output, nranks, 1);
            live_add(live, bytes, isize, o, nranks, 1); /* a max pooling's indices */
            int32_t ins[TSL_GRAPH_MAX_INPUTS], nin = tsl_graph_exec_inputs(g, o, fold, ins);
            for (int32_t k = 0; k < nin; k++) {
                int32_t v = ins[k];
                if (gone[v] || !tsl_graph_last_reader(g, v, o, fold))
                    continue;
                int later = tsl_graph_value_read_backward(g, v, fused, fold);
                dropped[v] =
                    later && plan && plan->recompute && tsl_graph_recomputed(g, v, op_stage) >= 0;
                if (!later || dropped[v]) {
                    gone[v] = 1;
                    live_add(live, bytes, size, v, nranks, -1);
                }
            }
        }
        /* Backward, as the executor runs it: an op's input gradients are made (a spare for a
         * value's second contribution); then the op's output, its gradient and spare are
         * released, since no later op in the backward reads them (the model's output stays,
         * the accuracy reads it). */
        int32_t out = tsl_graph_output(g);
        written[out] = 1;
        live_add(live, bytes, size, out, nranks, 1);
        for (int32_t o = n - 1; o >= 0; o--) {
            const tsl_graph_op *op = &g->ops[o];
            if (fused[o] || fold[o] >= 0)
                continue;
            int32_t y = relu_of[o] >= 0 ? g->ops[relu_of[o]].output : op->output;
            int32_t ins[TSL_GRAPH_MAX_INPUTS], nin = tsl_graph_exec_inputs(g, o, fold, ins);
            for (int32_t k = 0; k < nin && written[y] && tsl_graph_op_reads_input_backward(op); k++)
                if (dropped[ins[k]]) { /* made again */
                    dropped[ins[k]] = gone[ins[k]] = 0;
                    live_add(live, bytes, size, ins[k], nranks, 1);
                }
            for (int32_t k = 0; k < nin && written[y] && op->kind != TSL_OP_INPUT; k++) {
                int32_t v = ins[k];
                if (v == g->input) {
                    if (op->kind == TSL_OP_CONCAT && !spare[v]) /* its part goes to a spare */
                        spare[v] = 1, live_add(live, bytes, size, v, nranks, 1);
                } else if (!written[v]) {
                    written[v] = 1;
                    live_add(live, bytes, size, v, nranks, 1);
                } else if (!spare[v]) {
                    spare[v] = 1;
                    live_add(live, bytes, size, v, nranks, 1);
                }
            }
            int copies = (y != out && !gone[y]) + written[y] * (y != g->input) + spare[y];
            for (int c = 0; c < copies; c++)
                live_add(live, bytes, size, y, nranks, -1);
            live_add(live, bytes, isize, o, nranks, -1);
        }
    }
    free(op_stage);
    free(relu_of);
    free(fused);
    free(fold);
    free(written);
    free(spare);
    free(gone);
    free(dropped);
    free(size);
    free(isize);
    free(live);
    return st;
}

tsl_status tsl_plan_estimate_received(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                      int64_t batch, int32_t optimizer_states, int64_t *bytes)
{
    if (!g || !bytes || nranks < 1 || batch < 1 || optimizer_states < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_estimate_received: bad argument");
    return estimate_received(plan, g, nranks, batch, optimizer_states, NULL, bytes);
}

/* tsl_plan_estimate_received() for the op stages `given` (NULL: tsl_plan_stages()). */
static tsl_status estimate_received(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                    int64_t batch, int32_t optimizer_states, const int32_t *given,
                                    int64_t *bytes)
{
    memset(bytes, 0, sizeof *bytes * (size_t)nranks);
    int32_t group, stages = plan_stages(plan, nranks, &group);
    if (stages == 1)
        return TSL_OK;
    int32_t *op_stage = calloc((size_t)g->nops + 1, sizeof *op_stage);
    /* Per stage: the most one op receives forward; the inputs its ops read again backward,
     * all received when the backward is submitted; one op's backward copies (received output
     * gradients, and a concatenation's part packed to be sent). */
    int64_t *fwd = calloc((size_t)stages, sizeof *fwd), *bwd = calloc((size_t)stages, sizeof *bwd);
    int64_t *fwd_most = calloc((size_t)stages, sizeof *fwd_most),
            *bwd_most = calloc((size_t)stages, sizeof *bwd_most),
            *bwd_inputs = calloc((size_t)stages, sizeof *bwd_inputs);
    tsl_status st =
        op_stage && fwd && bwd && fwd_most && bwd_most && bwd_inputs
            ? TSL_OK
            : tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_plan_estimate_received: out of memory");
    if (!st && given)
        memcpy(op_stage, given, sizeof *op_stage * (size_t)g->nops);
    else if (!st)
        st = tsl_plan_stages(plan, g, batch, optimizer_states, op_stage);
    for (int32_t o = 0; o < g->nops && !st; o++) {
        const tsl_graph_op *op = &g->ops[o];
        int32_t so = op_stage[o];
        memset(fwd, 0, sizeof *fwd * (size_t)stages);
        memset(bwd, 0, sizeof *bwd * (size_t)stages);
        for (int32_t k = 0; k < op->ninputs; k++) {
            int32_t v = op->inputs[k], sv = op_stage[g->values[v].producer];
            if (sv == so)
                continue;
            int64_t in = 4 * batch * tsl_shape_numel(&g->values[v].shape);
            int64_t out = 4 * batch * tsl_shape_numel(&g->values[op->output].shape);
            fwd[so] += in;
            if (tsl_graph_op_reads_input_backward(op))
                bwd_inputs[so] += in;
            if (v != g->input) {
                bwd[sv] += op->kind == TSL_OP_CONCAT ? in : out;
                if (op->kind == TSL_OP_CONCAT) /* the part is cut on its owner, then sent */
                    bwd[so] += in;
            }
        }
        for (int32_t s = 0; s < stages; s++) {
            fwd_most[s] = fwd[s] > fwd_most[s] ? fwd[s] : fwd_most[s];
            bwd_most[s] = bwd[s] > bwd_most[s] ? bwd[s] : bwd_most[s];
        }
    }
    for (int32_t s = 0; s < stages && !st; s++) {
        int64_t back = bwd_inputs[s] + bwd_most[s];
        int64_t most = (fwd_most[s] > back ? fwd_most[s] : back) / group;
        for (int32_t r = s * group; r < (s + 1) * group; r++)
            bytes[r] = most;
    }
    free(op_stage);
    free(fwd);
    free(bwd);
    free(fwd_most);
    free(bwd_most);
    free(bwd_inputs);
    return st;
}

/* Whether parameter i is the weight of a convolution or linear layer. */
static int is_weight(const struct tsl_graph *g, int32_t i)
{
    for (int32_t o = 0; o < g->nops; o++)
        if ((g->ops[o].kind == TSL_OP_CONV || g->ops[o].kind == TSL_OP_LINEAR) &&
            g->ops[o].nparams > 0 && g->ops[o].params[0] == i)
            return 1;
    return 0;
}

tsl_status tsl_plan_param_placement(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                                    const int32_t *op_stage, tsl_tile_grid *grids,
                                    tsl_owner_map *owners, int32_t *sharded)
{
    const char *fn = "tsl_plan_param_placement";
    if (!g || nranks < 1 || (g->nparams > 0 && (!grids || !owners)))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    int32_t group, stages = plan_stages(plan, nranks, &group);
    if (stages > 1 && !op_stage)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: a plan with %d stages needs op stages", fn,
                         (int)stages);
    for (int32_t o = 0; op_stage && o < g->nops; o++)
        if (op_stage[o] < 0 || op_stage[o] >= stages)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: op %d is on stage %d of %d", fn,
                             (int)o, (int)op_stage[o], (int)stages);
    int64_t min = plan ? plan->shard : TSL_PLAN_SHARD_DEFAULT;
    int64_t *load = calloc((size_t)nranks, sizeof *load);
    int32_t *op_of = calloc((size_t)g->nparams + 1, sizeof *op_of),
            *cut = calloc((size_t)g->nparams + 1, sizeof *cut);
    if (!load || !op_of || !cut) {
        free(load);
        free(op_of);
        free(cut);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    param_ops(g, op_of);
    for (int32_t i = 0; i < g->nparams; i++) {
        const tsl_shape *s = &g->params[i].shape;
        int32_t stage = op_stage ? op_stage[op_of[i]] : 0;
        grids[i] = tsl_tile_grid_single();
        owners[i] = on_stage(tsl_owner_single(0), stages, group, stage);
        int64_t numel = tsl_shape_numel(s);
        if (group > 1 && s->dims[0] > 1 && numel >= min && is_weight(g, i)) {
            grids[i].splits[0] = (int32_t)(s->dims[0] < group ? s->dims[0] : group);
            owners[i] = on_stage(tsl_owner_block(NULL), stages, group, stage);
            cut[i] = 1;
            add_shards(s, grids[i].splits[0], group, 1, load + (int64_t)stage * group);
        }
    }
    for (int32_t i = 0; i < g->nparams; i++) {
        if (sharded)
            sharded[i] = cut[i];
        if (cut[i])
            continue;
        int32_t first = (op_stage ? op_stage[op_of[i]] : 0) * group, best = first;
        for (int32_t r = first + 1; r < first + group; r++)
            if (load[r] < load[best])
                best = r;
        owners[i] = tsl_owner_single(best);
        load[best] += tsl_shape_numel(&g->params[i].shape);
    }
    free(load);
    free(op_of);
    free(cut);
    return TSL_OK;
}

tsl_status tsl_plan_buckets(const tsl_plan *plan, tsl_graph_t g, int32_t nranks,
                            const tsl_owner_map *owners, const int32_t *sharded, int32_t *bucket_of,
                            int32_t *replicated, int32_t *nbuckets)
{
    const char *fn = "tsl_plan_buckets";
    if (!g || nranks < 1 || !nbuckets || (g->nparams > 0 && (!owners || !sharded || !bucket_of)))
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: bad argument", fn);
    int32_t group;
    plan_stages(plan, nranks, &group);
    int64_t cap = plan ? plan->bucket : TSL_PLAN_BUCKET_DEFAULT;
    *nbuckets = 0;
    int32_t *op_of = calloc((size_t)g->nparams + 1, sizeof *op_of),
            *current = malloc(sizeof *current * (size_t)nranks);
    int64_t *fill = calloc((size_t)nranks, sizeof *fill);
    if (!op_of || !current || !fill) {
        free(op_of);
        free(current);
        free(fill);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    param_ops(g, op_of);
    for (int32_t r = 0; r < nranks; r++)
        current[r] = -1;
    for (int32_t i = g->nparams - 1; i >= 0; i--) {
        const tsl_graph_param *p = &g->params[i];
        const tsl_graph_op *o = &g->ops[op_of[i]];
        int packed = group > 1 && cap > 0 && !sharded[i] && p->trainable;
        bucket_of[i] = -1;
        if (replicated)
            replicated[i] = packed;
        if (!packed || (o->kind != TSL_OP_CONV && o->kind != TSL_OP_LINEAR))
            continue;
        int32_t r = owners[i].rank;
        int64_t numel = tsl_shape_numel(&p->shape);
        if (current[r] < 0 || (fill[r] > 0 && fill[r] + numel > cap)) {
            current[r] = (*nbuckets)++;
            fill[r] = 0;
        }
        bucket_of[i] = current[r];
        fill[r] += numel;
    }
    free(op_of);
    free(current);
    free(fill);
    return TSL_OK;
}
