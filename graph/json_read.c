/* Model files: a network as JSON (docs/model-format.md), read with cJSON into graph builder
 * calls. Pure C. */
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
#include "file.h"
#include "json_internal.h"
#include "op_table.h"
#include "tessel/io.h"

/* ---- reading ---- */

typedef struct reader {
    const char *source; /* the path, or "model JSON" */
    int32_t ndim;
    const int64_t *dims;
    int64_t classes;
    tsl_graph_t graph;
    const cJSON *layers;
    int32_t count;      /* layers built so far */
    const char **names; /* per layer: the name later layers use, or NULL */
    int32_t *values;    /* per layer: the value it makes */
} reader;

typedef struct layer {
    reader *r;
    const cJSON *json;
    int32_t index;
    int32_t op;         /* enum layer_op, or -1 while unknown */
    tsl_activation act; /* L_ACTIVATION's kind */
    const char *name;
    int32_t ninputs;
    int32_t inputs[TSL_GRAPH_MAX_INPUTS];
    int32_t spatial; /* spatial dimensions of the first input */
} layer;

/* Record an error "SOURCE: [layers[I] 'NAME' (OP): ]MESSAGE". */
static tsl_status fail(const reader *r, const layer *l, tsl_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static tsl_status fail(const reader *r, const layer *l, tsl_status st, const char *fmt, ...)
{
    char what[512], where[256] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (l) {
        int n = snprintf(where, sizeof where, "layers[%d]", (int)l->index);
        if (l->name && n > 0 && (size_t)n < sizeof where)
            n += snprintf(where + n, sizeof where - (size_t)n, " '%s'", l->name);
        if (l->op >= 0 && n > 0 && (size_t)n < sizeof where)
            snprintf(where + n, sizeof where - (size_t)n, " (%s)", json_op_text(l->op, l->act));
        return tsl_error(NULL, st, "%s: %s: %s", r->source, where, what);
    }
    return tsl_error(NULL, st, "%s: %s", r->source, what);
}

/* The builder's message without its "tsl_graph_xxx: " prefix. */
static const char *builder_message(void)
{
    const char *m = tsl_last_error();
    const char *colon = strstr(m, ": ");
    return strncmp(m, "tsl_graph_", 10) == 0 && colon ? colon + 2 : m;
}

/* A graph builder's status, its error said of the layer. */
static tsl_status built(const layer *l, tsl_status st)
{
    return st ? fail(l->r, l, st, "%s", builder_message()) : TSL_OK;
}

/* "1x28x28" */
static void shape_text(const tsl_shape *s, char *out, size_t size)
{
    size_t n = 0;
    out[0] = '\0';
    for (int d = 0; d < s->ndim && n < size; d++)
        n += (size_t)snprintf(out + n, size - n, "%s%lld", d ? "x" : "", (long long)s->dims[d]);
}

/* Reject keys that are not in `allowed` (listing those that are) and keys given twice. */
static tsl_status check_keys(const reader *r, const layer *l, const cJSON *object, uint32_t allowed,
                             const char *const *names, int32_t count, const char *what)
{
    for (const cJSON *item = object->child; item; item = item->next) {
        for (const cJSON *earlier = object->child; earlier != item; earlier = earlier->next)
            if (strcmp(earlier->string, item->string) == 0)
                return fail(r, l, TSL_ERR_FORMAT, "key '%s' is given twice", item->string);
        int32_t k = 0;
        while (k < count && strcmp(names[k], item->string) != 0)
            k++;
        if (k < count && (allowed & BIT(k)))
            continue;
        char list[512];
        size_t n = 0;
        list[0] = '\0';
        for (int32_t j = 0; j < count; j++)
            if ((allowed & BIT(j)) && n < sizeof list)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? ", " : "", names[j]);
        return fail(r, l, TSL_ERR_FORMAT, "unknown key '%s' (%s takes: %s)", item->string, what,
                    list);
    }
    return TSL_OK;
}

/* An integer in [min, MAX_ATTRIBUTE] from a JSON number; -1 if it is not one. */
static int json_int(const cJSON *item, int64_t min, int64_t *out)
{
    if (!cJSON_IsNumber(item))
        return -1;
    double v = item->valuedouble;
    if (!(v >= (double)min && v <= (double)MAX_ATTRIBUTE) || (double)(int64_t)v != v)
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* An integer attribute (>= min), `fallback` when absent. */
static tsl_status get_int(const layer *l, enum key k, int64_t min, int64_t fallback, int64_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[k]);
    *out = fallback;
    if (item && json_int(item, min, out))
        return fail(l->r, l, TSL_ERR_FORMAT, "'%s' must be an integer >= %lld", json_key_names[k],
                    (long long)min);
    return TSL_OK;
}

