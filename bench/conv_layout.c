/* Which tile storage layout should convolution codelets use? One convolution training step
 * (forward, backward data, backward weights) timed with oneDNN directly in three ways:
 *
 *   plain     tensors in plain NC(D)HW / OI(D)HW; primitives created for those layouts
 *   blocked   tensors kept in the layouts oneDNN prefers (format_tag_any); only reorders
 *             between primitives that disagree on a layout are timed
 *   plain+rd  tensors stored plain; every call reorders its inputs into the preferred
 *             layouts and its outputs back (a codelet on plain tiles)
 *
 *   OMP_NUM_THREADS=1 ./bench_conv_layout
 *
 * Shapes: conv2d N=8 C=16->16 128x128 k3 p1; conv3d N=2 C=8->8 64^3 k3 p1;
 * conv1d N=8 C=16->16 L=65536 k3 p1. Median of 5 runs after a warm-up. The plain+rd output
 * is compared with the plain one, to be sure the two compute the same thing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dnnl.h>

#include "bench_dnnl.h"
#include "bench_util.h"

#define RUNS 5

static dnnl_engine_t engine;
static dnnl_stream_t stream;

typedef struct shape {
    const char *name;
    int nsp; /* spatial dims */
    dnnl_dim_t n, c, o, sp[3], k;
} shape;

static dnnl_format_tag_t plain_tag(int ndims)
{
    return ndims == 3 ? dnnl_abc : ndims == 4 ? dnnl_abcd : dnnl_abcde;
}

static dnnl_memory_t make_memory(const dnnl_memory_desc_t *md, int fill)
{
    return bench_memory(engine, md, fill);
}

/* A reorder from `from` to a new memory of layout `to_md` (or to an existing memory). */
typedef struct reorder {
    dnnl_primitive_t prim;
    dnnl_memory_t from, to;
} reorder;

static reorder make_reorder(dnnl_memory_t from, dnnl_memory_t to)
{
    const dnnl_memory_desc_t *fmd, *tmd;
    DNNL_CHECK(dnnl_memory_get_memory_desc(from, &fmd));
    DNNL_CHECK(dnnl_memory_get_memory_desc(to, &tmd));
    dnnl_primitive_desc_t pd;
    DNNL_CHECK(dnnl_reorder_primitive_desc_create(&pd, fmd, engine, tmd, engine, NULL));
    reorder r = {NULL, from, to};
    DNNL_CHECK(dnnl_primitive_create(&r.prim, pd));
    dnnl_primitive_desc_destroy(pd);
    return r;
}

static void run_reorder(const reorder *r)
{
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, r->from}, {DNNL_ARG_TO, r->to}};
    DNNL_CHECK(dnnl_primitive_execute(r->prim, stream, 2, args));
}

/* Memory in `md`, fed from / drained to plain memory `plain` when the layouts differ. */
static dnnl_memory_t in_layout(dnnl_memory_t plain, const dnnl_memory_desc_t *md, reorder *rd,
                               int *count, int to_plain)
{
    const dnnl_memory_desc_t *pmd;
    DNNL_CHECK(dnnl_memory_get_memory_desc(plain, &pmd));
    if (dnnl_memory_desc_equal(pmd, md))
        return plain;
    dnnl_memory_t m = make_memory(md, 0);
    rd[(*count)++] = to_plain ? make_reorder(m, plain) : make_reorder(plain, m);
    return m;
}

typedef struct step {
    dnnl_primitive_t fwd, bwd_data, bwd_weights;
    dnnl_exec_arg_t fwd_args[4], bd_args[3], bw_args[4];
    reorder pre[8], post[4]; /* around the three primitives */
    int npre, npost;
} step;

static double time_step(step *s)
{
    double t[RUNS];
    for (int run = -1; run < RUNS; run++) {
        double t0 = bench_now();
        for (int i = 0; i < s->npre; i++)
            run_reorder(&s->pre[i]);
        DNNL_CHECK(dnnl_primitive_execute(s->fwd, stream, 4, s->fwd_args));
        DNNL_CHECK(dnnl_primitive_execute(s->bwd_data, stream, 3, s->bd_args));
        DNNL_CHECK(dnnl_primitive_execute(s->bwd_weights, stream, 4, s->bw_args));
        for (int i = 0; i < s->npost; i++)
            run_reorder(&s->post[i]);
        DNNL_CHECK(dnnl_stream_wait(stream));
        if (run >= 0)
            t[run] = bench_now() - t0;
    }
    qsort(t, RUNS, sizeof t[0], bench_compare);
    return t[RUNS / 2];
}

