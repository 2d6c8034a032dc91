// CUDA group normalization (codelets/groupnorm.cu): the per-element codelets (the forward's and
// the backward's exact sums, the normalization, the input gradient) and the per-slab ones
// (finalize, save, coefficients, channel totals, parameter gradients) against the CPU's functions,
// the element-wise ones and the backward sums also with a ReLU fused,
// on the same inputs, both layouts, f32 and f64, tiles that start inside a group and end inside
// another. The sums are exact and the element-wise passes use the CPU's arithmetic step by step,
// so every output must equal the CPU's bit for bit.
#include "cuda_test.h"

#include <cstring>
#include <string>

extern "C" {
#include "codelets/groupnorm.h"
}

namespace
{
using namespace tsltest;

// Tile channels [c0, c0 + cext) and samples [n0, n0 + samples) of a (batch, channels, inner...)
// tensor in `groups` groups.
template <typename T>
void check_tile(int64_t samples, int64_t inner, int channels_last, int64_t channels, int64_t groups,
                int64_t c0, int64_t cext)
{
    tsl_gn_args a{};
    a.dtype = dtype_of<T>();
    a.channels_last = channels_last;
    a.channels = channels;
    a.groups = groups;
    a.samples = samples;
    a.n0 = 1;
    a.batch = samples + 2;
    a.c0 = c0;
    a.cext = cext;
    a.inner = inner;
    a.per_group = channels / groups * inner * 3; // as if the tensor had more spatial tiles
    a.eps = 1e-5;
    const size_t n = (size_t)(samples * cext * inner), C = (size_t)channels;
    const size_t slab = (size_t)(2 * samples * groups), saved_n = (size_t)(2 * a.batch * groups);
    const std::string where = std::string(std::is_same<T, float>::value ? "f32" : "f64") +
                              (channels_last ? ", channels-last" : ", plain") + ", " +
                              std::to_string(n) + " elements";
    std::vector<T> x = random_values<T>(n, 1, (T)-3, (T)5),
                   dy = random_values<T>(n, 2, (T)-1, (T)1);
    std::vector<T> gamma = random_values<T>(C, 3, (T)-1.5, (T)1.5);
    std::vector<T> beta = random_values<T>(C, 4, (T)-0.5, (T)0.5);
    {
        std::vector<tsl_acc> want(slab), got = garbage_accs(slab);
        tsl_gn_stats_tile(&a, x.data(), want.data());
        std::vector<T> xin = x;
        run_on_cuda(tsl_cl_gn_stats, a, {cuda_buf(xin, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want)) << "stats, " << where;
    }
    std::vector<double> stats = random_values<double>(slab, 5, 0.5, 1.5); // (mean, invstd) rows
    // the saved statistics: with x in [-3, 5), gamma in [-1.5, 1.5) and beta in [-0.5, 0.5) a
    // fused ReLU keeps some elements of every channel and drops others
    std::vector<double> saved = random_values<double>(saved_n, 6, 0.5, 1.5);
    for (int relu : {0, 1}) {
        tsl_gn_args r = a;
        r.relu = relu;
        const std::string how = where + (relu ? ", ReLU fused" : "");
        {
            std::vector<T> want(n), got = poisoned<T>(n), xin = x, g = gamma, b = beta;
            std::vector<double> st = stats;
            tsl_gn_normalize_tile(&r, x.data(), stats.data(), gamma.data(), beta.data(),
                                  want.data());
            run_on_cuda(tsl_cl_gn_normalize, r,
                        {cuda_buf(xin, STARPU_R), cuda_buf(st, STARPU_R), cuda_buf(g, STARPU_R),
                         cuda_buf(b, STARPU_R), cuda_buf(got, STARPU_W)});
            EXPECT_TRUE(same_bits(got, want))
                << "normalize, " << how << ", worst error " << worst_error(got, want);
        }
        {
            const size_t accs = (size_t)(2 * samples * channels);
            std::vector<tsl_acc> want(accs), got = garbage_accs(accs);
            tsl_gn_backward_sums_tile(&r, x.data(), dy.data(), saved.data(), gamma.data(),
                                      beta.data(), want.data());
            std::vector<T> xin = x, d = dy, g = gamma, b = beta;
            std::vector<double> sv = saved;
            std::vector<CudaBuf> bufs = {cuda_buf(xin, STARPU_R), cuda_buf(d, STARPU_R),
                                         cuda_buf(got, STARPU_W)};
            if (relu)
                bufs.insert(bufs.end(),
                            {cuda_buf(sv, STARPU_R), cuda_buf(g, STARPU_R), cuda_buf(b, STARPU_R)});
            run_on_cuda(tsl_cl_gn_bwd_sums, r, bufs);
            EXPECT_TRUE(same_bits(got, want)) << "backward sums, " << how;
        }
        {
            std::vector<double> coef = random_values<double>(slab, 7, -0.2, 0.2), sv = saved;
            std::vector<T> want(n), got = poisoned<T>(n), xin = x, d = dy, g = gamma, b = beta;
            tsl_gn_backward_data_tile(&r, x.data(), dy.data(), saved.data(), gamma.data(),
                                      beta.data(), coef.data(), want.data());
            std::vector<CudaBuf> bufs = {cuda_buf(xin, STARPU_R),  cuda_buf(d, STARPU_R),
                                         cuda_buf(sv, STARPU_R),   cuda_buf(g, STARPU_R),
                                         cuda_buf(coef, STARPU_R), cuda_buf(got, STARPU_W)};
            if (relu)
                bufs.push_back(cuda_buf(b, STARPU_R));
            run_on_cuda(tsl_cl_gn_bwd_data, r, bufs);
            EXPECT_TRUE(same_bits(got, want))
                << "backward data, " << how << ", worst error " << worst_error(got, want);
        }
    }
    // the per-slab codelets, on the totals of this tile's sums (a slab of one tile)
    std::vector<tsl_acc> totals(slab);
    tsl_gn_stats_tile(&a, x.data(), totals.data());
    {
        std::vector<double> want(slab), got = poisoned<double>(slab);
        std::vector<tsl_acc> in = totals;
        tsl_gn_finalize(&a, totals.data(), want.data());
        run_on_cuda(tsl_cl_gn_finalize, a, {cuda_buf(in, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want)) << "finalize, " << where;
    }
    {
        std::vector<double> want = random_values<double>(saved_n, 8, -1, 1), got = want;
        std::vector<tsl_acc> in = totals;
        tsl_gn_finalize(&a, totals.data(), want.data() + 2 * a.n0 * groups);
        run_on_cuda(tsl_cl_gn_save, a, {cuda_buf(in, STARPU_R), cuda_buf(got, STARPU_RW)});
        EXPECT_TRUE(same_bits(got, want)) << "save (the slab's rows, the others kept), " << where;
    }
    const size_t channel_accs = (size_t)(2 * samples * channels);
    std::vector<tsl_acc> dsums(channel_accs);
    tsl_gn_backward_sums_tile(&a, x.data(), dy.data(), nullptr, nullptr, nullptr, dsums.data());
    {
        std::vector<double> want(slab), got = poisoned<double>(slab), sv = saved;
        std::vector<tsl_acc> in = dsums;
        std::vector<T> g = gamma;
        tsl_gn_backward_coef(&a, dsums.data(), saved.data(), gamma.data(), want.data());
        run_on_cuda(tsl_cl_gn_bwd_coef, a,
                    {cuda_buf(in, STARPU_R), cuda_buf(sv, STARPU_R), cuda_buf(g, STARPU_R),
                     cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want)) << "backward coefficients, " << where;
    }
    std::vector<tsl_acc> channel_totals(2 * C);
    tsl_gn_slab_channels(&a, dsums.data(), saved.data(), channel_totals.data());
    {
        std::vector<tsl_acc> in = dsums, got = garbage_accs(2 * C);
        std::vector<double> sv = saved;
        run_on_cuda(tsl_cl_gn_slab_channels, a,
                    {cuda_buf(in, STARPU_R), cuda_buf(sv, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, channel_totals)) << "slab channel totals, " << where;
    }
    for (int which : {0, 1}) {
        tsl_gn_args p = a;
        p.which = which;
        std::vector<T> want(C), got = poisoned<T>(C);
        std::vector<tsl_acc> in = channel_totals;
        tsl_gn_param_grad(&p, channel_totals.data(), want.data());
        run_on_cuda(tsl_cl_gn_param_grad, p, {cuda_buf(in, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want)) << (which ? "dgamma, " : "dbeta, ") << where
                                          << ", worst error " << worst_error(got, want);
    }
}

template <typename T> void check_all()
{
    for (int channels_last : {0, 1}) {
        check_tile<T>(3, 40001, channels_last, 8, 4, 1, 5); // many blocks; starts inside a group
        check_tile<T>(2, 7, channels_last, 6, 3, 0, 6);     // under one block, whole channels
        check_tile<T>(1, 517, channels_last, 32, 1, 3, 17); // layer norm: one group
        // more channels than a block's channel group (several grid rows), groups across them
        check_tile<T>(2, 3001, channels_last, 96, 8, 10, 70);
        check_tile<T>(2, 301, channels_last, 40, 40, 0, 40); // instance norm: a channel a group
    }
}

} // namespace

TEST(CudaGroupNorm, F32MatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    check_all<float>();
}

TEST(CudaGroupNorm, F64MatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    check_all<double>();
}
