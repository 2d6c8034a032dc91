/* Model files: a graph written back as JSON (docs/model-format.md). Pure C. */
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "error.h"
#include "json_internal.h"
#include "op_table.h"
#include "tessel/io.h"

/* ---- writing ---- */

/* A growing string; `failed` once an allocation failed. */
typedef struct text {
    char *data;
    size_t length, capacity;
    int failed;
} text;

static void text_add(text *t, const char *s, size_t n)
{
    if (t->failed)
        return;
    if (t->length + n + 1 > t->capacity) {
        size_t capacity = t->capacity ? 2 * t->capacity : 4096;
        while (capacity < t->length + n + 1)
            capacity *= 2;
        char *p = realloc(t->data, capacity);
        if (!p) {
            t->failed = 1;
            return;
        }
        t->data = p;
        t->capacity = capacity;
    }
    memcpy(t->data + t->length, s, n);
    t->length += n;
    t->data[t->length] = '\0';
}

static void text_put(text *t, const char *s)
{
    text_add(t, s, strlen(s));
}

/* Append cJSON's compact text of `item` with a space after each ',' and ':' between tokens:
 * one layer per line, readable. */
static void text_put_json(text *t, const cJSON *item)
{
    char *compact = item ? cJSON_PrintUnformatted(item) : NULL;
    if (!compact) {
        t->failed = 1;
        return;
    }
    int in_string = 0;
    for (const char *c = compact; *c; c++) {
        text_add(t, c, 1);
        if (in_string && *c == '\\' && c[1])
            text_add(t, ++c, 1);
        else if (*c == '"')
            in_string = !in_string;
        else if (!in_string && (*c == ',' || *c == ':'))
            text_add(t, " ", 1);
    }
    cJSON_free(compact);
}

/* An average pool over the whole spatial extent, with the settings "global_avgpool" reads. */
static int is_global_avgpool(const struct tsl_graph *g, const tsl_graph_op *o)
{
    const tsl_pool_params *p = &o->pool;
    const tsl_shape *in = &g->values[o->inputs[0]].shape;
    if (p->kind != TSL_POOL_AVG || !p->count_include_pad)
        return 0;
    for (int32_t d = 0; d < p->spatial; d++)
        if (p->kernel[d] != in->dims[1 + d] || p->stride[d] != p->kernel[d] || p->padding[d])
            return 0;
    return 1;
}

static enum layer_op layer_op_of(const struct tsl_graph *g, const tsl_graph_op *o)
{
    _Static_assert(TSL_OP_KIND_COUNT == 14, "layer_op_of() and add_attributes() take every kind");
    switch (o->kind) {
    case TSL_OP_INPUT:
        return L_INPUT;
    case TSL_OP_CONV:
        return o->transposed ? L_CONV_TRANSPOSE : L_CONV;
    case TSL_OP_BATCHNORM:
        return L_BATCHNORM;
    case TSL_OP_ACTIVATION:
        return L_ACTIVATION;
    case TSL_OP_POOL:
        return o->pool.kind == TSL_POOL_MAX ? L_MAXPOOL
               : is_global_avgpool(g, o)    ? L_GLOBAL_AVGPOOL
                                            : L_AVGPOOL;
    case TSL_OP_UPSAMPLE:
        return o->linear ? L_UPSAMPLE_LINEAR : L_UPSAMPLE_NEAREST;
    case TSL_OP_CONCAT:
        return L_CONCAT;
    case TSL_OP_ADD:
        return L_ADD;
    case TSL_OP_FLATTEN:
        return L_FLATTEN;
    case TSL_OP_LINEAR:
        return L_LINEAR;
    case TSL_OP_MUL:
        return L_MUL;
    case TSL_OP_SLICE:
        return L_SLICE;
    case TSL_OP_DROPOUT:
        return L_DROPOUT;
    case TSL_OP_GROUPNORM:
        return o->norm_kind == 1 ? L_LAYERNORM : o->norm_kind == 2 ? L_INSTANCENORM : L_GROUPNORM;
    }
    return LAYER_OP_COUNT;
}

/* A per-dimension attribute: left out when it is `fallback` everywhere, one number when the
 * dimensions agree, an array otherwise. */
static int add_ints(cJSON *o, enum key k, const int64_t *v, int32_t n, const int64_t *fallback)
{
    int same = 1, is_fallback = fallback != NULL;
    for (int32_t d = 0; d < n; d++) {
        same = same && v[d] == v[0];
        is_fallback = is_fallback && v[d] == fallback[d];
    }
    if (is_fallback)
        return 0;
    if (same)
        return !cJSON_AddNumberToObject(o, json_key_names[k], (double)v[0]);
    cJSON *array = cJSON_AddArrayToObject(o, json_key_names[k]);
    int failed = !array;
    for (int32_t d = 0; d < n && !failed; d++)
        failed = !cJSON_AddItemToArray(array, cJSON_CreateNumber((double)v[d]));
    return failed;
}

