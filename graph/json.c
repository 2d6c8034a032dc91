/* Model files: a network as JSON (docs/model-format.md), read with cJSON into graph builder
 * calls, and written back from a graph. Pure C. */
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
#include "graph_internal.h"
#include "op_table.h"
#include "tessel/io.h"

#define FORMAT_NAME "tessel-model"
#define MAX_FILE_BYTES (16 << 20) /* a model file is a few kilobytes */
#define MAX_ATTRIBUTE 2147483647  /* sizes, counts and factors fit in 31 bits */

/* ---- the vocabulary: keys and layer ops ---- */

enum key {
    K_NAME,
    K_OP,
    K_INPUTS,
    K_SHAPE,
    K_OUT,
    K_KERNEL,
    K_STRIDE,
    K_PADDING,
    K_DILATION,
    K_GROUPS,
    K_OUTPUT_PADDING,
    K_BIAS,
    K_EPS,
    K_MOMENTUM,
    K_SLOPE,
    K_SCALE,
    K_COUNT_INCLUDE_PAD,
    K_STAGE,
    KEY_COUNT
};

static const char *const key_names[KEY_COUNT] = {"name",
                                                 "op",
                                                 "inputs",
                                                 "shape",
                                                 "out",
                                                 "kernel",
                                                 "stride",
                                                 "padding",
                                                 "dilation",
                                                 "groups",
                                                 "output_padding",
                                                 "bias",
                                                 "eps",
                                                 "momentum",
                                                 "slope",
                                                 "scale",
                                                 "count_include_pad",
                                                 "stage"};

#define BIT(k) (1u << (k))
#define COMMON_KEYS (BIT(K_NAME) | BIT(K_OP) | BIT(K_INPUTS) | BIT(K_STAGE))
#define CONV_KEYS                                                                                  \
    (COMMON_KEYS | BIT(K_OUT) | BIT(K_KERNEL) | BIT(K_STRIDE) | BIT(K_PADDING) | BIT(K_DILATION) | \
     BIT(K_GROUPS) | BIT(K_BIAS))
#define POOL_KEYS (COMMON_KEYS | BIT(K_KERNEL) | BIT(K_STRIDE) | BIT(K_PADDING))

enum layer_op {
    L_INPUT,
    L_CONV,
    L_CONV_TRANSPOSE,
    L_BATCHNORM,
    L_ACTIVATION, /* every row of the activation table, by its name */
    L_MAXPOOL,
    L_AVGPOOL,
    L_GLOBAL_AVGPOOL,
    L_UPSAMPLE_NEAREST,
    L_UPSAMPLE_LINEAR,
    L_CONCAT,
    L_ADD,
    L_FLATTEN,
    L_LINEAR,
    LAYER_OP_COUNT
};

typedef struct layer_spec {
    const char *op;
    uint32_t keys;       /* the keys a layer of this op may have */
    int32_t named;       /* the graph keeps its name (its parameters are named after it) */
    int32_t min_inputs;  /* 0: the input layer */
    int32_t max_inputs;  /* ... */
    int32_t needs_space; /* its input needs 1 to 3 spatial dimensions */
} layer_spec;

static const layer_spec specs[LAYER_OP_COUNT] = {
    [L_INPUT] = {"input", BIT(K_NAME) | BIT(K_OP) | BIT(K_SHAPE), 0, 0, 0, 0},
    [L_CONV] = {"conv", CONV_KEYS, 1, 1, 1, 1},
    [L_CONV_TRANSPOSE] = {"conv_transpose", CONV_KEYS | BIT(K_OUTPUT_PADDING), 1, 1, 1, 1},
    [L_BATCHNORM] = {"batchnorm", COMMON_KEYS | BIT(K_EPS) | BIT(K_MOMENTUM), 1, 1, 1, 0},
    [L_ACTIVATION] = {"activation", COMMON_KEYS, 0, 1, 1, 0},
    [L_MAXPOOL] = {"maxpool", POOL_KEYS, 0, 1, 1, 1},
    [L_AVGPOOL] = {"avgpool", POOL_KEYS | BIT(K_COUNT_INCLUDE_PAD), 0, 1, 1, 1},
    [L_GLOBAL_AVGPOOL] = {"global_avgpool", COMMON_KEYS, 0, 1, 1, 1},
    [L_UPSAMPLE_NEAREST] = {"upsample_nearest", COMMON_KEYS | BIT(K_SCALE), 0, 1, 1, 1},
    [L_UPSAMPLE_LINEAR] = {"upsample_linear", COMMON_KEYS | BIT(K_SCALE), 0, 1, 1, 1},
    [L_CONCAT] = {"concat", COMMON_KEYS, 0, 1, TSL_GRAPH_MAX_INPUTS, 0},
    [L_ADD] = {"add", COMMON_KEYS, 0, 2, 2, 0},
    [L_FLATTEN] = {"flatten", COMMON_KEYS, 0, 1, 1, 0},
    [L_LINEAR] = {"linear", COMMON_KEYS | BIT(K_OUT) | BIT(K_BIAS), 1, 1, 1, 0},
};