/* A per-dimension attribute: one integer (>= min) for every spatial dimension, or an array of
 * one per dimension. `fallback` (spatial entries) when absent; required when it is NULL. */
static tsl_status get_ints(const layer *l, enum key k, int64_t min, const int64_t *fallback,
                           int64_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[k]);
    if (!item) {
        if (!fallback)
            return fail(l->r, l, TSL_ERR_FORMAT, "'%s' is required", json_key_names[k]);
        memcpy(out, fallback, sizeof *out * (size_t)l->spatial);
        return TSL_OK;
    }
    int ok = 1;
    if (cJSON_IsArray(item)) {
        ok = cJSON_GetArraySize(item) == l->spatial;
        int32_t d = 0;
        for (const cJSON *e = item->child; ok && e; e = e->next)
            ok = json_int(e, min, &out[d++]) == 0;
    } else {
        ok = json_int(item, min, &out[0]) == 0;
        for (int32_t d = 1; ok && d < l->spatial; d++)
            out[d] = out[0];
    }
    if (!ok)
        return fail(l->r, l, TSL_ERR_FORMAT,
                    "'%s' must be an integer >= %lld or an array of %d of them (one per spatial "
                    "dimension of its input)",
                    json_key_names[k], (long long)min, (int)l->spatial);
    return TSL_OK;
}

/* A required array of one integer >= 0 per sample axis of the layer's input (C first). */
static tsl_status get_axes(const layer *l, enum key k, int64_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[k]);
    int32_t n = l->r->graph->values[l->inputs[0]].shape.ndim, d = 0;
    int ok = cJSON_IsArray(item) && cJSON_GetArraySize(item) == n;
    for (const cJSON *e = ok ? item->child : NULL; ok && e; e = e->next)
        ok = json_int(e, 0, &out[d++]) == 0;
    if (!ok)
        return fail(l->r, l, TSL_ERR_FORMAT,
                    "'%s' must be an array of %d integers >= 0, one per axis of a sample "
                    "(channels first)",
                    json_key_names[k], (int)n);
    return TSL_OK;
}

static tsl_status get_bool(const layer *l, enum key k, int32_t fallback, int32_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[k]);
    *out = fallback;
    if (!item)
        return TSL_OK;
    if (!cJSON_IsBool(item))
        return fail(l->r, l, TSL_ERR_FORMAT, "'%s' must be true or false", json_key_names[k]);
    *out = cJSON_IsTrue(item);
    return TSL_OK;
}

static tsl_status get_number(const layer *l, enum key k, double fallback, double *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[k]);
    *out = fallback;
    if (!item)
        return TSL_OK;
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return fail(l->r, l, TSL_ERR_FORMAT, "'%s' must be a finite number", json_key_names[k]);
    *out = item->valuedouble;
    return TSL_OK;
}

/* "out": a count, or "classes" for the data's class count. */
static tsl_status get_out(const layer *l, int64_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, "out");
    if (!item)
        return fail(l->r, l, TSL_ERR_FORMAT, "'out' is required");
    if (cJSON_IsString(item) && strcmp(item->valuestring, "classes") == 0) {
        if (l->r->classes < 1)
            return fail(l->r, l, TSL_ERR_INVALID_ARG,
                        "\"out\": \"classes\" needs the data's class count, and none was given");
        *out = l->r->classes;
        return TSL_OK;
    }
    if (json_int(item, 1, out))
        return fail(l->r, l, TSL_ERR_FORMAT, "'out' must be an integer >= 1 or \"classes\"");
    return TSL_OK;
}

/* The layer named `name` among those read so far, or -1. */
static int32_t find_layer(const reader *r, const char *name)
{
    for (int32_t i = 0; i < r->count; i++)
        if (r->names[i] && strcmp(r->names[i], name) == 0)
            return i;
    return -1;
}

/* Why `name` is not a layer to read from: a later layer, or none. */
static tsl_status no_layer(const reader *r, const layer *l, const char *name, const char *what)
{
    int32_t i = 0;
    for (const cJSON *e = r->layers->child; e; e = e->next, i++) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (i >= r->count && cJSON_IsString(n) && strcmp(n->valuestring, name) == 0)
            return fail(r, l, TSL_ERR_FORMAT,
                        "%s '%s' is layers[%d], not an earlier layer (layers read earlier "
                        "layers only)",
                        what, name, (int)i);
    }
    return fail(r, l, TSL_ERR_FORMAT, "%s '%s' is no layer's name", what, name);
}

