/* Convolution on one tile of whole samples with oneDNN: the per-thread primitive cache, the
 * descriptors and arguments of the primitives, and the whole-tile kernels (windows of spatial
 * tiles and the codelets are in codelets/conv.c). Plain tiles: primitives created for
 * plain memory, nothing is reordered. Channels-last tiles: the primitives pick their weights
 * layout (the fast jit/brgemm kernels want blocked weights) and each call reorders the small
 * plain weights into it, or the weight gradient out of it; activations are never reordered.
 * Primitives are cached per thread (so per StarPU worker) and per problem, and every oneDNN
 * status is checked. oneDNN runs one thread inside a task (DESIGN rule 7). A convolution
 * of kernel 1 over one position (a linear layer on feature tiles, src/lower/linear.c) is one
 * GEMM, given to OpenBLAS (one thread, as the linear codelets): oneDNN's 1x1 kernels are
 * slower on that shape. */
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "codelet.h"
#include "conv.h"
#include "conv_internal.h"

#define DNNL_OK(call) TSL_CODELET_CHECK((call) == dnnl_success, #call)

enum { FWD = 0, BWD_DATA = 1, BWD_WEIGHTS = 2 };

typedef struct cache_entry {
    tsl_conv_args key; /* has_bias included: it changes the primitives' arguments */
    int kind;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[4]; /* memories over the tiles, whose data handles are set per call */
    int nmem;
    int args[4];
    int widx;                 /* index of the weights (or weight gradient) in mem */
    dnnl_primitive_t reorder; /* NULL, or plain weights <-> wprim */
    dnnl_memory_t wprim;      /* weights in the primitive's layout, over the thread's wbuf */
    size_t wprim_bytes;
    struct cache_entry *next;
} cache_entry;

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_free(void *p)
{
    thread_cache *c = p;
    for (cache_entry *e = c->entries, *next; e; e = next) {
        next = e->next;
        for (int i = 0; i < e->nmem; i++)
            dnnl_memory_destroy(e->mem[i]);
        dnnl_primitive_destroy(e->prim);
        if (e->reorder) {
            dnnl_primitive_destroy(e->reorder);
            dnnl_memory_destroy(e->wprim);
        }
        free(e);
    }
    dnnl_stream_destroy(c->stream);
    dnnl_engine_destroy(c->engine);
    free(c->scratch);
    free(c->part);
    free(c->wtmp);
    free(c->wbuf);
    free(c);
}

static void cache_key_create(void)
{
    TSL_CODELET_CHECK(pthread_key_create(&cache_key, cache_free) == 0, "conv: thread key");
}

thread_cache *tsl_conv_local_cache(void)
{
    pthread_once(&cache_once, cache_key_create);
    thread_cache *c = pthread_getspecific(cache_key);
    if (c)
        return c;
    omp_set_num_threads(1); /* this thread's oneDNN calls stay on this core */
    c = calloc(1, sizeof *c);
    TSL_CODELET_CHECK(c, "conv: out of memory");
    DNNL_OK(dnnl_engine_create(&c->engine, dnnl_cpu, 0));
    DNNL_OK(dnnl_stream_create(&c->stream, c->engine, dnnl_stream_default_flags));
    TSL_CODELET_CHECK(pthread_setspecific(cache_key, c) == 0, "conv: thread cache");
    return c;
}

static dnnl_format_tag_t plain(int ndims)
{
    static const dnnl_format_tag_t tags[] = {dnnl_a,    dnnl_ab,    dnnl_abc,
                                             dnnl_abcd, dnnl_abcde, dnnl_abcdef};
    return tags[ndims - 1];
}

/* N, spatial..., C for 3 to 5 dimensions. */
static dnnl_format_tag_t channels_last(int ndims)
{
    static const dnnl_format_tag_t tags[] = {dnnl_acb, dnnl_acdb, dnnl_acdeb};
    return tags[ndims - 3];
}

