/* The model zoo: networks built with the graph API, named as PyTorch modules would name
 * their layers, so their parameter files match a PyTorch model written the same way. */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"

static const char *const names[] = {"cnn"};
static const char *const descriptions[] = {
    "two conv-batchnorm-ReLU-maxpool blocks (32 and 64 channels), a 128-unit hidden layer "
    "and a linear classifier; 1-D, 2-D or 3-D samples (Fashion-MNIST: 28x28)"};

const char *const *tsl_zoo_names(int32_t *count, const char *const **desc)
{
    if (count)
        *count = (int32_t)(sizeof names / sizeof names[0]);
    if (desc)
        *desc = descriptions;
    return names;
}

/* conv (no bias) -> batch norm -> ReLU -> 2x max pool; returns the pooled value. */
static tsl_status conv_block(tsl_graph_t g, int index, int32_t x, int64_t channels, int spatial,
                             int32_t *out)
{
    char conv[16], bn[16];
    snprintf(conv, sizeof conv, "conv%d", index);
    snprintf(bn, sizeof bn, "bn%d", index);
    tsl_conv_params p;
    tsl_conv_params_init(&p, spatial);
    int64_t k[3] = {3, 3, 3};
    for (int d = 0; d < spatial; d++)
        p.padding[d] = 1;
    tsl_pool_params pool;
    tsl_pool_params_init(&pool, TSL_POOL_MAX, spatial, 2);
    int32_t v;
    tsl_status st = tsl_graph_conv(g, conv, x, channels, k, &p, 0, 0, &v);
    if (!st)
        st = tsl_graph_batchnorm(g, bn, v, 1e-5, 0.1, &v);
    if (!st)
        st = tsl_graph_activation(g, v, TSL_ACT_RELU, 0, &v);
    if (!st)
        st = tsl_graph_pool(g, v, &pool, out);
    return st;
}

static tsl_status build_cnn(tsl_graph_t g, int32_t ndim, const int64_t *dims, int64_t classes)
{
    int spatial = ndim - 1;
    if (spatial < 1 || spatial > 3)
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "zoo 'cnn': samples need 1 to 3 spatial dimensions after channels");
    for (int d = 0; d < spatial; d++)
        if (dims[1 + d] < 4)
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "zoo 'cnn': every spatial size must be at least 4 (two 2x poolings)");
    int32_t v;
    tsl_status st = tsl_graph_input(g, ndim, dims, &v);
    if (!st)
        st = conv_block(g, 1, v, 32, spatial, &v);
    if (!st)
        st = conv_block(g, 2, v, 64, spatial, &v);
    if (!st)
        st = tsl_graph_flatten(g, v, &v);
    if (!st)
        st = tsl_graph_linear(g, "fc1", v, 128, 1, &v);
    if (!st)
        st = tsl_graph_activation(g, v, TSL_ACT_RELU, 0, &v);
    if (!st)
        st = tsl_graph_linear(g, "fc2", v, classes, 1, &v);
    if (!st)
        st = tsl_graph_set_output(g, v);
    return st;
}

tsl_status tsl_zoo_graph(const char *name, int32_t ndim, const int64_t *dims, int64_t classes,
                         tsl_graph_t *graph)
{
    if (!name || !dims || !graph)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_zoo_graph: NULL argument");
    *graph = NULL;
    if (classes < 2)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_zoo_graph: %lld classes (want >= 2)",
                         (long long)classes);
    if (strcmp(name, "cnn") != 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_zoo_graph: no network named '%s' (the zoo has: cnn)", name);
    tsl_graph_t g;
    tsl_status st = tsl_graph_create(&g);
    if (st)
        return st;
    st = build_cnn(g, ndim, dims, classes);
    if (st) {
        tsl_graph_destroy(g);
        return st;
    }
    *graph = g;
    return TSL_OK;
}