/* "name": optional but for layers that own parameters; unique among the layers. */
static tsl_status read_name(layer *l)
{
    const reader *r = l->r;
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, "name");
    if (!item) {
        if (json_specs[l->op].named)
            return fail(r, l, TSL_ERR_FORMAT,
                        "a %s layer needs a \"name\" (its parameters' prefix)",
                        json_op_text(l->op, l->act));
        if (l->op == L_INPUT && l->index > 0)
            return fail(r, l, TSL_ERR_FORMAT, "an input after the first needs a \"name\"");
        l->name = l->op == L_INPUT ? "input" : NULL;
    } else if (!cJSON_IsString(item) || !item->valuestring[0] ||
               strlen(item->valuestring) >= TSL_GRAPH_NAME_MAX) {
        return fail(r, l, TSL_ERR_FORMAT, "\"name\" must be a non-empty string of at most %d bytes",
                    TSL_GRAPH_NAME_MAX - 1);
    }
    int32_t earlier = l->name ? find_layer(r, l->name) : -1;
    if (earlier >= 0)
        return fail(r, l, TSL_ERR_FORMAT, "the name '%s' is already used by layers[%d]", l->name,
                    (int)earlier);
    return TSL_OK;
}

/* "inputs": names of earlier layers; the previous layer when absent. */
static tsl_status read_inputs(layer *l)
{
    const reader *r = l->r;
    const layer_spec *spec = &json_specs[l->op];
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, "inputs");
    l->ninputs = 0;
    if (spec->max_inputs == 0)
        return TSL_OK;
    if (!item) {
        if (spec->min_inputs > 1)
            return fail(r, l, TSL_ERR_FORMAT, "needs \"inputs\": the names of its %d inputs",
                        (int)spec->min_inputs);
        l->ninputs = 1;
        l->inputs[0] = r->values[l->index - 1];
        return TSL_OK;
    }
    int32_t count = cJSON_IsArray(item) ? cJSON_GetArraySize(item) : -1;
    if (count < spec->min_inputs || count > spec->max_inputs) {
        if (spec->min_inputs == spec->max_inputs)
            return fail(r, l, TSL_ERR_FORMAT,
                        "\"inputs\" must be an array of %d layer name%s, not %s",
                        (int)spec->min_inputs, spec->min_inputs > 1 ? "s" : "",
                        count < 0 ? "another type" : "that");
        return fail(r, l, TSL_ERR_FORMAT, "\"inputs\" must be an array of %d to %d layer names",
                    (int)spec->min_inputs, (int)spec->max_inputs);
    }
    for (const cJSON *e = item->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return fail(r, l, TSL_ERR_FORMAT, "\"inputs\" must hold layer names (strings)");
        int32_t i = find_layer(r, e->valuestring);
        if (i < 0)
            return no_layer(r, l, e->valuestring, "input");
        l->inputs[l->ninputs++] = r->values[i];
    }
    return TSL_OK;
}

static tsl_status read_input_layer(layer *l, int32_t *value)
{
    reader *r = l->r;
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, "shape");
    if (l->index > 0) { /* a further input: its own shape, required */
        int64_t dims[TSL_MAX_DIMS];
        int32_t n = cJSON_IsArray(item) ? cJSON_GetArraySize(item) : 0, d = 0;
        int ok = n >= 1 && n <= TSL_MAX_DIMS - 1;
        for (const cJSON *e = ok ? item->child : NULL; ok && e; e = e->next)
            ok = json_int(e, 1, &dims[d++]) == 0;
        if (!ok)
            return fail(r, l, TSL_ERR_FORMAT,
                        "an input after the first needs \"shape\": its sample shape (C, "
                        "spatial...), 1 to %d integers >= 1 (the data gives the first input's)",
                        TSL_MAX_DIMS - 1);
        return built(l, tsl_graph_add_input(r->graph, l->name, n, dims, value));
    }
    if (item) {
        int ok = cJSON_IsArray(item) && cJSON_GetArraySize(item) == r->ndim;
        int32_t d = 0;
        for (const cJSON *e = ok ? item->child : NULL; ok && e; e = e->next, d++) {
            int64_t size;
            ok = json_int(e, 1, &size) == 0 && size == r->dims[d];
        }
        if (!ok) {
            tsl_shape data;
            char text[128];
            tsl_shape_make(&data, r->ndim, r->dims);
            shape_text(&data, text, sizeof text);
            return fail(r, l, TSL_ERR_SHAPE,
                        "\"shape\" must be the samples' shape (C, spatial...), and the data's "
                        "samples are %s",
                        text);
        }
    }
    return built(l, tsl_graph_add_input(r->graph, l->name, r->ndim, r->dims, value));
}