/* Memory descriptors of the tiles (activations in the tile layout, weights plain). */
static void descs(const tsl_conv_args *a, dnnl_memory_desc_t *src, dnnl_memory_desc_t *wei,
                  dnnl_memory_desc_t *bias, dnnl_memory_desc_t *dst)
{
    int nd = a->spatial + 2;
    dnnl_dims_t sd = {a->samples, a->in_channels}, dd = {a->samples, a->out_channels};
    dnnl_dims_t wd, bd = {a->out_channels};
    int wn = 0;
    if (a->groups > 1)
        wd[wn++] = a->groups;
    wd[wn++] = a->out_channels / a->groups;
    wd[wn++] = a->in_channels / a->groups;
    for (int d = 0; d < a->spatial; d++) {
        sd[2 + d] = a->in_size[d];
        dd[2 + d] = a->out_size[d];
        wd[wn++] = a->kernel[d];
    }
    dnnl_format_tag_t act = a->channels_last ? channels_last(nd) : plain(nd);
    DNNL_OK(dnnl_memory_desc_init_by_tag(src, nd, sd, dnnl_f32, act));
    DNNL_OK(dnnl_memory_desc_init_by_tag(dst, nd, dd, dnnl_f32, act));
    if (a->transposed) {
        /* oneDNN orders the dims (G,) O, I, k...; PyTorch stores (G,) I, O, k... */
        static const dnnl_format_tag_t plain_io[] = {dnnl_bac, dnnl_bacd, dnnl_bacde};
        static const dnnl_format_tag_t grouped_io[] = {dnnl_acbd, dnnl_acbde, dnnl_acbdef};
        dnnl_format_tag_t tag =
            a->groups > 1 ? grouped_io[a->spatial - 1] : plain_io[a->spatial - 1];
        DNNL_OK(dnnl_memory_desc_init_by_tag(wei, wn, wd, dnnl_f32, tag));
    } else if (a->w_in_channels > 0) {
        /* A run of the input channels of plain (O, w_in_channels, k...) weights: strided. */
        dnnl_dims_t ws;
        ws[wn - 1] = 1;
        for (int i = wn - 2; i >= 0; i--)
            ws[i] = ws[i + 1] * (i == 0 ? a->w_in_channels : wd[i + 1]);
        DNNL_OK(dnnl_memory_desc_init_by_strides(wei, wn, wd, dnnl_f32, ws));
    } else {
        DNNL_OK(dnnl_memory_desc_init_by_tag(wei, wn, wd, dnnl_f32, plain(wn)));
    }
    DNNL_OK(dnnl_memory_desc_init_by_tag(bias, 1, bd, dnnl_f32, dnnl_a));
}

static void geometry(const tsl_conv_args *a, dnnl_dims_t strides, dnnl_dims_t dil,
                     dnnl_dims_t pad_l, dnnl_dims_t pad_r)
{
    for (int d = 0; d < a->spatial; d++) {
        strides[d] = a->stride[d];
        dil[d] = a->dilation[d] - 1; /* oneDNN counts the gaps */
        pad_l[d] = a->padding[d];
        /* Right padding that makes oneDNN's output size the PyTorch one (for a transposed
         * convolution, output padding shows up here as less right padding). */
        int64_t span = a->dilation[d] * (a->kernel[d] - 1) + 1;
        int64_t small = a->transposed ? a->out_size[d] : a->in_size[d];
        int64_t large = a->transposed ? a->in_size[d] : a->out_size[d];
        pad_r[d] = (large - 1) * a->stride[d] + span - small - a->padding[d];
    }
}

/* The attributes of the primitive: for an accumulating forward, a sum post-op that adds to
 * what y holds; NULL otherwise. The caller destroys them. */
