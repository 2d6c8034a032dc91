// CUDA batch normalization (codelets/batchnorm.cu): every codelet against the CPU's functions on
// the same inputs, both layouts, with and without the fused ReLU, f32 and f64. The GPU uses the
// CPU's arithmetic step by step (batchnorm_math.h) and exact sums, so every output must equal the
// CPU's bit for bit.
#include "cuda_test.h"

#include <cstring>

extern "C" {
#include "codelets/batchnorm.h"
}

namespace
{
using namespace tsltest;

// A tile of channels [c0, c0 + cext) of a (c0 + cext + 1)-channel tensor.
tsl_bn_args tile_args(int dtype, int64_t samples, int64_t inner, int channels_last, int relu,
                      int64_t c0, int64_t cext)
{
    tsl_bn_args a{};
    a.dtype = dtype;
    a.channels = c0 + cext + 1;
    a.acc_count = a.channels;
    a.c0 = c0;
    a.cext = cext;
    a.samples = samples;
    a.inner = inner;
    a.per_channel = samples * inner * 2; // as if the tensor had a second tile along N
    a.eps = 1e-5;
    a.momentum = 0.1;
    a.relu = relu;
    a.channels_last = channels_last;
    return a;
}

// x with a few values of every kind in the first channel's elements when `special`.
template <typename T> std::vector<T> inputs(size_t n, uint64_t salt, bool special)
{
    std::vector<T> x = random_values<T>(n, salt, (T)-3, (T)5);
    if (special) {
        x[0] = std::numeric_limits<T>::quiet_NaN();
        x[n / 3] = std::numeric_limits<T>::infinity();
        x[n / 2] = std::numeric_limits<T>::denorm_min();
        x[n - 1] = std::numeric_limits<T>::max();
    }
    return x;
}

// Every codelet of the family on one tile shape.
template <typename T>
void check_family(int64_t samples, int64_t inner, int channels_last, int relu, int64_t c0 = 1,
                  int64_t cext = 3)
{
    const int dt = dtype_of<T>();
    tsl_bn_args a = tile_args(dt, samples, inner, channels_last, relu, c0, cext);
    const size_t n = (size_t)(samples * a.cext * inner), C = (size_t)a.channels;
    const std::string where = std::string(std::is_same<T, float>::value ? "f32" : "f64") +
                              (channels_last ? ", channels-last" : ", plain") +
                              (relu ? ", ReLU" : "") + ", " + std::to_string(n) + " elements";
    std::vector<T> x = inputs<T>(n, 1, false), dy = random_values<T>(n, 2, (T)-1, (T)1);
    std::vector<T> gamma = random_values<T>(C, 3, (T)-1.5, (T)1.5);
    std::vector<T> beta = random_values<T>(C, 4, (T)-0.5, (T)0.5);
    gamma[2] = 0; // a channel whose affine is constant
    std::vector<T> rmean = random_values<T>(C, 5, (T)-1, (T)1);
    std::vector<T> rvar = random_values<T>(C, 6, (T)0.5, (T)2);

    // Statistics: exact accumulators, equal bits.
    std::vector<tsl_acc> acc(2 * C);
    tsl_bn_stats_tile(&a, x.data(), acc.data());
    {
        std::vector<T> xin = x;
        std::vector<tsl_acc> got = garbage_accs(2 * C);
        run_on_cuda(tsl_cl_bn_stats, a, {cuda_buf(xin, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, acc)) << "stats, " << where;
    }
    // Into accumulators of the tile's channels only (a channel range's: acc_first = c0), forward
    // and backward: the CPU's bits, nothing written past them.
    for (int pass = 0; pass < 2; pass++) {
        tsl_bn_args w = a;
        w.acc_first = a.c0;
        w.acc_count = a.cext;
        std::vector<tsl_acc> want(2 * a.cext), got = garbage_accs(2 * a.cext);
        std::vector<double> s(2 * C, 0.5);
        if (pass == 0)
            tsl_bn_stats_tile(&w, x.data(), want.data());
        else
            tsl_bn_backward_stats_tile(&w, x.data(), dy.data(), relu ? s.data() : nullptr,
                                       relu ? gamma.data() : nullptr, relu ? beta.data() : nullptr,
                                       want.data());
        std::vector<T> xin = x, din = dy, g = gamma, b = beta;
        if (pass == 0)
            run_on_cuda(tsl_cl_bn_stats, w, {cuda_buf(xin, STARPU_R), cuda_buf(got, STARPU_W)});
        else if (relu)
            run_on_cuda(tsl_cl_bn_bwd_stats, w,
                        {cuda_buf(xin, STARPU_R), cuda_buf(din, STARPU_R), cuda_buf(got, STARPU_W),
                         cuda_buf(s, STARPU_R), cuda_buf(g, STARPU_R), cuda_buf(b, STARPU_R)});
        else
            run_on_cuda(
                tsl_cl_bn_bwd_stats, w,
                {cuda_buf(xin, STARPU_R), cuda_buf(din, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want)) << "range accumulators, pass " << pass << ", " << where;
    }
    // Statistics of values of every kind (NaN, infinity, subnormal, the largest).
    {
        std::vector<T> xs = inputs<T>(n, 7, true);
        std::vector<tsl_acc> want(2 * C), got = garbage_accs(2 * C);
        tsl_bn_stats_tile(&a, xs.data(), want.data());
        run_on_cuda(tsl_cl_bn_stats, a, {cuda_buf(xs, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want)) << "stats with special values, " << where;
    }
    // Finalize, running statistics.
    std::vector<double> saved(2 * C);
    tsl_bn_finalize(&a, acc.data(), saved.data());
    {
        std::vector<tsl_acc> in = acc;
        std::vector<double> got = poisoned<double>(2 * C);
        run_on_cuda(tsl_cl_bn_finalize, a, {cuda_buf(in, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, saved)) << "finalize, " << where;
    }
    for (int which : {0, 1}) {
        tsl_bn_args r = a;
        r.which = which;
        std::vector<T> want = which ? rvar : rmean, got = want;
        tsl_bn_running(&r, acc.data(), want.data());
        std::vector<tsl_acc> in = acc;
        run_on_cuda(tsl_cl_bn_running, r, {cuda_buf(in, STARPU_R), cuda_buf(got, STARPU_RW)});
        EXPECT_TRUE(same_bits(got, want)) << "running statistic " << which << ", " << where;
    }
    // Normalize (training) and inference.
    {
        std::vector<T> want(n), got = poisoned<T>(n);
        tsl_bn_normalize_tile(&a, x.data(), saved.data(), gamma.data(), beta.data(), want.data());
        std::vector<T> xin = x, g = gamma, b = beta;
        std::vector<double> s = saved;
        run_on_cuda(tsl_cl_bn_normalize, a,
                    {cuda_buf(xin, STARPU_R), cuda_buf(s, STARPU_R), cuda_buf(g, STARPU_R),
                     cuda_buf(b, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want))
            << "normalize, " << where << ", worst error " << worst_error(got, want);
    }
    {
        std::vector<T> want(n), got = poisoned<T>(n);
        tsl_bn_infer_tile(&a, x.data(), rmean.data(), rvar.data(), gamma.data(), beta.data(),
                          want.data());
        std::vector<T> xin = x, m = rmean, v = rvar, g = gamma, b = beta;
        run_on_cuda(tsl_cl_bn_infer, a,
                    {cuda_buf(xin, STARPU_R), cuda_buf(m, STARPU_R), cuda_buf(v, STARPU_R),
                     cuda_buf(g, STARPU_R), cuda_buf(b, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want))
            << "inference, " << where << ", worst error " << worst_error(got, want);
    }
    // Backward: the masked sums, the coefficients, the parameter gradients, dx.
    std::vector<tsl_acc> bacc(2 * C);
    tsl_bn_backward_stats_tile(&a, x.data(), dy.data(), relu ? saved.data() : nullptr,
                               relu ? gamma.data() : nullptr, relu ? beta.data() : nullptr,
                               bacc.data());
    {
        std::vector<T> xin = x, d = dy, g = gamma, b = beta;
        std::vector<double> s = saved;
        std::vector<tsl_acc> got = garbage_accs(2 * C);
        std::vector<CudaBuf> bufs = {cuda_buf(xin, STARPU_R), cuda_buf(d, STARPU_R),
                                     cuda_buf(got, STARPU_W)};
        if (relu) {
            bufs.push_back(cuda_buf(s, STARPU_R));
            bufs.push_back(cuda_buf(g, STARPU_R));
            bufs.push_back(cuda_buf(b, STARPU_R));
        }
        run_on_cuda(tsl_cl_bn_bwd_stats, a, bufs);
        EXPECT_TRUE(same_bits(got, bacc)) << "backward stats, " << where;
    }
    std::vector<double> coef(2 * C);
    tsl_bn_backward_coef(&a, bacc.data(), saved.data(), coef.data());
    {
        std::vector<tsl_acc> in = bacc;
        std::vector<double> s = saved, got = poisoned<double>(2 * C);
        run_on_cuda(tsl_cl_bn_bwd_coef, a,
                    {cuda_buf(in, STARPU_R), cuda_buf(s, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, coef)) << "backward coef, " << where;
    }
    for (int which : {0, 1}) {
        tsl_bn_args p = a;
        p.which = which;
        std::vector<T> want(C), got = poisoned<T>(C);
        tsl_bn_param_grad(&p, bacc.data(), saved.data(), want.data());
        std::vector<tsl_acc> in = bacc;
        std::vector<double> s = saved;
        run_on_cuda(tsl_cl_bn_param_grad, p,
                    {cuda_buf(in, STARPU_R), cuda_buf(s, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, want)) << "parameter gradient " << which << ", " << where;
    }
    {
        std::vector<T> want(n), got = poisoned<T>(n);
        tsl_bn_backward_data_tile(&a, x.data(), dy.data(), saved.data(), gamma.data(),
                                  relu ? beta.data() : nullptr, coef.data(), want.data());
        std::vector<T> xin = x, d = dy, g = gamma, b = beta;
        std::vector<double> s = saved, k = coef;
        std::vector<CudaBuf> bufs = {cuda_buf(xin, STARPU_R), cuda_buf(d, STARPU_R),
                                     cuda_buf(s, STARPU_R),   cuda_buf(g, STARPU_R),
                                     cuda_buf(k, STARPU_R),   cuda_buf(got, STARPU_W)};
        if (relu)
            bufs.push_back(cuda_buf(b, STARPU_R));
        run_on_cuda(tsl_cl_bn_bwd_data, a, bufs);
        EXPECT_TRUE(same_bits(got, want))
            << "backward data, " << where << ", worst error " << worst_error(got, want);
    }
}

template <typename T> void check_all_variants()
{
    for (int channels_last : {0, 1})
        for (int relu : {0, 1}) {
            check_family<T>(3, 40001, channels_last, relu); // many blocks, not a multiple
            check_family<T>(2, 7, channels_last, relu);     // under one block
            // Channels-last blocks take 16 channels side by side: two groups and a part.
            check_family<T>(2, 517, channels_last, relu, 2, 37);
            check_family<T>(1, 3, channels_last, relu, 0, 16);
        }
}

} // namespace

TEST(CudaBatchNorm, F32MatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    check_all_variants<float>();
}

TEST(CudaBatchNorm, F64MatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    check_all_variants<double>();
}

TEST(CudaBatchNorm, LargeChannelMatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    check_family<float>(1, (1 << 20) + 3, 1, 1); // over 2^20 elements per channel
}
