/* The model zoo: networks built with the graph API, named as PyTorch modules would name
 * their layers (nested modules joined by dots), so their parameter files match a PyTorch
 * model written the same way. Every network adapts to the sample's channels, its number of
 * spatial dimensions (1 to 3) and the number of classes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "graph_internal.h"

typedef struct zoo_entry {
    const char *name;
    const char *description;
    int dims; /* required spatial dimensions, 0: any */
} zoo_entry;

static const zoo_entry zoo[] = {
    {"cnn",
     "two conv-batchnorm-ReLU-maxpool blocks (32, 64 channels), a 128-unit hidden layer and a "
     "linear classifier (Fashion-MNIST: 28x28); 1-D, 2-D or 3-D",
     0},
    {"cnn1d",
     "three conv-batchnorm-ReLU-maxpool blocks (16, 32, 64), global average pooling, "
     "linear classifier; 1-D samples",
     1},
    {"cnn2d", "as cnn1d, for 2-D samples", 2},
    {"cnn3d", "as cnn1d, for 3-D volumes", 3},
    {"fcn2d",
     "fully convolutional segmentation: three conv-batchnorm-ReLU layers (32 channels, "
     "dilations 1, 2, 4) and a 1x1 classifier per pixel; 2-D samples",
     2},
    {"unet2d",
     "U-Net of depth 2 (16, 32, 64 channels): double convolutions, max pooling, "
     "transposed-convolution upsampling, skip concatenations, 1x1 classifier per "
     "pixel; 2-D samples with sides divisible by 4",
     2},
    {"unet3d", "as unet2d, for 3-D volumes (sides divisible by 4)", 3},
    {"resnet",
     "residual network: a 16-channel stem, three stages (16, 32, 64 channels, the "
     "last two halving the size) of basic blocks with identity or 1x1 projection "
     "shortcuts, global average pooling, linear classifier; 'resnet' has one block "
     "per stage, 'resnetN' N blocks; 1-D, 2-D or 3-D",
     0},
    {"odenet",
     "ODE network for layer-parallel training: an 8-channel conv-batchnorm-ReLU stem, N "
     "residual steps u + h F(u) of size h = 1/N with F = conv-batchnorm-ReLU-conv (8 "
     "channels, no pooling: one ODE segment), global average pooling, linear classifier; "
     "'odenetN', N from 1 to 4096; 1-D, 2-D or 3-D",
     0},
    {"odetanh", "as odenet, with tanh in F: 'odetanhN'", 0},
    {"dsn",
     "multi-domain separation network: each input channel is one domain's image of the "
     "sample (K >= 2 domains, at most 10; domain 0 labelled); per domain a private encoder "
     "and the shared encoder (two 3x3 conv-ReLU of 8 channels each, shared weights used by "
     "every domain), their codes (global average pooling, linear to 16) and the shared decoder "
     "(3x3 conv of their features' sum back to the image); losses: cross-entropy of a linear "
     "classifier on domain 0's shared code, each domain's reconstruction (MSE against its "
     "image, 0.1), the difference of its private and shared codes (0.001) and the similarity "
     "(MMD) of its shared code with domain 0's (0.01); "
     "plan domains=N puts the domains on N rank groups; 1-D, 2-D or 3-D",
     0},
};

enum { ZOO_SIZE = sizeof zoo / sizeof zoo[0] };

const char *const *tsl_zoo_names(int32_t *count, const char *const **desc)
{
    static const char *names[ZOO_SIZE], *descriptions[ZOO_SIZE];
    for (int i = 0; i < ZOO_SIZE; i++) {
        names[i] = zoo[i].name;
        descriptions[i] = zoo[i].description;
    }
    if (count)
        *count = ZOO_SIZE;
    if (desc)
        *desc = descriptions;
    return names;
}

/* Building state: the graph, the number of spatial dimensions, the first error. */
typedef struct builder {
    tsl_graph_t g;
    int spatial;
    tsl_status st;
} builder;