static tsl_status read_conv(layer *l, int32_t *value)
{
    tsl_conv_params p;
    int64_t out, kernel[3];
    int32_t bias;
    int transposed = l->op == L_CONV_TRANSPOSE;
    tsl_conv_params_init(&p, l->spatial);
    tsl_status st = get_out(l, &out);
    if (st || (st = get_ints(l, K_KERNEL, 1, NULL, kernel)) ||
        (st = get_ints(l, K_STRIDE, 1, json_ones, p.stride)) ||
        (st = get_ints(l, K_PADDING, 0, json_zeros, p.padding)) ||
        (st = get_ints(l, K_DILATION, 1, json_ones, p.dilation)) ||
        (st = get_int(l, K_GROUPS, 1, 1, &p.groups)) || (st = get_bool(l, K_BIAS, 1, &bias)))
        return st;
    if (transposed && (st = get_ints(l, K_OUTPUT_PADDING, 0, json_zeros, p.output_padding)))
        return st;
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[K_PADDING_MODE]);
    if (mode) {
        p.padding_mode = -1;
        for (int32_t k = 0; cJSON_IsString(mode) && k < TSL_PADDING_MODE_COUNT; k++)
            if (strcmp(mode->valuestring, json_padding_mode_names[k]) == 0)
                p.padding_mode = k;
        if (p.padding_mode < 0)
            return fail(l->r, l, TSL_ERR_FORMAT,
                        "'padding_mode' must be \"zeros\", \"reflect\", \"replicate\" or "
                        "\"circular\"");
    }
    return built(l, tsl_graph_conv(l->r->graph, l->name, l->inputs[0], out, kernel, &p, transposed,
                                   bias, value));
}

static tsl_status read_pool(layer *l, int32_t *value)
{
    const tsl_shape *in = &l->r->graph->values[l->inputs[0]].shape;
    tsl_pool_params p;
    tsl_pool_params_init(&p, l->op == L_MAXPOOL ? TSL_POOL_MAX : TSL_POOL_AVG, l->spatial, 1);
    tsl_status st = TSL_OK;
    if (l->op == L_GLOBAL_AVGPOOL) {
        for (int32_t d = 0; d < l->spatial; d++)
            p.kernel[d] = p.stride[d] = in->dims[1 + d];
    } else if ((st = get_ints(l, K_KERNEL, 1, NULL, p.kernel)) ||
               (st = get_ints(l, K_STRIDE, 1, p.kernel, p.stride)) ||
               (st = get_ints(l, K_PADDING, 0, json_zeros, p.padding)) ||
               (st = get_bool(l, K_CEIL_MODE, 0, &p.ceil_mode)) ||
               (l->op == L_AVGPOOL &&
                (st = get_bool(l, K_COUNT_INCLUDE_PAD, 1, &p.count_include_pad)))) {
        return st;
    }
    return built(l, tsl_graph_pool(l->r->graph, l->inputs[0], &p, value));
}

/* An upsampling: by `scale` or to `size` (one of them). */
static tsl_status read_upsample(layer *l, int32_t *value)
{
    int64_t v[3];
    int linear = l->op == L_UPSAMPLE_LINEAR;
    int by_size = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[K_SIZE]) != NULL;
    if (by_size && cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[K_SCALE]))
        return fail(l->r, l, TSL_ERR_FORMAT, "'scale' and 'size' exclude each other");
    if (!by_size && !cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[K_SCALE]))
        return fail(l->r, l, TSL_ERR_FORMAT, "'scale' or 'size' is required");
    tsl_status st = get_ints(l, by_size ? K_SIZE : K_SCALE, 1, NULL, v);
    if (st)
        return st;
    tsl_graph_t g = l->r->graph;
    return built(l, by_size ? tsl_graph_upsample_size(g, l->inputs[0], v, linear, value)
                            : tsl_graph_upsample(g, l->inputs[0], v, linear, value));
}