static void bench(const shape *sh)
{
    int nd = sh->nsp + 2;
    dnnl_dims_t src_dims = {sh->n, sh->c}, w_dims = {sh->o, sh->c}, dst_dims = {sh->n, sh->o};
    dnnl_dims_t b_dims = {sh->o}, strides, dil, pad;
    for (int d = 0; d < sh->nsp; d++) {
        src_dims[2 + d] = dst_dims[2 + d] = sh->sp[d];
        w_dims[2 + d] = sh->k;
        strides[d] = 1;
        dil[d] = 0;
        pad[d] = sh->k / 2;
    }
    dnnl_memory_desc_t src_p, w_p, b_p, dst_p, src_a, w_a, dst_a;
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&src_p, nd, src_dims, dnnl_f32, plain_tag(nd)));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&w_p, nd, w_dims, dnnl_f32, plain_tag(nd)));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dst_p, nd, dst_dims, dnnl_f32, plain_tag(nd)));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&b_p, 1, b_dims, dnnl_f32, dnnl_a));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&src_a, nd, src_dims, dnnl_f32, dnnl_format_tag_any));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&w_a, nd, w_dims, dnnl_f32, dnnl_format_tag_any));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&dst_a, nd, dst_dims, dnnl_f32, dnnl_format_tag_any));

    /* Plain tensors shared by every variant. */
    dnnl_memory_t src = make_memory(&src_p, 1), w = make_memory(&w_p, 1);
    dnnl_memory_t bias = make_memory(&b_p, 1), diff_dst = make_memory(&dst_p, 1);
    double ms[3];
    float *dst_out[2] = {NULL, NULL};
    size_t dst_n = dnnl_memory_desc_get_size(&dst_p) / sizeof(float);
    for (int variant = 0; variant < 3; variant++) {
        int any = variant > 0;
        const dnnl_memory_desc_t *s_md = any ? &src_a : &src_p, *w_md = any ? &w_a : &w_p;
        const dnnl_memory_desc_t *d_md = any ? &dst_a : &dst_p;
        dnnl_convolution_desc_t fd, bdd, bwd;
        DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                              dnnl_convolution_direct, s_md, w_md,
                                                              &b_p, d_md, strides, dil, pad, pad));
        DNNL_CHECK(dnnl_dilated_convolution_backward_data_desc_init(
            &bdd, dnnl_convolution_direct, s_md, w_md, d_md, strides, dil, pad, pad));
        DNNL_CHECK(dnnl_dilated_convolution_backward_weights_desc_init(
            &bwd, dnnl_convolution_direct, s_md, w_md, &b_p, d_md, strides, dil, pad, pad));
        dnnl_primitive_desc_t fpd, bdpd, bwpd;
        DNNL_CHECK(dnnl_primitive_desc_create(&fpd, &fd, NULL, engine, NULL));
        DNNL_CHECK(dnnl_primitive_desc_create(&bdpd, &bdd, NULL, engine, fpd));
        DNNL_CHECK(dnnl_primitive_desc_create(&bwpd, &bwd, NULL, engine, fpd));
        const char *impl = NULL;
        DNNL_CHECK(dnnl_primitive_desc_query(fpd, dnnl_query_impl_info_str, 0, &impl));

        step s;
        memset(&s, 0, sizeof s);
        DNNL_CHECK(dnnl_primitive_create(&s.fwd, fpd));
        DNNL_CHECK(dnnl_primitive_create(&s.bwd_data, bdpd));
        DNNL_CHECK(dnnl_primitive_create(&s.bwd_weights, bwpd));
        const dnnl_memory_desc_t *f_src = dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0);
        const dnnl_memory_desc_t *f_w = dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0);
        const dnnl_memory_desc_t *f_dst = dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 0);
        const dnnl_memory_desc_t *bd_dsrc =
            dnnl_primitive_desc_query_md(bdpd, dnnl_query_diff_src_md, 0);
        const dnnl_memory_desc_t *bd_w =
            dnnl_primitive_desc_query_md(bdpd, dnnl_query_weights_md, 0);
        const dnnl_memory_desc_t *bd_ddst =
            dnnl_primitive_desc_query_md(bdpd, dnnl_query_diff_dst_md, 0);
        const dnnl_memory_desc_t *bw_src = dnnl_primitive_desc_query_md(bwpd, dnnl_query_src_md, 0);
        const dnnl_memory_desc_t *bw_dw =
            dnnl_primitive_desc_query_md(bwpd, dnnl_query_diff_weights_md, 0);
        const dnnl_memory_desc_t *bw_ddst =
            dnnl_primitive_desc_query_md(bwpd, dnnl_query_diff_dst_md, 0);

        dnnl_memory_t dst_plain = make_memory(&dst_p, 0), dsrc_plain = make_memory(&src_p, 0);
        dnnl_memory_t dw_plain = make_memory(&w_p, 0), dbias = make_memory(&b_p, 0);
        /* Memories in each primitive's layouts; plain ones are reused where they match. */
        reorder setup[8];
        int nsetup = 0;
        dnnl_memory_t m_src = in_layout(src, f_src, s.pre, &s.npre, 0);
        dnnl_memory_t m_w = in_layout(w, f_w, s.pre, &s.npre, 0);
        dnnl_memory_t m_dst = in_layout(dst_plain, f_dst, s.post, &s.npost, 1);
        dnnl_memory_t m_ddst_bd = in_layout(diff_dst, bd_ddst, s.pre, &s.npre, 0);
        dnnl_memory_t m_w_bd = in_layout(w, bd_w, s.pre, &s.npre, 0);
        dnnl_memory_t m_dsrc = in_layout(dsrc_plain, bd_dsrc, s.post, &s.npost, 1);
        dnnl_memory_t m_src_bw = in_layout(src, bw_src, s.pre, &s.npre, 0);
        dnnl_memory_t m_ddst_bw = in_layout(diff_dst, bw_ddst, s.pre, &s.npre, 0);
        dnnl_memory_t m_dw = in_layout(dw_plain, bw_dw, s.post, &s.npost, 1);
        if (variant == 1) {
            /* Resident blocked tensors: reorder from plain once, outside the timing; keep
             * only reorders between primitives that disagree (the same tensor wanted in two
             * layouts), which a blocked-storage design pays on every step. */
            for (int i = 0; i < s.npre; i++)
                setup[nsetup++] = s.pre[i];
            s.npre = 0;
            s.npost = 0;
            for (int i = 0; i < nsetup; i++)
                run_reorder(&setup[i]);
            DNNL_CHECK(dnnl_stream_wait(stream));
            if (!dnnl_memory_desc_equal(f_w, bd_w))
                s.pre[s.npre++] = make_reorder(m_w, m_w_bd);
            if (!dnnl_memory_desc_equal(bd_ddst, bw_ddst))
                s.pre[s.npre++] = make_reorder(m_ddst_bd, m_ddst_bw);
            if (!dnnl_memory_desc_equal(f_src, bw_src))
                s.pre[s.npre++] = make_reorder(m_src, m_src_bw);
        }
        dnnl_exec_arg_t fa[4] = {{DNNL_ARG_SRC, m_src},
                                 {DNNL_ARG_WEIGHTS, m_w},
                                 {DNNL_ARG_BIAS, bias},
                                 {DNNL_ARG_DST, m_dst}};
        dnnl_exec_arg_t ba[3] = {{DNNL_ARG_DIFF_DST, m_ddst_bd},
                                 {DNNL_ARG_WEIGHTS, m_w_bd},
                                 {DNNL_ARG_DIFF_SRC, m_dsrc}};
        dnnl_exec_arg_t wa[4] = {{DNNL_ARG_SRC, m_src_bw},
                                 {DNNL_ARG_DIFF_DST, m_ddst_bw},
                                 {DNNL_ARG_DIFF_WEIGHTS, m_dw},
                                 {DNNL_ARG_DIFF_BIAS, dbias}};
        memcpy(s.fwd_args, fa, sizeof fa);
        memcpy(s.bd_args, ba, sizeof ba);
        memcpy(s.bw_args, wa, sizeof wa);
        ms[variant] = 1e3 * time_step(&s);
        if (variant != 1) {
            void *p;
            DNNL_CHECK(dnnl_memory_get_data_handle(dst_plain, &p));
            dst_out[variant / 2] = malloc(dst_n * sizeof(float));
            memcpy(dst_out[variant / 2], p, dst_n * sizeof(float));
        }
        const char *vname[3] = {"plain", "blocked", "plain+rd"};
        printf("  %-9s %9.2f ms  fwd impl %s, %d+%d reorders timed\n", vname[variant], ms[variant],
               impl, s.npre, s.npost);
        dnnl_primitive_desc_destroy(fpd);
        dnnl_primitive_desc_destroy(bdpd);
        dnnl_primitive_desc_destroy(bwpd);
    }
    double max_rel = 0;
    for (size_t i = 0; i < dst_n; i++)
        max_rel = fmax(max_rel, fabs(dst_out[0][i] - dst_out[1][i]) / (fabs(dst_out[0][i]) + 1e-3));
    printf("  %s: plain/blocked %.2fx, plain+rd/blocked %.2fx; plain+rd vs plain output max "
           "rel diff %.1e\n",
           sh->name, ms[0] / ms[1], ms[2] / ms[1], max_rel);
    free(dst_out[0]);
    free(dst_out[1]);
}

int main(void)
{
    DNNL_CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    const dnnl_version_t *v = dnnl_version();
    const char *threads = getenv("OMP_NUM_THREADS");
    printf("oneDNN %d.%d.%d, OMP_NUM_THREADS=%s; one training step of a convolution "
           "(fwd + bwd data + bwd weights)\n",
           v->major, v->minor, v->patch, threads ? threads : "unset");
    const shape shapes[] = {
        {"conv2d N=8 C=16->16 128x128 k3", 2, 8, 16, 16, {128, 128, 0}, 3},
        {"conv3d N=2 C=8->8 64^3 k3", 3, 2, 8, 8, {64, 64, 64}, 3},
        {"conv1d N=8 C=16->16 L=65536 k3", 1, 8, 16, 16, {65536, 0, 0}, 3},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        printf("%s\n", shapes[i].name);
        bench(&shapes[i]);
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
    return 0;
}