static dnnl_primitive_attr_t forward_attr(const tsl_conv_args *a, int kind)
{
    dnnl_primitive_attr_t attr = NULL;
    if (kind == FWD && a->accumulate) {
        dnnl_post_ops_t po;
        DNNL_OK(dnnl_post_ops_create(&po));
        DNNL_OK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_OK(dnnl_primitive_attr_create(&attr));
        DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    return attr;
}

/* Whether oneDNN's "jit_1x1" weight gradient would write past its scratchpad: a 1x1 convolution
 * with a stride over fewer than 16 input channels a group. Seen with Debian's oneDNN 2.6.3 on
 * AVX-512 (its jit_1x1:avx512_core backward_weights, channels-last tiles of 48^2 and more: a
 * standalone program with the scratchpad in guarded memory faults on a store one byte past it;
 * in training the heap was corrupted and the process aborted a step later: ResNet under
 * filters=2, whose shortcut convolutions then see 8 channels). Such problems take the next
 * implementation oneDNN offers. */
static int avoid_jit_1x1(const tsl_conv_args *a, int kind)
{
    if (kind != BWD_WEIGHTS || a->transposed || a->in_channels / a->groups >= 16)
        return 0;
    int strided = 0;
    for (int d = 0; d < a->spatial; d++) {
        if (a->kernel[d] != 1)
            return 0;
        strided |= a->stride[d] > 1;
    }
    return strided;
}

/* The backward primitive descriptor for `back`: oneDNN's first implementation, or with
 * avoid_jit_1x1() the first that is not "jit_1x1". */
static void backward_desc(const tsl_conv_args *a, int kind, const void *back, dnnl_engine_t engine,
                          const_dnnl_primitive_desc_t fpd, dnnl_primitive_desc_t *pd)
{
    if (!avoid_jit_1x1(a, kind)) {
        DNNL_OK(dnnl_primitive_desc_create(pd, back, NULL, engine, fpd));
        return;
    }
    dnnl_primitive_desc_iterator_t it;
    DNNL_OK(dnnl_primitive_desc_iterator_create(&it, back, NULL, engine, fpd));
    *pd = NULL;
    do {
        dnnl_primitive_desc_t cand = dnnl_primitive_desc_iterator_fetch(it);
        TSL_CODELET_CHECK(cand, "conv: no backward implementation");
        const char *impl = NULL;
        DNNL_OK(dnnl_primitive_desc_query(cand, dnnl_query_impl_info_str, 0, &impl));
        if (impl && strncmp(impl, "jit_1x1", 7) != 0) {
            *pd = cand;
            break;
        }
        dnnl_primitive_desc_destroy(cand);
    } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
    dnnl_primitive_desc_iterator_destroy(it);
    TSL_CODELET_CHECK(*pd, "conv: oneDNN offers only jit_1x1 for a strided 1x1 weight gradient");
}

/* The forward primitive descriptor *fpd (the hint for the backward ones) and the one of `kind`
 * in *pd (*fpd itself for the forward). Convolution and deconvolution descriptors are distinct
 * types; each branch makes the forward descriptor and the backward one asked for. */
static void primitive_descs(const tsl_conv_args *a, int kind, dnnl_engine_t engine,
                            const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *wei,
                            const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst,
                            dnnl_primitive_desc_t *fpd, dnnl_primitive_desc_t *pd)
{
    dnnl_dims_t strides, dil, pad_l, pad_r;
    geometry(a, strides, dil, pad_l, pad_r);
    dnnl_convolution_desc_t fd, cd;
    dnnl_deconvolution_desc_t tfd, tcd;
    const dnnl_memory_desc_t *b_md = a->has_bias ? bias : NULL;
    const void *back = NULL;
    dnnl_primitive_attr_t attr = forward_attr(a, kind);
    if (!a->transposed) {
        DNNL_OK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                           dnnl_convolution_direct, src, wei, b_md,
                                                           dst, strides, dil, pad_l, pad_r));
        DNNL_OK(dnnl_primitive_desc_create(fpd, &fd, attr, engine, NULL));
        if (kind == BWD_DATA)
            DNNL_OK(dnnl_dilated_convolution_backward_data_desc_init(
                &cd, dnnl_convolution_direct, src, wei, dst, strides, dil, pad_l, pad_r));
        else if (kind == BWD_WEIGHTS)
            DNNL_OK(dnnl_dilated_convolution_backward_weights_desc_init(
                &cd, dnnl_convolution_direct, src, wei, b_md, dst, strides, dil, pad_l, pad_r));
        back = &cd;
    } else {
        DNNL_OK(dnnl_dilated_deconvolution_forward_desc_init(
            &tfd, dnnl_forward_training, dnnl_deconvolution_direct, src, wei, b_md, dst, strides,
            dil, pad_l, pad_r));
        DNNL_OK(dnnl_primitive_desc_create(fpd, &tfd, attr, engine, NULL));
        if (kind == BWD_DATA)
            DNNL_OK(dnnl_dilated_deconvolution_backward_data_desc_init(
                &tcd, dnnl_deconvolution_direct, src, wei, dst, strides, dil, pad_l, pad_r));
        else if (kind == BWD_WEIGHTS)
            DNNL_OK(dnnl_dilated_deconvolution_backward_weights_desc_init(
                &tcd, dnnl_deconvolution_direct, src, wei, b_md, dst, strides, dil, pad_l, pad_r));
        back = &tcd;
    }
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (kind == FWD)
        *pd = *fpd;
    else
        backward_desc(a, kind, back, engine, *fpd, pd);
}