/* "prefix.name" (or "name" without a prefix). */
static const char *join(char *buf, size_t size, const char *prefix, const char *name)
{
    snprintf(buf, size, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", name);
    return buf;
}

static int32_t conv(builder *b, const char *name, int32_t x, int64_t channels, int64_t kernel,
                    int64_t stride, int64_t dilation, int bias)
{
    int32_t v = -1;
    if (b->st)
        return v;
    tsl_conv_params p;
    tsl_conv_params_init(&p, b->spatial);
    int64_t k[3] = {kernel, kernel, kernel};
    for (int d = 0; d < b->spatial; d++) {
        p.stride[d] = stride;
        p.dilation[d] = dilation;
        p.padding[d] = dilation * (kernel - 1) / 2;
    }
    b->st = tsl_graph_conv(b->g, name, x, channels, k, &p, 0, bias, &v);
    return v;
}

static int32_t unary(builder *b, int32_t x, int kind, const char *name)
{
    int32_t v = -1;
    if (b->st)
        return v;
    tsl_pool_params pool;
    switch (kind) {
    case 0:
        b->st = tsl_graph_activation(b->g, x, TSL_ACT_RELU, 0, &v);
        break;
    case 1:
        b->st = tsl_graph_batchnorm(b->g, name, x, 1e-5, 0.1, &v);
        break;
    case 2:
        tsl_pool_params_init(&pool, TSL_POOL_MAX, b->spatial, 2);
        b->st = tsl_graph_pool(b->g, x, &pool, &v);
        break;
    default: { /* global average pooling */
        tsl_shape s;
        tsl_graph_value_shape(b->g, x, &s);
        tsl_pool_params_init(&pool, TSL_POOL_AVG, b->spatial, 1);
        for (int d = 0; d < b->spatial; d++)
            pool.kernel[d] = pool.stride[d] = s.dims[1 + d];
        b->st = tsl_graph_pool(b->g, x, &pool, &v);
        if (!b->st)
            b->st = tsl_graph_flatten(b->g, v, &v);
    }
    }
    return v;
}

enum { RELU = 0, BN = 1, MAXPOOL = 2, GAP = 3 };

/* prefix.convK (no bias) -> prefix.bnK -> ReLU. */
static int32_t conv_bn_relu(builder *b, const char *prefix, int k, int32_t x, int64_t channels,
                            int64_t stride, int64_t dilation)
{
    char cn[TSL_GRAPH_NAME_MAX], bn[TSL_GRAPH_NAME_MAX], tmp[16];
    snprintf(tmp, sizeof tmp, "conv%d", k);
    join(cn, sizeof cn, prefix, tmp);
    snprintf(tmp, sizeof tmp, "bn%d", k);
    join(bn, sizeof bn, prefix, tmp);
    return unary(b, unary(b, conv(b, cn, x, channels, 3, stride, dilation, 0), BN, bn), RELU, NULL);
}

static int32_t linear(builder *b, const char *name, int32_t x, int64_t out)
{
    int32_t v = -1;
    if (!b->st)
        b->st = tsl_graph_linear(b->g, name, x, out, 1, &v);
    return v;
}

static void cnn(builder *b, int32_t x, int64_t classes)
{
    int32_t v = unary(b, conv_bn_relu(b, NULL, 1, x, 32, 1, 1), MAXPOOL, NULL);
    v = unary(b, conv_bn_relu(b, NULL, 2, v, 64, 1, 1), MAXPOOL, NULL);
    if (!b->st)
        b->st = tsl_graph_flatten(b->g, v, &v);
    v = linear(b, "fc2", unary(b, linear(b, "fc1", v, 128), RELU, NULL), classes);
    if (!b->st)
        b->st = tsl_graph_set_output(b->g, v);
}

static void cnn_gap(builder *b, int32_t x, int64_t classes)
{
    int32_t v = x;
    const int64_t widths[3] = {16, 32, 64};
    for (int k = 0; k < 3; k++)
        v = unary(b, conv_bn_relu(b, NULL, k + 1, v, widths[k], 1, 1), MAXPOOL, NULL);
    v = linear(b, "fc", unary(b, v, GAP, NULL), classes);
    if (!b->st)
        b->st = tsl_graph_set_output(b->g, v);
}

static void fcn(builder *b, int32_t x, int64_t classes)
{
    int32_t v = x;
    for (int k = 0; k < 3; k++)
        v = conv_bn_relu(b, NULL, k + 1, v, 32, 1, (int64_t)1 << k);
    v = conv(b, "classifier", v, classes, 1, 1, 1, 1);
    if (!b->st)
        b->st = tsl_graph_set_output(b->g, v);
}

/* Two conv-bn-relu layers named prefix.conv1/bn1, prefix.conv2/bn2. */
static int32_t double_conv(builder *b, const char *prefix, int32_t x, int64_t channels)
{
    return conv_bn_relu(b, prefix, 2, conv_bn_relu(b, prefix, 1, x, channels, 1, 1), channels, 1,
                        1);
}

static void unet(builder *b, int32_t x, int64_t classes)
{
    int32_t e1 = double_conv(b, "enc1", x, 16);
    int32_t e2 = double_conv(b, "enc2", unary(b, e1, MAXPOOL, NULL), 32);
    int32_t mid = double_conv(b, "bottleneck", unary(b, e2, MAXPOOL, NULL), 64);
    const int32_t skips[2] = {e2, e1};
    const int64_t widths[2] = {32, 16};
    int32_t v = mid;
    for (int level = 0; level < 2 && !b->st; level++) {
        char up[16], dec[16];
        snprintf(up, sizeof up, "up%d", 2 - level);
        snprintf(dec, sizeof dec, "dec%d", 2 - level);
        tsl_conv_params p;
        tsl_conv_params_init(&p, b->spatial);
        int64_t k[3] = {2, 2, 2};
        for (int d = 0; d < b->spatial; d++)
            p.stride[d] = 2;
        b->st = tsl_graph_conv(b->g, up, v, widths[level], k, &p, 1, 1, &v);
        int32_t parts[2] = {v, skips[level]};
        if (!b->st)
            b->st = tsl_graph_concat(b->g, 2, parts, &v);
        v = double_conv(b, dec, v, widths[level]);
    }
    v = conv(b, "classifier", v, classes, 1, 1, 1, 1);
    if (!b->st)
        b->st = tsl_graph_set_output(b->g, v);
}

/* A basic block: conv-bn-relu, conv-bn, plus the shortcut (identity, or a 1x1 strided
 * projection with batch norm when the shape changes), then ReLU. */
static int32_t basic_block(builder *b, const char *prefix, int32_t x, int64_t channels,
                           int64_t stride)
{
    char cn[TSL_GRAPH_NAME_MAX], bn[TSL_GRAPH_NAME_MAX];
    tsl_shape s;
    if (b->st)
        return -1;
    tsl_graph_value_shape(b->g, x, &s);
    int32_t v = conv_bn_relu(b, prefix, 1, x, channels, stride, 1);
    v = unary(b, conv(b, join(cn, sizeof cn, prefix, "conv2"), v, channels, 3, 1, 1, 0), BN,
              join(bn, sizeof bn, prefix, "bn2"));
    int32_t shortcut = x;
    if (stride != 1 || s.dims[0] != channels) {
        shortcut =
            conv(b, join(cn, sizeof cn, prefix, "downsample.0"), x, channels, 1, stride, 1, 0);
        shortcut = unary(b, shortcut, BN, join(bn, sizeof bn, prefix, "downsample.1"));
    }
    int32_t sum = -1;
    if (!b->st)
        b->st = tsl_graph_add(b->g, v, shortcut, &sum);
    return unary(b, sum, RELU, NULL);
}

/* The ODE network: stem, `steps` residual steps u + h F(u) (h = 1 / steps), head. */
static void odenet(builder *b, int32_t x, int64_t classes, int steps, int tanh_f)
{
    const int64_t width = 8;
    int32_t u = conv_bn_relu(b, NULL, 1, x, width, 1, 1);
    for (int k = 0; k < steps && !b->st; k++) {
        char prefix[32], cn[TSL_GRAPH_NAME_MAX], bn[TSL_GRAPH_NAME_MAX];
        snprintf(prefix, sizeof prefix, "steps.%d", k);
        int32_t f = unary(b, conv(b, join(cn, sizeof cn, prefix, "conv1"), u, width, 3, 1, 1, 0),
                          BN, join(bn, sizeof bn, prefix, "bn1"));
        if (tanh_f && !b->st)
            b->st = tsl_graph_activation(b->g, f, TSL_ACT_TANH, 0, &f);
        else
            f = unary(b, f, RELU, NULL);
        f = conv(b, join(cn, sizeof cn, prefix, "conv2"), f, width, 3, 1, 1, 1);
        if (!b->st)
            b->st = tsl_graph_add_scaled(b->g, f, u, 1.0 / steps, &u);
    }
    u = linear(b, "fc", unary(b, u, GAP, NULL), classes);
    if (!b->st)
        b->st = tsl_graph_set_output(b->g, u);
}

static void resnet(builder *b, int32_t x, int64_t classes, int blocks)
{
    int32_t v = conv_bn_relu(b, NULL, 1, x, 16, 1, 1);
    const int64_t widths[3] = {16, 32, 64};
    for (int stage = 0; stage < 3; stage++)
        for (int k = 0; k < blocks; k++) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "layer%d.%d", stage + 1, k);
            v = basic_block(b, prefix, v, widths[stage], stage > 0 && k == 0 ? 2 : 1);
        }
    v = linear(b, "fc", unary(b, v, GAP, NULL), classes);
    if (!b->st)
        b->st = tsl_graph_set_output(b->g, v);
}