/* Build the graph op of a layer whose op, name and inputs are known. */
static tsl_status build_layer(layer *l, int32_t *value)
{
    tsl_graph_t g = l->r->graph;
    int64_t count;
    double eps, momentum, slope = 0;
    int32_t bias;
    tsl_status st = TSL_OK;
    switch ((enum layer_op)l->op) {
    case L_INPUT:
        return read_input_layer(l, value);
    case L_CONV:
    case L_CONV_TRANSPOSE:
        return read_conv(l, value);
    case L_BATCHNORM:
        if ((st = get_number(l, K_EPS, DEFAULT_EPS, &eps)) ||
            (st = get_number(l, K_MOMENTUM, DEFAULT_MOMENTUM, &momentum)))
            return st;
        return built(l, tsl_graph_batchnorm(g, l->name, l->inputs[0], eps, momentum, value));
    case L_ACTIVATION: {
        const tsl_activation_info *info = tsl_activation_info_of(l->act);
        if (info->takes_slope && (st = get_number(l, K_SLOPE, info->default_slope, &slope)))
            return st;
        return built(l, tsl_graph_activation(g, l->inputs[0], l->act, slope, value));
    }
    case L_MAXPOOL:
    case L_AVGPOOL:
    case L_GLOBAL_AVGPOOL:
        return read_pool(l, value);
    case L_UPSAMPLE_NEAREST:
    case L_UPSAMPLE_LINEAR:
        return read_upsample(l, value);
    case L_CONCAT:
        return built(l, tsl_graph_concat(g, l->ninputs, l->inputs, value));
    case L_ADD: {
        double h;
        if ((st = get_number(l, K_H, 1.0, &h)))
            return st;
        if (l->ninputs > 2 && h != 1.0)
            return fail(l->r, l, TSL_ERR_FORMAT, "'h' takes an add of two inputs, not %d",
                        (int)l->ninputs);
        if (l->ninputs > 2)
            return built(l, tsl_graph_add_n(g, l->ninputs, l->inputs, value));
        return built(l, tsl_graph_add_scaled(g, l->inputs[0], l->inputs[1], h, value));
    }
    case L_SUB:
        return built(l, tsl_graph_sub(g, l->inputs[0], l->inputs[1], value));
    case L_MUL:
        return built(l, tsl_graph_mul(g, l->inputs[0], l->inputs[1], value));
    case L_SLICE: {
        int64_t start[TSL_MAX_DIMS], stop[TSL_MAX_DIMS];
        const cJSON *ch = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[K_CHANNELS]);
        if (ch) { /* "channels": [c0, c1]: those channels, all of every other axis */
            const tsl_shape *in = &g->values[l->inputs[0]].shape;
            if (cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[K_START]) ||
                cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[K_STOP]))
                return fail(l->r, l, TSL_ERR_FORMAT,
                            "give 'channels' or 'start' and 'stop', not both");
            int ok = cJSON_IsArray(ch) && cJSON_GetArraySize(ch) == 2 &&
                     json_int(ch->child, 0, &start[0]) == 0 &&
                     json_int(ch->child->next, 0, &stop[0]) == 0;
            if (!ok)
                return fail(l->r, l, TSL_ERR_FORMAT,
                            "'channels' must be [first, end], two integers >= 0");
            for (int32_t d = 1; d < in->ndim; d++) {
                start[d] = 0;
                stop[d] = in->dims[d];
            }
        } else if ((st = get_axes(l, K_START, start)) || (st = get_axes(l, K_STOP, stop)))
            return st;
        return built(l, tsl_graph_slice(g, l->inputs[0], start, stop, value));
    }
    case L_DROPOUT: {
        double p;
        if ((st = get_number(l, K_P, DEFAULT_DROPOUT, &p)))
            return st;
        return built(l, tsl_graph_dropout(g, l->inputs[0], p, value));
    }
    case L_GROUPNORM: {
        int64_t groups;
        if ((st = get_int(l, K_GROUPS, 1, -1, &groups)) ||
            (st = get_number(l, K_EPS, DEFAULT_EPS, &eps)))
            return st;
        if (groups < 0)
            return fail(l->r, l, TSL_ERR_FORMAT, "a group_norm needs \"groups\"");
        return built(l, tsl_graph_groupnorm(g, l->name, l->inputs[0], groups, eps, value));
    }
    case L_LAYERNORM:
    case L_INSTANCENORM:
        if ((st = get_number(l, K_EPS, DEFAULT_EPS, &eps)))
            return st;
        return built(l, l->op == L_LAYERNORM
                            ? tsl_graph_layernorm(g, l->name, l->inputs[0], eps, value)
                            : tsl_graph_instancenorm(g, l->name, l->inputs[0], eps, value));
    case L_FLATTEN:
        return built(l, tsl_graph_flatten(g, l->inputs[0], value));
    case L_LINEAR:
        if ((st = get_out(l, &count)) || (st = get_bool(l, K_BIAS, 1, &bias)))
            return st;
        return built(l, tsl_graph_linear(g, l->name, l->inputs[0], count, bias, value));
    case LAYER_OP_COUNT:
        break;
    }
    return fail(l->r, l, TSL_ERR_FORMAT, "no such op");
}

/* Spatial dimensions of the layer's first input; an error for ops that need 1 to 3. */
static tsl_status read_spatial(layer *l)
{
    if (l->ninputs == 0)
        return TSL_OK;
    const reader *r = l->r;
    const tsl_shape *s = &r->graph->values[l->inputs[0]].shape;
    l->spatial = s->ndim - 1;
    if (!json_specs[l->op].needs_space || (l->spatial >= 1 && l->spatial <= 3))
        return TSL_OK;
    char text[128];
    shape_text(s, text, sizeof text);
    return fail(r, l, TSL_ERR_SHAPE,
                "needs an input with channels and 1 to 3 spatial dimensions, not of shape %s",
                text);
}