/* A finite double as the shortest text that reads back to the same bits (cJSON's own
 * printing accepts a last-digit difference), with '.' whatever the locale. */
static void shortest_number(char number[40], double v)
{
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(number, 40, "%.*g", digits, v);
        if (strtod(number, NULL) == v)
            break;
    }
    char point = localeconv()->decimal_point[0];
    for (char *c = number; *c; c++)
        if (*c == point)
            *c = '.';
}

static int add_number(cJSON *o, enum key k, double v, double fallback)
{
    if (v == fallback)
        return 0;
    char number[40];
    shortest_number(number, v);
    return !cJSON_AddRawToObject(o, json_key_names[k], number);
}

static int add_bool(cJSON *o, enum key k, int32_t v, int32_t fallback)
{
    return (v != 0) != (fallback != 0) && !cJSON_AddBoolToObject(o, json_key_names[k], v != 0);
}

/* "out": the output channels or features; "classes" for the layer that makes the output. */
static int add_out(cJSON *o, const struct tsl_graph *g, const tsl_graph_op *op)
{
    if (op->output == g->output)
        return !cJSON_AddStringToObject(o, "out", "classes");
    return !cJSON_AddNumberToObject(o, "out", (double)g->values[op->output].shape.dims[0]);
}

/* The attributes of op `o` that differ from what the reader assumes; nonzero when out of
 * memory. */
static int add_attributes(cJSON *j, const struct tsl_graph *g, const tsl_graph_op *o,
                          enum layer_op op)
{
    const tsl_conv_params *c = &o->conv;
    const tsl_pool_params *p = &o->pool;
    int32_t spatial = g->values[o->output].shape.ndim - 1;
    if (op == L_INPUT && o->output != g->input) { /* a further input: its shape, an array */
        const tsl_shape *s = &g->values[o->output].shape;
        cJSON *array = cJSON_AddArrayToObject(j, json_key_names[K_SHAPE]);
        int failed = !array;
        for (int32_t d = 0; d < s->ndim && !failed; d++)
            failed = !cJSON_AddItemToArray(array, cJSON_CreateNumber((double)s->dims[d]));
        return failed;
    }
    switch (op) {
    case L_CONV:
    case L_CONV_TRANSPOSE:
        return add_out(j, g, o) ||
               add_ints(j, K_KERNEL, g->params[o->params[0]].shape.dims + 2, c->spatial, NULL) ||
               add_ints(j, K_STRIDE, c->stride, c->spatial, json_ones) ||
               add_ints(j, K_PADDING, c->padding, c->spatial, json_zeros) ||
               add_ints(j, K_DILATION, c->dilation, c->spatial, json_ones) ||
               add_ints(j, K_GROUPS, &c->groups, 1, json_ones) ||
               (c->padding_mode != TSL_PADDING_ZEROS &&
                !cJSON_AddStringToObject(j, json_key_names[K_PADDING_MODE],
                                         json_padding_mode_names[c->padding_mode])) ||
               (op == L_CONV_TRANSPOSE &&
                add_ints(j, K_OUTPUT_PADDING, c->output_padding, c->spatial, json_zeros)) ||
               add_bool(j, K_BIAS, o->bias, 1);
    case L_BATCHNORM:
        return add_number(j, K_EPS, o->eps, DEFAULT_EPS) ||
               add_number(j, K_MOMENTUM, o->momentum, DEFAULT_MOMENTUM);
    case L_ACTIVATION: {
        const tsl_activation_info *info = tsl_activation_info_of(o->act);
        return info->takes_slope && add_number(j, K_SLOPE, o->slope, info->default_slope);
    }
    case L_MAXPOOL:
    case L_AVGPOOL:
        return add_ints(j, K_KERNEL, p->kernel, p->spatial, NULL) ||
               add_ints(j, K_STRIDE, p->stride, p->spatial, p->kernel) ||
               add_ints(j, K_PADDING, p->padding, p->spatial, json_zeros) ||
               add_bool(j, K_CEIL_MODE, p->ceil_mode, 0) ||
               (op == L_AVGPOOL && add_bool(j, K_COUNT_INCLUDE_PAD, p->count_include_pad, 1));
    case L_UPSAMPLE_NEAREST:
    case L_UPSAMPLE_LINEAR:
        return o->scale[0] ? add_ints(j, K_SCALE, o->scale, spatial, NULL)
                           : add_ints(j, K_SIZE, o->size, spatial, NULL);
    case L_LINEAR:
        return add_out(j, g, o) || add_bool(j, K_BIAS, o->bias, 1);
    case L_ADD:
        return add_number(j, K_H, o->h, 1.0);
    case L_DROPOUT:
        return add_number(j, K_P, o->p, DEFAULT_DROPOUT);
    case L_GROUPNORM:
        return add_ints(j, K_GROUPS, &o->norm_groups, 1, NULL) ||
               add_number(j, K_EPS, o->eps, DEFAULT_EPS);
    case L_LAYERNORM:
    case L_INSTANCENORM:
        return add_number(j, K_EPS, o->eps, DEFAULT_EPS);
    case L_SLICE: { /* over the sample axes, C first; "channels" where it keeps all of space */
        const tsl_shape *in = &g->values[o->inputs[0]].shape;
        int32_t n = in->ndim, whole = 1;
        for (int32_t d = 1; d < n; d++)
            whole &= o->start[d] == 0 && o->stop[d] == in->dims[d];
        if (whole) {
            cJSON *ch = cJSON_AddArrayToObject(j, json_key_names[K_CHANNELS]);
            return !ch || !cJSON_AddItemToArray(ch, cJSON_CreateNumber((double)o->start[0])) ||
                   !cJSON_AddItemToArray(ch, cJSON_CreateNumber((double)o->stop[0]));
        }
        cJSON *a = cJSON_AddArrayToObject(j, json_key_names[K_START]);
        cJSON *b = cJSON_AddArrayToObject(j, json_key_names[K_STOP]);
        int failed = !a || !b;
        for (int32_t d = 0; d < n && !failed; d++)
            failed = !cJSON_AddItemToArray(a, cJSON_CreateNumber((double)o->start[d])) ||
                     !cJSON_AddItemToArray(b, cJSON_CreateNumber((double)o->stop[d]));
        return failed;
    }
    default:
        return 0;
    }
}