/* Domain d's name of a shared op: `part` for domain 0 (whose op owns the weights), part_dD for
 * domain D's copy. */
static const char *domain_name(char *buf, size_t size, const char *part, int64_t d)
{
    if (d == 0)
        snprintf(buf, size, "%s", part);
    else
        snprintf(buf, size, "%s_d%lld", part, (long long)d);
    return buf;
}

/* The op just added (making v) shares the weights of domain 0's op *first (domain d > 0), or
 * becomes it (domain 0). */
static int32_t tie(builder *b, int32_t v, int64_t d, int32_t *first)
{
    if (!b->st && d > 0)
        b->st = tsl_graph_share_params(b->g, v, *first);
    if (d == 0)
        *first = v;
    return v;
}

/* The multi-domain separation network of the zoo entry (K = the input's channels, checked by
 * the caller): per domain d, slice d of the input (the domain's image, its own domain for
 * domains=), private.d and shared encoders, the shared decoder and the codes (a linear layer
 * of the pooled features); the classifier on domain 0's shared code; the loss terms. */
static void dsn(builder *b, int32_t x, int64_t classes, const int64_t *dims)
{
    const int64_t k = dims[0];
    int64_t start[4] = {0, 0, 0, 0}, stop[4] = {1, 1, 1, 1};
    for (int d = 0; d < b->spatial; d++)
        stop[1 + d] = dims[1 + d];
    int32_t first[4] = {-1, -1, -1, -1}; /* domain 0's shared ops: conv1, conv2, decoder, code */
    int32_t shared_code0 = -1;
    tsl_loss_term terms[TSL_MAX_LOSS_TERMS];
    int32_t nterms = 1;
    terms[0] = (tsl_loss_term){TSL_MODEL_LOSS_CROSS_ENTROPY, 1.0, 0, 0};
    for (int64_t d = 0; d < k && !b->st; d++) {
        char name[TSL_GRAPH_NAME_MAX], tmp[48];
        int32_t view = -1, p = -1, s = -1, sum = -1, recon = -1;
        start[0] = d;
        stop[0] = d + 1;
        b->st = tsl_graph_slice(b->g, x, start, stop, &view);
        snprintf(tmp, sizeof tmp, "private.%lld", (long long)d);
        p = unary(b, conv(b, join(name, sizeof name, tmp, "conv1"), view, 8, 3, 1, 1, 1), RELU,
                  NULL);
        p = unary(b, conv(b, join(name, sizeof name, tmp, "conv2"), p, 8, 3, 1, 1, 1), RELU, NULL);
        /* the shared encoder, decoder and code: domain 0's ops own the weights, the others'
         * copy them (named shared.conv1, or shared.conv1_dD for domain D's use) */
        s = unary(b,
                  tie(b,
                      conv(b, domain_name(tmp, sizeof tmp, "shared.conv1", d), view, 8, 3, 1, 1, 1),
                      d, &first[0]),
                  RELU, NULL);
        s = unary(b,
                  tie(b, conv(b, domain_name(tmp, sizeof tmp, "shared.conv2", d), s, 8, 3, 1, 1, 1),
                      d, &first[1]),
                  RELU, NULL);
        if (!b->st)
            b->st = tsl_graph_add(b->g, p, s, &sum);
        recon = tie(b, conv(b, domain_name(tmp, sizeof tmp, "decoder", d), sum, 1, 3, 1, 1, 1), d,
                    &first[2]);
        snprintf(tmp, sizeof tmp, "private.%lld", (long long)d);
        int32_t pc = linear(b, join(name, sizeof name, tmp, "code"), unary(b, p, GAP, NULL), 16);
        int32_t sc = tie(
            b,
            linear(b, domain_name(tmp, sizeof tmp, "shared.code", d), unary(b, s, GAP, NULL), 16),
            d, &first[3]);
        if (d == 0)
            shared_code0 = sc;
        terms[nterms++] = (tsl_loss_term){TSL_MODEL_LOSS_MSE, 0.1, recon + 1, view + 1};
        terms[nterms++] = (tsl_loss_term){TSL_MODEL_LOSS_DIFFERENCE, 0.001, sc + 1, pc + 1};
        if (d > 0)
            terms[nterms++] =
                (tsl_loss_term){TSL_MODEL_LOSS_SIMILARITY, 0.01, shared_code0 + 1, sc + 1};
    }
    int32_t logits = linear(b, "classifier", shared_code0, classes);
    if (!b->st)
        b->st = tsl_graph_set_output(b->g, logits);
    if (!b->st)
        b->st = tsl_graph_set_loss(b->g, nterms, terms);
}