/* The entry's execution arguments and its memories over the tiles (plain weights). */
static void entry_memories(cache_entry *e, const tsl_conv_args *a, int kind, dnnl_engine_t engine,
                           const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *user_wei,
                           const dnnl_memory_desc_t *bias, const dnnl_memory_desc_t *dst)
{
    const dnnl_memory_desc_t *md[4];
    if (kind == FWD) {
        int args[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
        const dnnl_memory_desc_t *m[4] = {src, user_wei, dst, bias};
        e->nmem = a->has_bias ? 4 : 3;
        e->widx = 1;
        memcpy(e->args, args, sizeof args);
        memcpy(md, m, sizeof m);
    } else if (kind == BWD_DATA) {
        int args[3] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
        const dnnl_memory_desc_t *m[3] = {dst, user_wei, src};
        e->nmem = 3;
        e->widx = 1;
        memcpy(e->args, args, sizeof args);
        memcpy(md, m, sizeof m);
    } else {
        int args[4] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_BIAS};
        const dnnl_memory_desc_t *m[4] = {src, dst, user_wei, bias};
        e->nmem = a->has_bias ? 4 : 3;
        e->widx = 2;
        memcpy(e->args, args, sizeof args);
        memcpy(md, m, sizeof m);
    }
    for (int i = 0; i < e->nmem; i++)
        DNNL_OK(dnnl_memory_create(&e->mem[i], md[i], engine, DNNL_MEMORY_NONE));
}

/* When the primitive wants its weights (or weight gradient) in another layout than the plain
 * one: the memory in that layout and the reorder between the two. */
static void weights_reorder(cache_entry *e, int kind, dnnl_engine_t engine,
                            const_dnnl_primitive_desc_t pd, const dnnl_memory_desc_t *user_wei)
{
    const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(
        pd, kind == BWD_WEIGHTS ? dnnl_query_diff_weights_md : dnnl_query_weights_md, 0);
    TSL_CODELET_CHECK(want, "conv: no weights descriptor");
    if (dnnl_memory_desc_equal(want, user_wei))
        return;
    /* Weights in: plain -> primitive layout; weight gradient out: the other way. */
    DNNL_OK(dnnl_memory_create(&e->wprim, want, engine, DNNL_MEMORY_NONE));
    e->wprim_bytes = dnnl_memory_desc_get_size(want);
    dnnl_primitive_desc_t rpd;
    if (kind == BWD_WEIGHTS)
        DNNL_OK(dnnl_reorder_primitive_desc_create(&rpd, want, engine, user_wei, engine, NULL));
    else
        DNNL_OK(dnnl_reorder_primitive_desc_create(&rpd, user_wei, engine, want, engine, NULL));
    DNNL_OK(dnnl_primitive_create(&e->reorder, rpd));
    dnnl_primitive_desc_destroy(rpd);
}