/* Defaults, as PyTorch's modules have them. */
#define DEFAULT_EPS 1e-5
#define DEFAULT_MOMENTUM 0.1
static const int64_t zeros[3] = {0, 0, 0}, ones[3] = {1, 1, 1};

/* The "op" of a layer: its spec's, or for an activation the activation table's name. */
static const char *op_text(int32_t op, tsl_activation act)
{
    return op == L_ACTIVATION ? tsl_activation_info_of(act)->name : specs[op].op;
}

/* The keys a layer may have: its spec's, and "slope" for an activation that takes one. */
static uint32_t op_keys(int32_t op, tsl_activation act)
{
    return specs[op].keys |
           (op == L_ACTIVATION && tsl_activation_info_of(act)->takes_slope ? BIT(K_SLOPE) : 0);
}

/* The layer op named `name` (an activation's kind in *act), or -1. */
static int32_t find_op(const char *name, tsl_activation *act)
{
    if (tsl_activation_find(name, act) == 0)
        return L_ACTIVATION;
    for (int32_t op = 0; op < LAYER_OP_COUNT; op++)
        if (op != L_ACTIVATION && strcmp(specs[op].op, name) == 0)
            return op;
    return -1;
}

/* Every op a model file may name, comma-separated, in the specs' order. */
static void op_list(char *text, size_t size)
{
    size_t n = 0;
    text[0] = 0;
    for (int32_t op = 0; op < LAYER_OP_COUNT; op++)
        for (int k = 0; k < (op == L_ACTIVATION ? TSL_ACTIVATION_COUNT : 1); k++) {
            int w =
                snprintf(text + n, size - n, "%s%s", n ? ", " : "", op_text(op, (tsl_activation)k));
            if (w < 0 || (size_t)w >= size - n)
                return;
            n += (size_t)w;
        }
}

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
            snprintf(where + n, sizeof where - (size_t)n, " (%s)", op_text(l->op, l->act));
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
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, key_names[k]);
    *out = fallback;
    if (item && json_int(item, min, out))
        return fail(l->r, l, TSL_ERR_FORMAT, "'%s' must be an integer >= %lld", key_names[k],
                    (long long)min);
    return TSL_OK;
}

/* A per-dimension attribute: one integer (>= min) for every spatial dimension, or an array of
 * one per dimension. `fallback` (spatial entries) when absent; required when it is NULL. */
static tsl_status get_ints(const layer *l, enum key k, int64_t min, const int64_t *fallback,
                           int64_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, key_names[k]);
    if (!item) {
        if (!fallback)
            return fail(l->r, l, TSL_ERR_FORMAT, "'%s' is required", key_names[k]);
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
                    key_names[k], (long long)min, (int)l->spatial);
    return TSL_OK;
}

static tsl_status get_bool(const layer *l, enum key k, int32_t fallback, int32_t *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, key_names[k]);
    *out = fallback;
    if (!item)
        return TSL_OK;
    if (!cJSON_IsBool(item))
        return fail(l->r, l, TSL_ERR_FORMAT, "'%s' must be true or false", key_names[k]);
    *out = cJSON_IsTrue(item);
    return TSL_OK;
}

static tsl_status get_number(const layer *l, enum key k, double fallback, double *out)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(l->json, key_names[k]);
    *out = fallback;
    if (!item)
        return TSL_OK;
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return fail(l->r, l, TSL_ERR_FORMAT, "'%s' must be a finite number", key_names[k]);
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
        if (specs[l->op].named)
            return fail(r, l, TSL_ERR_FORMAT,
                        "a %s layer needs a \"name\" (its parameters' prefix)",
                        op_text(l->op, l->act));
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
    const layer_spec *spec = &specs[l->op];
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
    return built(l, tsl_graph_input(r->graph, r->ndim, r->dims, value));
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
        (st = get_ints(l, K_STRIDE, 1, ones, p.stride)) ||
        (st = get_ints(l, K_PADDING, 0, zeros, p.padding)) ||
        (st = get_ints(l, K_DILATION, 1, ones, p.dilation)) ||
        (st = get_int(l, K_GROUPS, 1, 1, &p.groups)) || (st = get_bool(l, K_BIAS, 1, &bias)))
        return st;
    if (transposed && (st = get_ints(l, K_OUTPUT_PADDING, 0, zeros, p.output_padding)))
        return st;
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
               (st = get_ints(l, K_PADDING, 0, zeros, p.padding)) ||
               (l->op == L_AVGPOOL &&
                (st = get_bool(l, K_COUNT_INCLUDE_PAD, 1, &p.count_include_pad)))) {
        return st;
    }
    return built(l, tsl_graph_pool(l->r->graph, l->inputs[0], &p, value));
}

