/* Plan strings: defaults, parsing, formatting and checks (include/tessel/plan.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"
#include "plan_internal.h"
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
    plan->layers = plan->levels = plan->filters = plan->channels = plan->domains = 1;
    plan->cf = plan->iters = 2;
    plan->biters = 1;
    plan->relax = TSL_RELAX_FCF;
    plan->skip = TSL_PLAN_SKIP_DEFAULT;
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
    static const char *const keys[] = {"data",   "space",   "stages", "micro",     "tiles",
                                       "shard",  "balance", "bucket", "recompute", "layers",
                                       "levels", "cf",      "iters",  "biters",    "relax",
                                       "skip",   "filters", "infer",  "channels",  "domains"};
    enum { NKEYS = 20 };
    int seen[NKEYS] = {0};
    const char *at = text;
    while (*at) {
        size_t len = strcspn(at, ",");
        const char *eq = memchr(at, '=', len);
        if (!eq)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "plan '%s': '%.*s' is not KEY=VALUE (keys: data, space, stages, "
                             "micro, balance, tiles, shard, bucket, recompute, layers, levels, "
                             "cf, iters, biters, relax, skip, infer, filters, channels, domains)",
                             text, (int)len, at);
        size_t klen = (size_t)(eq - at), vlen = len - klen - 1;
        int k = -1;
        for (int i = 0; i < NKEYS; i++)
            if (strlen(keys[i]) == klen && strncmp(at, keys[i], klen) == 0)
                k = i;
        if (k < 0)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "plan '%s': unknown part '%.*s' (keys: data, space, stages, micro, "
                             "balance, tiles, shard, bucket, recompute, layers, levels, cf, "
                             "iters, biters, relax, skip, infer, filters, channels, domains)",
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
        } else if (k == 8 || k == 15) {
            if (vlen != 1 || (v[0] != '0' && v[0] != '1'))
                return tsl_error(NULL, TSL_ERR_INVALID_ARG, "plan '%s': %s='%.*s' is not 0 or 1",
                                 text, keys[k], (int)vlen, v);
            *(k == 8 ? &p.recompute : &p.skip) = v[0] == '1';
        } else if (k == 17) {
            if (vlen == 5 && strncmp(v, "exact", 5) == 0)
                p.infer = TSL_INFER_EXACT;
            else if (vlen == 5 && strncmp(v, "mgrit", 5) == 0)
                p.infer = TSL_INFER_MGRIT;
            else
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "plan '%s': infer='%.*s' is not exact or mgrit", text, (int)vlen,
                                 v);
        } else if (k == 14) {
            if (vlen == 1 && v[0] == 'F')
                p.relax = TSL_RELAX_F;
            else if (vlen == 3 && strncmp(v, "FCF", 3) == 0)
                p.relax = TSL_RELAX_FCF;
            else
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "plan '%s': relax='%.*s' is not F or FCF", text, (int)vlen, v);
        } else {
            long value = plan_int(v, vlen);
            if (value < 0)
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "plan '%s': %s='%.*s' is not an integer in [1, %ld]", text,
                                 keys[k], (int)vlen, v, PLAN_MAX_VALUE);
            int32_t *slot[NKEYS] = {&p.data,   NULL,       &p.stages, &p.micro,    &p.tiles,
                                    &p.shard,  NULL,       NULL,      NULL,        &p.layers,
                                    &p.levels, &p.cf,      &p.iters,  &p.biters,   NULL,
                                    NULL,      &p.filters, NULL,      &p.channels, &p.domains};
            *slot[k] = (int32_t)value;
        }
        if (seen[2] && seen[19])
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "plan '%s': domains= and stages= both cut the ranks into groups "
                             "along the network; give one",
                             text);
        if (k == 19) /* the groups are the pipeline's stages */
            p.stages = p.domains;
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
    return (int64_t)p->data * p->filters * p->channels * p->space[0] * p->space[1] * p->space[2] *
           tsl_plan_depth(p);
}

int32_t tsl_plan_depth(const tsl_plan *p)
{
    if (!p)
        return 1;
    return p->layers > 1 ? p->layers : p->stages > 1 ? p->stages : 1;
}