/* This thread's entry for the problem and kind, made on first use. */
static cache_entry *lookup(const tsl_conv_args *a, int kind)
{
    thread_cache *c = tsl_conv_local_cache();
    for (cache_entry *e = c->entries; e; e = e->next)
        if (e->kind == kind && memcmp(&e->key, a, sizeof *a) == 0)
            return e;
    cache_entry *e = calloc(1, sizeof *e);
    TSL_CODELET_CHECK(e, "conv: out of memory");
    e->key = *a;
    e->kind = kind;
    dnnl_memory_desc_t src, user_wei, wei, bias, dst;
    descs(a, &src, &user_wei, &bias, &dst);
    wei = user_wei;
    if (a->channels_last || a->w_in_channels > 0) /* the primitive chooses its weights layout */
        DNNL_OK(dnnl_memory_desc_init_by_tag(&wei, user_wei.ndims, user_wei.dims, dnnl_f32,
                                             dnnl_format_tag_any));
    dnnl_primitive_desc_t fpd, pd;
    primitive_descs(a, kind, c->engine, &src, &wei, &bias, &dst, &fpd, &pd);
    DNNL_OK(dnnl_primitive_create(&e->prim, pd));
    entry_memories(e, a, kind, c->engine, &src, &user_wei, &bias, &dst);
    weights_reorder(e, kind, c->engine, pd, &user_wei);
    if (pd != fpd)
        dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_desc_destroy(fpd);
    e->next = c->entries;
    c->entries = e;
    return e;
}

static void run(const tsl_conv_args *a, int kind, void *const *buffers)
{
    cache_entry *e = lookup(a, kind);
    dnnl_exec_arg_t args[4];
    for (int i = 0; i < e->nmem; i++) {
        DNNL_OK(dnnl_memory_set_data_handle(e->mem[i], buffers[i]));
        args[i].arg = e->args[i];
        args[i].memory = i == e->widx && e->reorder ? e->wprim : e->mem[i];
    }
    thread_cache *c = tsl_conv_local_cache();
    dnnl_memory_t user = e->mem[e->widx];
    if (e->reorder) {
        if (c->wbuf_bytes < e->wprim_bytes) {
            free(c->wbuf);
            c->wbuf = NULL;
            TSL_CODELET_CHECK(posix_memalign(&c->wbuf, 64, e->wprim_bytes) == 0,
                              "conv: out of memory for reordered weights");
            c->wbuf_bytes = e->wprim_bytes;
        }
        DNNL_OK(dnnl_memory_set_data_handle(e->wprim, c->wbuf));
    }
    if (e->reorder && kind != BWD_WEIGHTS) {
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, user}, {DNNL_ARG_TO, e->wprim}};
        DNNL_OK(dnnl_primitive_execute(e->reorder, c->stream, 2, r));
    }
    DNNL_OK(dnnl_primitive_execute(e->prim, c->stream, e->nmem, args));
    if (e->reorder && kind == BWD_WEIGHTS) {
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, e->wprim}, {DNNL_ARG_TO, user}};
        DNNL_OK(dnnl_primitive_execute(e->reorder, c->stream, 2, r));
    }
    DNNL_OK(dnnl_stream_wait(c->stream));
}

/* y += b, per output channel. */
static void add_bias(const tsl_conv_args *a, const float *b, float *y)
{
    int64_t volume = 1, channels = a->out_channels;
    for (int d = 0; d < a->spatial; d++)
        volume *= a->out_size[d];
    if (a->channels_last) {
        for (int64_t v = 0; v < a->samples * volume; v++) {
            float *row = y + v * channels;
            for (int64_t c = 0; c < channels; c++)
                row[c] += b[c];
        }
    } else {
        for (int64_t nc = 0; nc < a->samples * channels; nc++) {
            float *plane = y + nc * volume, bias = b[nc % channels];
            for (int64_t v = 0; v < volume; v++)
                plane[v] += bias;
        }
    }
}

/* Whether the problem is a product of matrices: one group, not transposed, every spatial size
 * and kernel 1, no padding (then both layouts hold a tile as rows of channels). */
