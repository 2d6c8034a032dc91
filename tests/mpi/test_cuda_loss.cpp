// CUDA losses (codelets/loss.cu): cross-entropy, MSE, argmax hits and soft Dice against the CPU's
// functions on the same inputs, both layouts, f32 and f64, every label dtype, bad labels. Every
// result must equal the CPU's bits: exp and log are tessel's own on both sides (hd_exp.h).
#include "cuda_test.h"

#include <cstring>

extern "C" {
#include "codelets/loss.h"
}

namespace
{
using namespace tsltest;

bool same_bits(const tsl_acc &a, const tsl_acc &b)
{
    return std::memcmp(&a, &b, sizeof a) == 0;
}
using tsltest::same_bits; // and the vectors' (cuda_test.h)

// Equal bits, or NaN on both sides (the GPU makes its own NaN, not the input's payload).
template <typename T> bool same_values(const std::vector<T> &a, const std::vector<T> &b)
{
    if (a.size() != b.size())
        return false;
    for (size_t i = 0; i < a.size(); i++)
        if (!(std::isnan(a[i]) && std::isnan(b[i])) && std::memcmp(&a[i], &b[i], sizeof(T)) != 0)
            return false;
    return true;
}

// Labels in [0, classes), every 97th one bad (-1, classes, or the dtype's largest value).
template <typename L> std::vector<L> labels_for(size_t n, int64_t classes, uint64_t salt)
{
    std::mt19937_64 gen(seed + salt);
    std::vector<L> v(n);
    for (size_t i = 0; i < n; i++) {
        v[i] = (L)(gen() % (uint64_t)classes);
        if (i % 97 == 13)
            v[i] = (L)(i % 3 == 0 ? (L)classes : std::is_unsigned<L>::value ? (L)255 : (L)-1);
    }
    return v;
}

template <typename L> int label_dtype()
{
    return std::is_same<L, int32_t>::value   ? TSL_I32
           : std::is_same<L, int64_t>::value ? TSL_I64
                                             : TSL_U8;
}

tsl_loss_args loss_args(int kind, int dtype, int ldt, int channels_last, int64_t samples,
                        int64_t classes, int64_t inner)
{
    tsl_loss_args a{};
    a.kind = kind, a.dtype = dtype, a.label_dtype = ldt, a.channels_last = channels_last;
    a.samples = samples, a.classes = classes, a.inner = inner;
    a.scale = 1.0 / (double)(samples * inner * 2); // as if a second tile along N
    a.smooth = 1.0;
    return a;
}

// Cross-entropy (with and without the gradient) and argmax hits on one tile.
template <typename T, typename L> void check_classification(int channels_last)
{
    const int64_t samples = 3, classes = 5, inner = 40001; // many blocks, not a multiple
    const size_t n = (size_t)(samples * classes * inner), positions = (size_t)(samples * inner);
    std::vector<T> x = random_values<T>(n, 1, (T)-4, (T)4);
    std::vector<L> labels = labels_for<L>(positions, classes, 2);
    const std::string where = std::string(std::is_same<T, float>::value ? "f32" : "f64") +
                              (channels_last ? ", channels-last" : ", plain") + ", labels " +
                              std::to_string(label_dtype<L>());
    for (bool with_grad : {false, true}) {
        tsl_loss_args a = loss_args(TSL_LOSS_CROSS_ENTROPY, dtype_of<T>(), label_dtype<L>(),
                                    channels_last, samples, classes, inner);
        tsl_acc want;
        tsl_acc_init(&want);
        std::vector<T> grad_want(n), grad_got = poisoned<T>(n);
        tsl_loss_tile(&a, x.data(), labels.data(), with_grad ? grad_want.data() : nullptr, &want);
        tsl_acc_normalize(&want);
        std::vector<T> xin = x;
        std::vector<L> lin = labels;
        std::vector<tsl_acc> got = garbage_accs(1);
        std::vector<CudaBuf> bufs = {cuda_buf(xin, STARPU_R), cuda_buf(lin, STARPU_R),
                                     cuda_buf(got, STARPU_W)};
        if (with_grad)
            bufs.push_back(cuda_buf(grad_got, STARPU_W));
        run_on_cuda(tsl_cl_loss, a, bufs);
        EXPECT_EQ(got[0].flagged, want.flagged) << "cross-entropy bad labels, " << where;
        EXPECT_EQ(got[0].nan_count, want.nan_count) << where;
        EXPECT_TRUE(same_bits(got[0], want)) << "cross-entropy, " << where;
        if (with_grad)
            EXPECT_TRUE(same_values(grad_got, grad_want)) << "cross-entropy gradient, " << where;
    }
    // Argmax hits: exact.
    tsl_loss_args h = loss_args(TSL_LOSS_HITS, dtype_of<T>(), label_dtype<L>(), channels_last,
                                samples, classes, inner);
    tsl_acc want;
    tsl_acc_init(&want);
    tsl_loss_tile(&h, x.data(), labels.data(), nullptr, &want);
    tsl_acc_normalize(&want);
    std::vector<T> xin = x;
    std::vector<L> lin = labels;
    std::vector<tsl_acc> got = garbage_accs(1);
    run_on_cuda(tsl_cl_loss, h,
                {cuda_buf(xin, STARPU_R), cuda_buf(lin, STARPU_R), cuda_buf(got, STARPU_W)});
    EXPECT_TRUE(same_bits(got[0], want)) << "hits, " << where;
}

// MSE and L1: the sum and the gradient exact, over 2^20 elements, NaN, infinity and equal
// values included.
template <typename T> void check_elementwise(tsl_loss_kind kind)
{
    const int64_t samples = 2, classes = 5, inner = 110001;
    const size_t n = (size_t)(samples * classes * inner);
    std::vector<T> x = random_values<T>(n, 3, (T)-2, (T)2), t = random_values<T>(n, 4, (T)-2, (T)2);
    for (bool special : {false, true}) {
        if (special) {
            x[5] = std::numeric_limits<T>::quiet_NaN();
            x[n / 2] = std::numeric_limits<T>::infinity();
            t[n - 1] = std::numeric_limits<T>::denorm_min();
            t[7] = x[7];
        }
        tsl_loss_args a = loss_args(kind, dtype_of<T>(), TSL_I32, 0, samples, classes, inner);
        tsl_acc want;
        tsl_acc_init(&want);
        std::vector<T> grad_want(n), grad_got = poisoned<T>(n);
        tsl_loss_tile(&a, x.data(), t.data(), grad_want.data(), &want);
        tsl_acc_normalize(&want);
        std::vector<T> xin = x, tin = t;
        std::vector<tsl_acc> got = garbage_accs(1);
        run_on_cuda(tsl_cl_loss, a,
                    {cuda_buf(xin, STARPU_R), cuda_buf(tin, STARPU_R), cuda_buf(got, STARPU_W),
                     cuda_buf(grad_got, STARPU_W)});
        const char *name = kind == TSL_LOSS_MSE ? "MSE" : "L1";
        EXPECT_TRUE(same_bits(got[0], want))
            << name << " sum" << (special ? ", special values" : "");
        EXPECT_TRUE(same_values(grad_got, grad_want)) << name << " gradient";
    }
}

// Soft Dice: statistics, coefficients from the same totals, gradient, all exact.
template <typename T> void check_dice(int channels_last)
{
    const int64_t samples = 2, classes = 4, inner = 30011;
    const size_t n = (size_t)(samples * classes * inner), positions = (size_t)(samples * inner);
    std::vector<T> x = random_values<T>(n, 5, (T)-3, (T)3);
    std::vector<int32_t> labels = labels_for<int32_t>(positions, classes, 6);
    tsl_loss_args a = loss_args(TSL_LOSS_CROSS_ENTROPY, dtype_of<T>(), TSL_I32, channels_last,
                                samples, classes, inner);
    const std::string where = std::string(std::is_same<T, float>::value ? "f32" : "f64") +
                              (channels_last ? ", channels-last" : ", plain");
    const size_t K = 3 * (size_t)classes;
    std::vector<tsl_acc> want(K);
    tsl_dice_stats_tile(&a, x.data(), labels.data(), want.data());
    {
        std::vector<T> xin = x;
        std::vector<int32_t> lin = labels;
        std::vector<tsl_acc> got = garbage_accs(K);
        run_on_cuda(tsl_cl_dice_stats, a,
                    {cuda_buf(xin, STARPU_R), cuda_buf(lin, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_EQ(got[0].flagged, want[0].flagged) << "dice bad labels, " << where;
        for (size_t c = 0; c < (size_t)classes; c++) {
            for (size_t k = 0; k < 3; k++)
                EXPECT_TRUE(same_bits(got[3 * c + k], want[3 * c + k]))
                    << "dice statistic " << 3 * c + k << ", " << where;
        }
    }
    std::vector<double> coef(2 * (size_t)classes);
    tsl_dice_coef(&a, want.data(), coef.data());
    {
        std::vector<tsl_acc> in = want;
        std::vector<double> got = poisoned<double>(coef.size());
        run_on_cuda(tsl_cl_dice_coef, a, {cuda_buf(in, STARPU_R), cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_bits(got, coef)) << "dice coef, " << where;
    }
    {
        std::vector<T> want_grad(n), got = poisoned<T>(n), xin = x;
        tsl_dice_grad_tile(&a, x.data(), labels.data(), coef.data(), want_grad.data());
        std::vector<int32_t> lin = labels;
        std::vector<double> k = coef;
        run_on_cuda(tsl_cl_dice_grad, a,
                    {cuda_buf(xin, STARPU_R), cuda_buf(lin, STARPU_R), cuda_buf(k, STARPU_R),
                     cuda_buf(got, STARPU_W)});
        EXPECT_TRUE(same_values(got, want_grad)) << "dice gradient, " << where;
    }
}

} // namespace

TEST(CudaLoss, CrossEntropyAndHitsMatchCpu)
{
    SKIP_WITHOUT_CUDA();
    for (int channels_last : {0, 1}) {
        check_classification<float, int32_t>(channels_last);
        check_classification<double, int64_t>(channels_last);
        check_classification<float, uint8_t>(channels_last);
    }
}

TEST(CudaLoss, MseAndL1MatchCpuBits)
{
    SKIP_WITHOUT_CUDA();
    for (tsl_loss_kind kind : {TSL_LOSS_MSE, TSL_LOSS_L1}) {
        check_elementwise<float>(kind);
        check_elementwise<double>(kind);
    }
}

TEST(CudaLoss, DiceMatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    for (int channels_last : {0, 1}) {
        check_dice<float>(channels_last);
        check_dice<double>(channels_last);
    }
}

// A loss of two values (difference, similarity) on a CUDA worker against its CPU tile function:
// the loss bits, the scratch matrices' bits (`scratch` doubles per n^2) and the gradients' bits,
// f32 and f64, with and without the gradients, poisoned outputs.
using PairTile = void (*)(const tsl_diff_args *, const void *, const void *, double *, tsl_acc *,
                          void *, void *);
static void check_pair_loss(struct starpu_codelet &cl, PairTile tile, const char *what, int64_t n,
                            int64_t fa, int64_t fb, int64_t scratch, double lo_a, double hi_a,
                            double lo_b, double hi_b)
{
    for (int dtype : {TSL_F32, TSL_F64}) {
        tsl_diff_args d = {dtype, 0, n, fa, fb};
        const size_t es = dtype == TSL_F32 ? sizeof(float) : sizeof(double);
        std::vector<double> a = random_values<double>((size_t)(n * fa), 31, lo_a, hi_a),
                            b = random_values<double>((size_t)(n * fb), 32, lo_b, hi_b);
        std::vector<uint8_t> ab((size_t)(n * fa) * es), bb((size_t)(n * fb) * es);
        for (size_t i = 0; i < a.size(); i++) // (as floats or doubles)
            dtype == TSL_F32 ? (void)(((float *)ab.data())[i] = (float)a[i])
                             : (void)(((double *)ab.data())[i] = a[i]);
        for (size_t i = 0; i < b.size(); i++)
            dtype == TSL_F32 ? (void)(((float *)bb.data())[i] = (float)b[i])
                             : (void)(((double *)bb.data())[i] = b[i]);
        for (bool with_grad : {false, true}) {
            std::vector<double> w_want((size_t)(scratch * n * n)),
                w_got((size_t)(scratch * n * n), NAN);
            std::vector<uint8_t> da_want(ab.size()), db_want(bb.size()), da_got(ab.size(), 0xff),
                db_got(bb.size(), 0xff);
            tsl_acc want;
            tsl_acc_init(&want);
            tile(&d, ab.data(), bb.data(), w_want.data(), &want,
                 with_grad ? da_want.data() : nullptr, with_grad ? db_want.data() : nullptr);
            tsl_acc_normalize(&want);
            std::vector<tsl_acc> got(1);
            std::memset(got.data(), 0x5a, sizeof(tsl_acc));
            std::vector<CudaBuf> bufs = {cuda_buf(ab, STARPU_R), cuda_buf(bb, STARPU_R),
                                         cuda_buf(w_got, STARPU_W), cuda_buf(got, STARPU_W)};
            if (with_grad) {
                bufs.push_back(cuda_buf(da_got, STARPU_W));
                bufs.push_back(cuda_buf(db_got, STARPU_W));
            }
            run_on_cuda(cl, d, bufs);
            const std::string where = std::string(what) + (dtype == TSL_F32 ? ", f32" : ", f64") +
                                      (with_grad ? ", gradients" : ", loss only");
            EXPECT_TRUE(same_bits(got[0], want)) << "loss, " << where;
            EXPECT_TRUE(same_bits(w_got, w_want)) << "scratch matrices, " << where;
            if (with_grad) {
                EXPECT_EQ(da_got, da_want) << "da, " << where;
                EXPECT_EQ(db_got, db_want) << "db, " << where;
            }
        }
    }
}

// The difference loss: the CPU's loss bits (an exact sum of the same products) and gradient
// bits (the same fixed-order sums) and Gram matrices.
TEST(CudaLoss, DifferenceMatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    check_pair_loss(tsl_cl_difference, tsl_difference_tile, "difference", 7, 301, 45, 2, -2.0, 2.0,
                    -2.0, 2.0);
}

// The similarity loss: the CPU's loss bits (exact sums of the same kernel values, the exponential
// tessel's own on both sides), kernel derivatives and gradient bits (the same fixed-order sums).
TEST(CudaLoss, SimilarityMatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    check_pair_loss(tsl_cl_similarity, tsl_similarity_tile, "similarity", 9, 37, 37, 3, -0.5, 0.5,
                    -0.3, 0.7);
}