/* Names for the layers: the op's own, or for an unnamed op that a layer other than the next
 * one reads (or the output), "<op>_<index>" made unique; "" when none is needed. */
static char (*layer_names(const struct tsl_graph *g))[TSL_GRAPH_NAME_MAX]
{
    char(*names)[TSL_GRAPH_NAME_MAX] = calloc((size_t)g->nops, sizeof *names);
    if (!names)
        return NULL;
    int32_t *wanted = calloc((size_t)g->nops, sizeof *wanted);
    if (!wanted) {
        free(names);
        return NULL;
    }
    wanted[g->values[g->output].producer] = 1;
    for (int32_t k = 0; k < g->nloss; k++) { /* the values loss terms read by name */
        if (g->loss[k].on)
            wanted[g->values[g->loss[k].on - 1].producer] = 1;
        if (g->loss[k].against)
            wanted[g->values[g->loss[k].against - 1].producer] = 1;
    }
    for (int32_t i = 0; i < g->nops; i++) {
        const tsl_graph_op *o = &g->ops[i];
        for (int32_t k = 0; k < o->ninputs; k++) {
            int32_t producer = g->values[o->inputs[k]].producer;
            if (o->ninputs > 1 || producer != i - 1)
                wanted[producer] = 1;
        }
    }
    for (int32_t i = 0; i < g->nops; i++) {
        const tsl_graph_op *o = &g->ops[i];
        if (o->name[0]) {
            memcpy(names[i], o->name, sizeof names[i]);
            continue;
        }
        if (!wanted[i])
            continue;
        for (int32_t attempt = 0, taken = 1; taken; attempt++) {
            const char *op = json_op_text(layer_op_of(g, o), o->act);
            if (attempt)
                snprintf(names[i], sizeof names[i], "%s_%d_%d", op, (int)i, (int)attempt);
            else
                snprintf(names[i], sizeof names[i], "%s_%d", op, (int)i);
            taken = 0;
            for (int32_t j = 0; j < g->nops && !taken; j++)
                taken = j != i &&
                        (strcmp(g->ops[j].name, names[i]) == 0 || strcmp(names[j], names[i]) == 0);
        }
    }
    free(wanted);
    return names;
}