tsl_status tsl_plan_format(const tsl_plan *p, char *text, size_t size)
{
    if (!p || !text)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_format: NULL argument");
    char buf[256] = "";
    size_t n = 0;
#define PART(...) n += (size_t)snprintf(buf + n, sizeof buf - n, __VA_ARGS__)
    if (p->data != 1)
        PART("%sdata=%d", n ? "," : "", (int)p->data);
    if (p->filters != 1)
        PART("%sfilters=%d", n ? "," : "", (int)p->filters);
    if (p->channels != 1)
        PART("%schannels=%d", n ? "," : "", (int)p->channels);
    if (p->space_ndim > 0) {
        PART("%sspace=%d", n ? "," : "", (int)p->space[0]);
        for (int d = 1; d < p->space_ndim && d < 3; d++)
            PART("x%d", (int)p->space[d]);
    }
    if (p->domains > 1)
        PART("%sdomains=%d", n ? "," : "", (int)p->domains);
    else if (p->stages != 1)
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
    if (p->layers != 1)
        PART("%slayers=%d", n ? "," : "", (int)p->layers);
    if (p->levels != 1)
        PART("%slevels=%d", n ? "," : "", (int)p->levels);
    if (p->levels != 1 || p->layers != 1) { /* the MGRIT settings, when they matter */
        PART("%scf=%d,iters=%d,biters=%d,relax=%s", n ? "," : "", (int)p->cf, (int)p->iters,
             (int)p->biters, p->relax == TSL_RELAX_F ? "F" : "FCF");
        if (p->skip != TSL_PLAN_SKIP_DEFAULT)
            PART(",skip=%d", (int)p->skip);
        if (p->infer != TSL_INFER_EXACT)
            PART(",infer=mgrit");
    } else {
        if (p->cf != 2)
            PART("%scf=%d", n ? "," : "", (int)p->cf);
        if (p->iters != 2)
            PART("%siters=%d", n ? "," : "", (int)p->iters);
        if (p->biters != 1)
            PART("%sbiters=%d", n ? "," : "", (int)p->biters);
        if (p->relax != TSL_RELAX_FCF)
            PART("%srelax=F", n ? "," : "");
        if (p->skip != TSL_PLAN_SKIP_DEFAULT)
            PART("%sskip=%d", n ? "," : "", (int)p->skip);
        if (p->infer != TSL_INFER_EXACT)
            PART("%sinfer=mgrit", n ? "," : "");
    }
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
    char text[256] = "";
    tsl_plan_format(plan, text, sizeof text);
    if (tsl_plan_ranks(plan) != nranks)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "plan '%s' needs %lld ranks, this run has %d",
                         text, (long long)tsl_plan_ranks(plan), (int)nranks);
    if (plan->balance < 0 || plan->balance > 2)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "plan '%s': balance %d is not a balance", text,
                         (int)plan->balance);
    if (plan->domains > 1 && plan->stages != plan->domains)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s': domains=%d needs stages=%d (the domains' rank groups are "
                         "the stages'; tsl_plan_parse() sets both)",
                         text, (int)plan->domains, (int)plan->domains);
    if (plan->layers > 1 && plan->stages > 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s': layers= and stages= both split the depth; give one", text);
    if (plan->layers > 1 && plan->micro > 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s': layers= runs whole batches (micro=1), not micro=%d", text,
                         (int)plan->micro);
    if (plan->filters > 1 && plan->layers > 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s': filters= does not combine with layers= (MGRIT) yet", text);
    if (plan->channels > 1 && plan->layers > 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s': channels= does not combine with layers= (MGRIT) yet", text);
    if (plan->channels > 1 && plan->filters > 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s': channels= and filters= both cut the channels; give one", text);
    if (plan->cf < 2)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s': cf=%d; the coarsening factor must be at least 2", text,
                         (int)plan->cf);
    if (plan->relax != TSL_RELAX_F && plan->relax != TSL_RELAX_FCF)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "plan '%s': relax %d is not F or FCF", text,
                         (int)plan->relax);
    if (plan->space_ndim > input->ndim - 1)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "plan '%s' splits %d spatial dimensions, the samples have %d", text,
                         (int)plan->space_ndim, (int)input->ndim - 1);
    return TSL_OK;
}