/* Build the graph op of a layer whose op, name and inputs are known. */
static tsl_status build_layer(layer *l, int32_t *value)
{
    tsl_graph_t g = l->r->graph;
    int64_t count, scale[3];
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
        if ((st = get_ints(l, K_SCALE, 1, NULL, scale)))
            return st;
        return built(l,
                     tsl_graph_upsample(g, l->inputs[0], scale, l->op == L_UPSAMPLE_LINEAR, value));
    case L_CONCAT:
        return built(l, tsl_graph_concat(g, l->ninputs, l->inputs, value));
    case L_ADD:
        return built(l, tsl_graph_add(g, l->inputs[0], l->inputs[1], value));
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
    if (!specs[l->op].needs_space || (l->spatial >= 1 && l->spatial <= 3))
        return TSL_OK;
    char text[128];
    shape_text(s, text, sizeof text);
    return fail(r, l, TSL_ERR_SHAPE,
                "needs an input with channels and 1 to 3 spatial dimensions, not of shape %s",
                text);
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
    l.op = find_op(op->valuestring, &l.act);
    if (l.op < 0) {
        char known[512];
        op_list(known, sizeof known);
        return fail(r, &l, TSL_ERR_FORMAT, "unknown op '%s' (ops: %s)", op->valuestring, known);
    }
    if ((l.index == 0) != (l.op == L_INPUT))
        return fail(r, &l, TSL_ERR_FORMAT,
                    l.index == 0 ? "the first layer must be the input ({\"op\": \"input\"})"
                                 : "a network has one input, the first layer");
    char what[64];
    const char *text = op_text(l.op, l.act);
    snprintf(what, sizeof what, "a%s %s layer", strchr("aeiou", text[0]) ? "n" : "", text);
    tsl_status st = check_keys(r, &l, json, op_keys(l.op, l.act), key_names, KEY_COUNT, what);
    int32_t value = -1;
    if (st || (st = read_name(&l)) || (st = read_inputs(&l)) || (st = read_spatial(&l)))
        return st;
    int64_t stage;
    if ((st = get_int(&l, K_STAGE, 0, -1, &stage)) || (st = build_layer(&l, &value)))
        return st;
    if (stage >= 0 && (st = built(&l, tsl_graph_set_stage(r->graph, value, (int32_t)stage))))
        return st;
    r->names[r->count] = l.name;
    r->values[r->count++] = value;
    return TSL_OK;
}

static const char *const top_keys[] = {"format", "version", "description", "layers", "output"};

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
    return tsl_graph_set_output(r->graph, r->values[last]);
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
    FILE *f = fopen(path, "rb");
    if (!f)
        return tsl_error(NULL, TSL_ERR_IO, "%s: cannot open the model file: %s", path,
                         strerror(errno));
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
    _Static_assert(TSL_OP_KIND_COUNT == 10, "layer_op_of() and add_attributes() take every kind");
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
        return !cJSON_AddNumberToObject(o, key_names[k], (double)v[0]);
    cJSON *array = cJSON_AddArrayToObject(o, key_names[k]);
    int failed = !array;
    for (int32_t d = 0; d < n && !failed; d++)
        failed = !cJSON_AddItemToArray(array, cJSON_CreateNumber((double)v[d]));
    return failed;
}

/* A finite double as the shortest text that reads back to the same bits (cJSON's own
 * printing accepts a last-digit difference), with '.' whatever the locale. */
static int add_number(cJSON *o, enum key k, double v, double fallback)
{
    if (v == fallback)
        return 0;
    char number[40];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(number, sizeof number, "%.*g", digits, v);
        if (strtod(number, NULL) == v)
            break;
    }
    char point = localeconv()->decimal_point[0];
    for (char *c = number; *c; c++)
        if (*c == point)
            *c = '.';
    return !cJSON_AddRawToObject(o, key_names[k], number);
}

static int add_bool(cJSON *o, enum key k, int32_t v, int32_t fallback)
{
    return (v != 0) != (fallback != 0) && !cJSON_AddBoolToObject(o, key_names[k], v != 0);
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
    switch (op) {
    case L_CONV:
    case L_CONV_TRANSPOSE:
        return add_out(j, g, o) ||
               add_ints(j, K_KERNEL, g->params[o->params[0]].shape.dims + 2, c->spatial, NULL) ||
               add_ints(j, K_STRIDE, c->stride, c->spatial, ones) ||
               add_ints(j, K_PADDING, c->padding, c->spatial, zeros) ||
               add_ints(j, K_DILATION, c->dilation, c->spatial, ones) ||
               add_ints(j, K_GROUPS, &c->groups, 1, ones) ||
               (op == L_CONV_TRANSPOSE &&
                add_ints(j, K_OUTPUT_PADDING, c->output_padding, c->spatial, zeros)) ||
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
               add_ints(j, K_PADDING, p->padding, p->spatial, zeros) ||
               (op == L_AVGPOOL && add_bool(j, K_COUNT_INCLUDE_PAD, p->count_include_pad, 1));
    case L_UPSAMPLE_NEAREST:
    case L_UPSAMPLE_LINEAR:
        return add_ints(j, K_SCALE, o->scale, spatial, NULL);
    case L_LINEAR:
        return add_out(j, g, o) || add_bool(j, K_BIAS, o->bias, 1);
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
            const char *op = op_text(layer_op_of(g, o), o->act);
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
        failed = !cJSON_AddStringToObject(j, "op", op_text(op, o->act));
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
    text_put(&t, "\n}\n");
    cJSON_Delete(output);
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