/* Smallest spatial size a network takes, and the divisor sizes must have. */
static void needs(const zoo_entry *e, int64_t *min, int64_t *divisor)
{
    *divisor = 1;
    if (strncmp(e->name, "cnn", 3) == 0)
        *min = strcmp(e->name, "cnn") == 0 ? 4 : 8;
    else if (strncmp(e->name, "unet", 4) == 0) {
        *min = 4;
        *divisor = 4;
    } else if (strcmp(e->name, "resnet") == 0)
        *min = 4;
    else if (strncmp(e->name, "ode", 3) == 0)
        *min = 3;
    else
        *min = 1;
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
    const zoo_entry *e = NULL;
    int blocks = 1;
    for (int i = 0; i < ZOO_SIZE && !e; i++)
        if (strcmp(name, zoo[i].name) == 0)
            e = &zoo[i];
    /* resnetN (N 1 to 64), odenetN and odetanhN (N 1 to 4096): the entry of the prefix */
    for (int i = 0; i < ZOO_SIZE && !e; i++) {
        size_t len = strlen(zoo[i].name);
        int resnet = strcmp(zoo[i].name, "resnet") == 0, ode = strncmp(zoo[i].name, "ode", 3) == 0;
        if ((!resnet && !ode) || strncmp(name, zoo[i].name, len) != 0)
            continue;
        char *end;
        long n = strtol(name + len, &end, 10);
        if (end != name + len && !*end && n >= 1 && n <= (resnet ? 64 : 4096) &&
            (name[len] >= '1' && name[len] <= '9')) {
            e = &zoo[i];
            blocks = (int)n;
        }
    }
    if (!e)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_zoo_graph: no network named '%s' (the zoo has: cnn, cnn1d, cnn2d, "
                         "cnn3d, fcn2d, unet2d, unet3d, resnet, resnetN with N 1 to 64, odenetN "
                         "and odetanhN with N 1 to 4096, dsn)",
                         name);
    if (strncmp(e->name, "ode", 3) == 0 && strcmp(name, e->name) == 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "tsl_zoo_graph: '%s' needs its number of steps, e.g. '%s64'", name, name);
    int spatial = ndim - 1;
    if (spatial < 1 || spatial > 3 || (e->dims && spatial != e->dims))
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "zoo '%s': samples need %s spatial dimensions after channels, not %d",
                         name,
                         e->dims == 1   ? "1"
                         : e->dims == 2 ? "2"
                         : e->dims == 3 ? "3"
                                        : "1 to 3",
                         spatial);
    if (strcmp(e->name, "dsn") == 0 && (dims[0] < 2 || dims[0] > 10))
        return tsl_error(NULL, TSL_ERR_SHAPE,
                         "zoo 'dsn': each input channel is one domain's image: 2 to 10 channels "
                         "(domains), not %lld",
                         (long long)dims[0]);
    int64_t min, divisor;
    needs(e, &min, &divisor);
    for (int d = 0; d < spatial; d++)
        if (dims[1 + d] < min || dims[1 + d] % divisor)
            return tsl_error(NULL, TSL_ERR_SHAPE,
                             "zoo '%s': every spatial size must be at least %lld%s (not %lld)",
                             name, (long long)min, divisor > 1 ? " and divisible by 4" : "",
                             (long long)dims[1 + d]);
    builder b = {NULL, spatial, TSL_OK};
    tsl_status st = tsl_graph_create(&b.g);
    if (st)
        return st;
    int32_t x = -1;
    b.st = tsl_graph_input(b.g, ndim, dims, &x);
    if (strcmp(e->name, "cnn") == 0)
        cnn(&b, x, classes);
    else if (strncmp(e->name, "cnn", 3) == 0)
        cnn_gap(&b, x, classes);
    else if (strcmp(e->name, "fcn2d") == 0)
        fcn(&b, x, classes);
    else if (strncmp(e->name, "unet", 4) == 0)
        unet(&b, x, classes);
    else if (strncmp(e->name, "ode", 3) == 0)
        odenet(&b, x, classes, blocks, strcmp(e->name, "odetanh") == 0);
    else if (strcmp(e->name, "dsn") == 0)
        dsn(&b, x, classes, dims);
    else
        resnet(&b, x, classes, blocks);
    if (b.st) {
        tsl_graph_destroy(b.g);
        return b.st;
    }
    *graph = b.g;
    return TSL_OK;
}