/* "share": the name of an earlier layer whose parameters this one uses. */
static tsl_status read_share(layer *l, int32_t value)
{
    const cJSON *share = cJSON_GetObjectItemCaseSensitive(l->json, json_key_names[K_SHARE]);
    if (!share)
        return TSL_OK;
    if (!cJSON_IsString(share))
        return fail(l->r, l, TSL_ERR_FORMAT, "'share' must be the name of an earlier layer");
    int32_t from = find_layer(l->r, share->valuestring);
    if (from < 0)
        return no_layer(l->r, l, share->valuestring, "the shared layer");
    return built(l, tsl_graph_share_params(l->r->graph, value, l->r->values[from]));
}

static tsl_status read_layer(reader *r, const cJSON *json)
{
    layer l;
    memset(&l, 0, sizeof l);
    l.r = r;
    l.json = json;
    l.index = r->count;
    l.op = -1;
    if (!cJSON_IsObject(json))
        return fail(r, &l, TSL_ERR_FORMAT, "a layer must be a JSON object");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(json, "name");
    l.name = cJSON_IsString(name) ? name->valuestring : NULL;
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(json, "op");
    if (!cJSON_IsString(op))
        return fail(r, &l, TSL_ERR_FORMAT, "needs \"op\", a string");
    l.op = json_find_op(op->valuestring, &l.act);
    if (l.op < 0) {
        char known[512];
        json_op_list(known, sizeof known);
        return fail(r, &l, TSL_ERR_FORMAT, "unknown op '%s' (ops: %s)", op->valuestring, known);
    }
    if (l.index == 0 && l.op != L_INPUT)
        return fail(r, &l, TSL_ERR_FORMAT,
                    "the first layer must be the input ({\"op\": \"input\"})");
    char what[64];
    const char *text = json_op_text(l.op, l.act);
    snprintf(what, sizeof what, "a%s %s layer", strchr("aeiou", text[0]) ? "n" : "", text);
    tsl_status st =
        check_keys(r, &l, json, json_op_keys(l.op, l.act), json_key_names, KEY_COUNT, what);
    int32_t value = -1;
    if (st || (st = read_name(&l)) || (st = read_inputs(&l)) || (st = read_spatial(&l)))
        return st;
    int64_t stage;
    if ((st = get_int(&l, K_STAGE, 0, -1, &stage)) || (st = build_layer(&l, &value)) ||
        (st = read_share(&l, value)))
        return st;
    if (stage >= 0 && (st = built(&l, tsl_graph_set_stage(r->graph, value, (int32_t)stage))))
        return st;
    r->names[r->count] = l.name;
    r->values[r->count++] = value;
    return TSL_OK;
}

static const char *const top_keys[] = {"format", "version", "description",
                                       "layers", "output",  "losses"};

/* A loss term's "on" or "against": the name of a layer whose value it reads, into 1 + the value
 * (0 when the key is absent). */
static tsl_status read_term_value(reader *r, const cJSON *term, const char *key, int32_t k,
                                  int32_t *out)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(term, key);
    *out = 0;
    if (!name)
        return TSL_OK;
    char what[48];
    snprintf(what, sizeof what, "losses[%d]: \"%s\"", (int)k, key);
    if (!cJSON_IsString(name))
        return fail(r, NULL, TSL_ERR_FORMAT, "%s must be a layer name (a string)", what);
    int32_t i = find_layer(r, name->valuestring);
    if (i < 0)
        return no_layer(r, NULL, name->valuestring, what);
    *out = r->values[i] + 1;
    return TSL_OK;
}

/* "losses": [{"loss": "cross_entropy", "dice", "mse", "l1", "difference" or "similarity",
 * "weight": W (default 1), "on": LAYER (default the output), "against": LAYER (default the batch's
 * labels or targets)},
 * ...]. */