/* One layer as a JSON object. */
static cJSON *layer_json(const struct tsl_graph *g, int32_t i,
                         const char (*names)[TSL_GRAPH_NAME_MAX])
{
    const tsl_graph_op *o = &g->ops[i];
    enum layer_op op = layer_op_of(g, o);
    cJSON *j = cJSON_CreateObject();
    int failed = !j || op == LAYER_OP_COUNT;
    if (!failed && names[i][0])
        failed = !cJSON_AddStringToObject(j, "name", names[i]);
    if (!failed)
        failed = !cJSON_AddStringToObject(j, "op", json_op_text(op, o->act));
    int previous = o->ninputs == 1 && g->values[o->inputs[0]].producer == i - 1;
    if (!failed && o->ninputs > 0 && !previous) {
        cJSON *inputs = cJSON_AddArrayToObject(j, "inputs");
        failed = !inputs;
        for (int32_t k = 0; k < o->ninputs && !failed; k++)
            failed = !cJSON_AddItemToArray(
                inputs, cJSON_CreateString(names[g->values[o->inputs[k]].producer]));
    }
    if (!failed)
        failed = add_attributes(j, g, o, op);
    if (!failed && o->nparams > 0 && g->params[o->params[0]].shares) {
        /* the op whose own parameter this one holds (tsl_graph_share_params()) */
        int32_t p = g->params[o->params[0]].shares - 1, s = 0;
        while (s < i && !(g->ops[s].nparams > 0 && g->ops[s].params[0] == p))
            s++;
        failed = s == i || !cJSON_AddStringToObject(j, "share", names[s]);
    }
    if (!failed && o->stage > 0)
        failed = !cJSON_AddNumberToObject(j, "stage", o->stage - 1);
    if (failed) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

tsl_status tsl_graph_print_json(tsl_graph_t g, char **out)
{
    const char *fn = "tsl_graph_print_json";
    if (!g || !out)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    *out = NULL;
    if (g->output < 0)
        return tsl_error(NULL, TSL_ERR_STATE, "%s: the graph has no output", fn);
    for (int32_t i = 0; i < g->nops; i++)
        if (!isfinite(g->ops[i].eps))
            return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                             "%s: '%s' has eps %g, and JSON has no infinities", fn, g->ops[i].name,
                             g->ops[i].eps);
    char(*names)[TSL_GRAPH_NAME_MAX] = layer_names(g);
    text t = {NULL, 0, 0, names == NULL};
    char header[128];
    snprintf(header, sizeof header,
             "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"layers\": [\n", FORMAT_NAME,
             TSL_MODEL_FORMAT_VERSION);
    text_put(&t, header);
    for (int32_t i = 0; i < g->nops && !t.failed; i++) {
        cJSON *json = layer_json(g, i, (const char(*)[TSL_GRAPH_NAME_MAX])names);
        text_put(&t, "    ");
        text_put_json(&t, json);
        text_put(&t, i + 1 < g->nops ? ",\n" : "\n");
        cJSON_Delete(json);
    }
    text_put(&t, "  ],\n  \"output\": ");
    cJSON *output = names ? cJSON_CreateString(names[g->values[g->output].producer]) : NULL;
    text_put_json(&t, output);
    cJSON_Delete(output);
    if (g->nloss) { /* the loss, where the graph names one */
        text_put(&t, ",\n  \"losses\": [");
        for (int32_t k = 0; k < g->nloss && !t.failed; k++) {
            char number[40], term[128];
            shortest_number(number, g->loss[k].weight);
            snprintf(term, sizeof term, "%s{\"loss\": \"%s\", \"weight\": %s", k ? ", " : "",
                     tsl_model_loss_name(g->loss[k].kind), number);
            text_put(&t, term);
            int32_t reads[2] = {g->loss[k].on, g->loss[k].against};
            for (int e = 0; e < 2 && names; e++) { /* the layers of the values it reads */
                if (!reads[e])
                    continue;
                text_put(&t, e ? ", \"against\": " : ", \"on\": ");
                cJSON *name = cJSON_CreateString(names[g->values[reads[e] - 1].producer]);
                text_put_json(&t, name);
                cJSON_Delete(name);
            }
            text_put(&t, "}");
        }
        text_put(&t, "]");
    }
    text_put(&t, "\n}\n");
    free(names);
    if (t.failed) {
        free(t.data);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    *out = t.data;
    return TSL_OK;
}

tsl_status tsl_graph_write_json(tsl_graph_t g, const char *path)
{
    if (!g || !path)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_graph_write_json: NULL argument");
    char *json;
    tsl_status st = tsl_graph_print_json(g, &json);
    if (st)
        return st;
    size_t tmp_len = strlen(path) + 32;
    char *tmp = malloc(tmp_len);
    if (!tmp) {
        tsl_free(json);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "tsl_graph_write_json: out of memory");
    }
    snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = tsl_error(NULL, TSL_ERR_IO, "%s: cannot create '%s': %s", path, tmp, strerror(errno));
    } else {
        size_t length = strlen(json);
        int ok = fwrite(json, 1, length, f) == length;
        ok = fflush(f) == 0 && ok;
        ok = fsync(fileno(f)) == 0 && ok;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, path) != 0) {
            st = tsl_error(NULL, TSL_ERR_IO, "%s: cannot write the model file: %s", path,
                           strerror(errno));
            unlink(tmp);
        }
    }
    free(tmp);
    tsl_free(json);
    return st;
}
