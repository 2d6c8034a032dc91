/* Plan strings (include/tessel/plan.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "tessel/plan.h"

#define PLAN_MAX_VALUE (1L << 20)

tsl_status tsl_plan_init(tsl_plan *plan)
{
    if (!plan)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_init: plan is NULL");
    memset(plan, 0, sizeof *plan);
    plan->data = plan->stages = plan->micro = plan->tiles = 1;
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

tsl_status tsl_plan_parse(const char *text, tsl_plan *out)
{
    const char *fn = "tsl_plan_parse";
    if (!text || !out)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    tsl_plan p;
    tsl_plan_init(&p);
    static const char *const keys[] = {"data", "space", "stages", "micro", "tiles"};
    int seen[5] = {0};
    const char *at = text;
    while (*at) {
        size_t len = strcspn(at, ",");
        const char *eq = memchr(at, '=', len);
        if (!eq)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "plan '%s': '%.*s' is not KEY=VALUE (keys: data, space, stages, "
                             "micro, tiles)",
                             text, (int)len, at);
        size_t klen = (size_t)(eq - at), vlen = len - klen - 1;
        int k = -1;
        for (int i = 0; i < 5; i++)
            if (strlen(keys[i]) == klen && strncmp(at, keys[i], klen) == 0)
                k = i;
        if (k < 0)
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "plan '%s': unknown part '%.*s' (keys: data, space, stages, micro, "
                             "tiles)",
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
        } else {
            long value = plan_int(v, vlen);
            if (value < 0)
                return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                                 "plan '%s': %s='%.*s' is not an integer in [1, %ld]", text,
                                 keys[k], (int)vlen, v, PLAN_MAX_VALUE);
            int32_t *slot[5] = {&p.data, NULL, &p.stages, &p.micro, &p.tiles};
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
    if (p->tiles != 1)
        PART("%stiles=%d", n ? "," : "", (int)p->tiles);
    if (!n)
        PART("data=1");
#undef PART
    if (n >= size)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_plan_format: %zu bytes do not hold '%s'",
                         size, buf);
    memcpy(text, buf, n + 1);
    return TSL_OK;
}