static tsl_status read_losses(reader *r, const cJSON *losses)
{
    static const char *const keys[] = {"loss", "weight", "on", "against"};
    int32_t n = cJSON_IsArray(losses) ? cJSON_GetArraySize(losses) : -1;
    if (n < 1 || n > TSL_MAX_LOSS_TERMS)
        return fail(r, NULL, TSL_ERR_FORMAT,
                    "\"losses\" must be an array of 1 to %d terms {\"loss\": NAME, \"weight\": W, "
                    "\"on\": LAYER, \"against\": LAYER}",
                    TSL_MAX_LOSS_TERMS);
    tsl_loss_term terms[TSL_MAX_LOSS_TERMS];
    memset(terms, 0, sizeof terms);
    int32_t k = 0;
    for (const cJSON *e = losses->child; e; e = e->next, k++) {
        tsl_status st;
        if (!cJSON_IsObject(e))
            return fail(r, NULL, TSL_ERR_FORMAT, "losses[%d]: a term must be a JSON object",
                        (int)k);
        if ((st = check_keys(r, NULL, e, 15u, keys, 4, "a loss term")))
            return st;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "loss");
        const cJSON *weight = cJSON_GetObjectItemCaseSensitive(e, "weight");
        if (!cJSON_IsString(name) || tsl_model_loss_parse(name->valuestring, &terms[k].kind))
            return fail(r, NULL, TSL_ERR_FORMAT,
                        "losses[%d]: needs \"loss\", cross_entropy, dice, mse, l1, difference or "
                        "similarity",
                        (int)k);
        terms[k].weight = weight ? weight->valuedouble : 1.0;
        if (weight && (!cJSON_IsNumber(weight) || !isfinite(weight->valuedouble) ||
                       !(weight->valuedouble > 0)))
            return fail(r, NULL, TSL_ERR_FORMAT,
                        "losses[%d]: \"weight\" must be a finite number above 0", (int)k);
        if ((st = read_term_value(r, e, "on", k, &terms[k].on)) ||
            (st = read_term_value(r, e, "against", k, &terms[k].against)))
            return st;
    }
    tsl_status st = tsl_graph_set_loss(r->graph, n, terms);
    return st ? fail(r, NULL, TSL_ERR_FORMAT, "\"losses\": %s", tsl_last_error()) : TSL_OK;
}

static tsl_status read_model(reader *r, const cJSON *root)
{
    if (!cJSON_IsObject(root))
        return fail(r, NULL, TSL_ERR_FORMAT, "a model file is a JSON object");
    int32_t count = (int32_t)(sizeof top_keys / sizeof top_keys[0]);
    tsl_status st = check_keys(r, NULL, root, (1u << count) - 1, top_keys, count, "a model file");
    if (st)
        return st;
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *description = cJSON_GetObjectItemCaseSensitive(root, "description");
    const cJSON *output = cJSON_GetObjectItemCaseSensitive(root, "output");
    const cJSON *losses = cJSON_GetObjectItemCaseSensitive(root, "losses");
    r->layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    int64_t v;
    if (!cJSON_IsString(format) || strcmp(format->valuestring, FORMAT_NAME) != 0)
        return fail(r, NULL, TSL_ERR_FORMAT, "not a model file: needs \"format\": \"%s\"",
                    FORMAT_NAME);
    if (!version || json_int(version, 1, &v))
        return fail(r, NULL, TSL_ERR_FORMAT, "needs \"version\", an integer >= 1");
    if (v > TSL_MODEL_FORMAT_VERSION)
        return fail(r, NULL, TSL_ERR_UNSUPPORTED,
                    "format version %lld is newer than this tessel reads (%d)", (long long)v,
                    TSL_MODEL_FORMAT_VERSION);
    if (description && !cJSON_IsString(description))
        return fail(r, NULL, TSL_ERR_FORMAT, "\"description\" must be a string");
    if (output && !cJSON_IsString(output))
        return fail(r, NULL, TSL_ERR_FORMAT, "\"output\" must be a layer name (a string)");
    count = cJSON_IsArray(r->layers) ? cJSON_GetArraySize(r->layers) : 0;
    if (count < 1)
        return fail(r, NULL, TSL_ERR_FORMAT, "needs \"layers\", a non-empty array of layers");
    r->names = calloc((size_t)count, sizeof *r->names);
    r->values = calloc((size_t)count, sizeof *r->values);
    if (!r->names || !r->values)
        return fail(r, NULL, TSL_ERR_OUT_OF_MEMORY, "out of memory");
    for (const cJSON *e = r->layers->child; e; e = e->next)
        if ((st = read_layer(r, e)))
            return st;
    int32_t last = count - 1;
    if (output && (last = find_layer(r, output->valuestring)) < 0)
        return no_layer(r, NULL, output->valuestring, "the output");
    if ((st = tsl_graph_set_output(r->graph, r->values[last])))
        return st;
    return losses ? read_losses(r, losses) : TSL_OK;
}