static int is_gemm(const tsl_conv_args *a)
{
    if (a->transposed || a->groups != 1 || a->spatial < 1 || a->samples > INT32_MAX ||
        a->in_channels > INT32_MAX || a->out_channels > INT32_MAX || a->w_in_channels > INT32_MAX)
        return 0;
    for (int d = 0; d < a->spatial; d++)
        if (a->in_size[d] != 1 || a->out_size[d] != 1 || a->kernel[d] != 1 || a->padding[d] != 0)
            return 0;
    return 1;
}

/* The weights' row stride (the run of input channels is a column offset, weights_at). */
static int gemm_ldw(const tsl_conv_args *a)
{
    return (int)(a->w_in_channels > 0 ? a->w_in_channels : a->in_channels);
}

void tsl_conv_forward_kernel(const tsl_conv_args *a, const float *x, const float *w, const float *b,
                             float *y)
{
    TSL_CODELET_CHECK(a->w_in_channels == 0 ||
                          (a->groups == 1 && a->w_in_offset >= 0 &&
                           a->w_in_offset + a->in_channels <= a->w_in_channels),
                      "conv: a run of the weights' input channels needs one group and to lie "
                      "inside the weights");
    w += weights_at(a);
    if (is_gemm(a)) { /* y (n x o) = x (n x k) w^T (+ y) (+ b) */
        const int n = (int)a->samples, k = (int)a->in_channels, o = (int)a->out_channels;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, k, 1.0f, x, k, w, gemm_ldw(a),
                    a->accumulate ? 1.0f : 0.0f, y, o);
        for (int r = 0; a->has_bias && r < n; r++)
            for (int j = 0; j < o; j++)
                y[(int64_t)r * o + j] += b[j];
        return;
    }
    if (a->transposed && a->has_bias) {
        /* oneDNN's transposed convolution with a bias keeps a scratchpad as large as its
         * output (32 MiB per worker for a U-Net 3D up-convolution tile of 64x64x128 voxels and
         * 16 channels, channels-last); without one it needs none. So the bias is added here. */
        tsl_conv_args key = *a;
        key.has_bias = 0;
        void *buffers[3] = {(void *)x, (void *)w, y};
        run(&key, FWD, buffers);
        add_bias(a, b, y);
        return;
    }
    void *buffers[4] = {(void *)x, (void *)w, y, (void *)b};
    run(a, FWD, buffers);
}

void tsl_conv_backward_data_kernel(const tsl_conv_args *a, const float *dy, const float *w,
                                   float *dx)
{
    if (is_gemm(a)) { /* dx (n x k) = dy (n x o) w */
        const int n = (int)a->samples, k = (int)a->in_channels, o = (int)a->out_channels;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, k, o, 1.0f, dy, o,
                    w + weights_at(a), gemm_ldw(a), 0.0f, dx, k);
        return;
    }
    tsl_conv_args key = *a;
    key.has_bias = 0;
    key.accumulate = 0;
    void *buffers[3] = {(void *)dy, (void *)(w + weights_at(a)), dx};
    run(&key, BWD_DATA, buffers);
}

void tsl_conv_backward_weights_kernel(const tsl_conv_args *a, const float *x, const float *dy,
                                      float *dw, float *db)
{
    if (is_gemm(a)) { /* dw's run (o x k) = dy^T x; db = dy's column sums */
        const int n = (int)a->samples, k = (int)a->in_channels, o = (int)a->out_channels;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, k, n, 1.0f, dy, o, x, k, 0.0f,
                    dw + weights_at(a), gemm_ldw(a));
        for (int j = 0; db && a->has_bias && j < o; j++)
            db[j] = 0;
        for (int r = 0; db && a->has_bias && r < n; r++)
            for (int j = 0; j < o; j++)
                db[j] += dy[(int64_t)r * o + j];
        return;
    }
    tsl_conv_args key = *a;
    key.accumulate = 0;
    void *buffers[4] = {(void *)x, (void *)dy, dw + weights_at(a), db};
    run(&key, BWD_WEIGHTS, buffers);
}