/* Parse `length` bytes of text (NUL at text[length]) from `source` into a new graph. */
static tsl_status parse(const char *source, const char *text, size_t length, int32_t ndim,
                        const int64_t *dims, int64_t classes, tsl_graph_t *graph)
{
    reader r;
    memset(&r, 0, sizeof r);
    r.source = source;
    if (memchr(text, '\0', length))
        return fail(&r, NULL, TSL_ERR_FORMAT, "not a model file: it holds a NUL byte");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, length + 1, &end, 1);
    if (!root) {
        size_t at = end && end >= text && end <= text + length ? (size_t)(end - text) : 0;
        int line = 1, column = 1;
        for (size_t i = 0; i < at; i++, column++)
            if (text[i] == '\n') {
                line++;
                column = 0;
            }
        char near[24];
        size_t n = 0;
        for (size_t i = at; i < length && n + 1 < sizeof near && text[i] != '\n'; i++)
            near[n++] = (unsigned char)text[i] < ' ' ? ' ' : text[i];
        near[n] = '\0';
        return fail(&r, NULL, TSL_ERR_FORMAT, "malformed JSON at line %d, column %d%s%s%s", line,
                    column, n ? " (near '" : " (at the end)", near, n ? "')" : "");
    }
    r.ndim = ndim;
    r.dims = dims;
    r.classes = classes;
    tsl_status st = tsl_graph_create(&r.graph);
    if (!st)
        st = read_model(&r, root);
    free(r.names);
    free(r.values);
    cJSON_Delete(root);
    if (st) {
        tsl_graph_destroy(r.graph);
        return st;
    }
    *graph = r.graph;
    return TSL_OK;
}

static tsl_status check_read_args(const char *fn, const void *source, int32_t ndim,
                                  const int64_t *dims, int64_t classes, tsl_graph_t *graph)
{
    if (!source || !graph || !dims)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "%s: NULL argument", fn);
    *graph = NULL;
    if (ndim < 1 || ndim > TSL_MAX_DIMS - 1 || classes < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "%s: samples have 1 to %d dimensions (not %d) and classes >= 0", fn,
                         TSL_MAX_DIMS - 1, (int)ndim);
    return TSL_OK;
}

tsl_status tsl_graph_parse_json(const char *text, int32_t ndim, const int64_t *sample_dims,
                                int64_t classes, tsl_graph_t *graph)
{
    tsl_status st =
        check_read_args("tsl_graph_parse_json", text, ndim, sample_dims, classes, graph);
    if (st)
        return st;
    return parse("model JSON", text, strlen(text), ndim, sample_dims, classes, graph);
}

/* The whole file, NUL-terminated. */
static tsl_status read_file(const char *path, char **out, size_t *length)
{
    const char *why;
    FILE *f = tsl_fopen_regular(path, &why);
    if (!f)
        return tsl_error(NULL, TSL_ERR_IO, "%s: cannot open the model file: %s", path, why);
    char *text = NULL;
    size_t n = 0, capacity = 0;
    tsl_status st = TSL_OK;
    for (;;) {
        if (n > MAX_FILE_BYTES) {
            st = tsl_error(NULL, TSL_ERR_FORMAT, "%s: larger than %d MiB, not a model file", path,
                           MAX_FILE_BYTES >> 20);
            break;
        }
        if (capacity - n < 2) {
            size_t bigger = capacity ? 2 * capacity : 4096;
            char *p = realloc(text, bigger);
            if (!p) {
                st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
                break;
            }
            text = p;
            capacity = bigger;
        }
        size_t got = fread(text + n, 1, capacity - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (!st && ferror(f))
        st = tsl_error(NULL, TSL_ERR_IO, "%s: cannot read the model file: %s", path,
                       strerror(errno));
    fclose(f);
    if (st) {
        free(text);
        return st;
    }
    text[n] = '\0';
    *out = text;
    *length = n;
    return TSL_OK;
}

tsl_status tsl_graph_read_json(const char *path, int32_t ndim, const int64_t *sample_dims,
                               int64_t classes, tsl_graph_t *graph)
{
    tsl_status st = check_read_args("tsl_graph_read_json", path, ndim, sample_dims, classes, graph);
    if (st)
        return st;
    char *text = NULL;
    size_t length = 0;
    if ((st = read_file(path, &text, &length)))
        return st;
    st = parse(path, text, length, ndim, sample_dims, classes, graph);
    free(text);
    return st;
}

tsl_status tsl_model_graph(const char *name_or_path, int32_t ndim, const int64_t *sample_dims,
                           int64_t classes, tsl_graph_t *graph)
{
    if (!name_or_path || !graph)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_model_graph: NULL argument");
    size_t n = strlen(name_or_path);
    if (strchr(name_or_path, '/') || (n >= 5 && strcmp(name_or_path + n - 5, ".json") == 0))
        return tsl_graph_read_json(name_or_path, ndim, sample_dims, classes, graph);
    tsl_status st = tsl_zoo_graph(name_or_path, ndim, sample_dims, classes, graph);
    if (st && strstr(tsl_last_error(), "no network named"))
        return tsl_error(NULL, st,
                         "%s; a model file is named by a path with '/' or ending in .json",
                         tsl_last_error());
    return st;
}
