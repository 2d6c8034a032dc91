// Loss kernels (codelets/loss.c): values against a reference computed here in long double,
// gradients against central finite differences of the mean loss in float64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "codelets/copy.h"
#include "codelets/loss.h"
#include "codelets/loss_math.h"
#include "codelets/reduce.h"
}

namespace
{

// Mean cross-entropy of logits (n, C, inner) with labels (n, inner), long double.
long double ce_reference(const std::vector<double> &x, const std::vector<int32_t> &y, int64_t n,
                         int64_t C, int64_t inner)
{
    long double total = 0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t v = 0; v < inner; v++) {
            long double sum = 0;
            for (int64_t c = 0; c < C; c++)
                sum += std::exp((long double)x[(s * C + c) * inner + v]);
            total += std::log(sum) - x[(s * C + y[s * inner + v]) * inner + v];
        }
    return total / (n * inner);
}

double kernel_loss(tsl_loss_args a, const void *x, const void *t, void *grad, int64_t positions)
{
    tsl_acc acc;
    tsl_acc_init(&acc);
    tsl_loss_tile(&a, x, t, grad, &acc);
    EXPECT_EQ(acc.flagged, 0);
    return tsl_acc_round(&acc) / (double)positions;
}

} // namespace

TEST(LossKernel, CrossEntropyValueAndGradient)
{
    std::mt19937_64 rng(77);
    std::normal_distribution<double> n01(0, 3);
    for (int64_t inner : {1, 5}) {
        const int64_t n = 3, C = 4, positions = n * inner;
        std::vector<double> x(n * C * inner);
        std::vector<int32_t> y(n * inner);
        for (auto &v : x)
            v = n01(rng);
        x[0] = 700; // exp overflows without the max shift
        for (auto &v : y)
            v = (int32_t)(rng() % C);
        tsl_loss_args a{};
        a.kind = TSL_LOSS_CROSS_ENTROPY;
        a.dtype = TSL_F64;
        a.label_dtype = TSL_I32;
        a.samples = n;
        a.classes = C;
        a.inner = inner;
        a.scale = 1.0 / positions;
        std::vector<double> grad(x.size(), NAN);
        double loss = kernel_loss(a, x.data(), y.data(), grad.data(), positions);
        if (inner == 5) // the reference's exp(700) is fine in long double
            EXPECT_NEAR(loss, (double)ce_reference(x, y, n, C, inner), 1e-12 * loss);
        const double h = 1e-6;
        for (size_t i = 0; i < x.size(); i++) {
            std::vector<double> xp = x, xm = x;
            xp[i] += h;
            xm[i] -= h;
            double fd = (kernel_loss(a, xp.data(), y.data(), nullptr, positions) -
                         kernel_loss(a, xm.data(), y.data(), nullptr, positions)) /
                        (2 * h);
            ASSERT_NEAR(grad[i], fd, 1e-7) << "inner " << inner << " element " << i;
        }
    }
}

// The CPU's cross-entropy runs blocks of positions in vector loops; the CUDA kernel runs each
// position through tsl_loss_cross_entropy_at (loss_math.h). Both must give the same bits: the
// gradient element for element and the whole accumulator, on any values (NaN, infinities,
// signed zeros, subnormals, logits that overflow exp) and labels (bad ones flagged), for both
// layouts and dtypes, class counts on both sides of the block path's limit and position counts
// that leave partial blocks. (A NaN's sign and payload are not part of the bits compared: the
// vector and scalar forms of one operation may pass on either operand's NaN.)
TEST(LossKernel, CrossEntropyBlocksGiveThePerPositionBits)
{
    std::mt19937_64 rng(2026);
    std::normal_distribution<double> wide(0, 30);
    const double specials[] = {NAN, INFINITY, -INFINITY, -0.0, 0.0, 4e-320, 710, -745, 1e300};
    for (int dtype : {TSL_F32, TSL_F64})
        for (int channels_last : {0, 1})
            for (int64_t C : {1, 3, 10, 32, 33})
                for (int64_t inner : {1, 63, 64, 130}) {
                    const int64_t n = 2, count = n * C * inner;
                    const size_t esize = dtype == TSL_F32 ? 4 : 8;
                    std::vector<unsigned char> x(count * esize), g1(count * esize, 0xA5),
                        g2(count * esize, 0x5A);
                    for (int64_t i = 0; i < count; i++) {
                        double v = rng() % 40 == 0 ? specials[rng() % 9] : wide(rng);
                        if (dtype == TSL_F32)
                            ((float *)x.data())[i] = (float)v;
                        else
                            ((double *)x.data())[i] = v;
                    }
                    std::vector<int32_t> y(n * inner);
                    for (auto &v : y)
                        v = rng() % 25 == 0 ? (rng() % 2 ? -1 : (int32_t)C) : (int32_t)(rng() % C);
                    tsl_loss_args a{};
                    a.kind = TSL_LOSS_CROSS_ENTROPY;
                    a.dtype = dtype;
                    a.label_dtype = TSL_I32;
                    a.samples = n;
                    a.classes = C;
                    a.inner = inner;
                    a.channels_last = channels_last;
                    a.scale = 1.0 / (double)(n * inner);
                    tsl_acc got, want;
                    tsl_acc_init(&got);
                    tsl_acc_init(&want);
                    tsl_loss_tile(&a, x.data(), y.data(), g1.data(), &got);
                    for (int64_t s = 0; s < n; s++)
                        for (int64_t v = 0; v < inner; v++) {
                            int64_t base = tsl_loss_logit_base(&a, s, v);
                            int64_t label = y[s * inner + v];
                            if (label < 0 || label >= C) {
                                want.flagged++;
                                tsl_loss_zero_at(&a, base, g2.data());
                            } else {
                                tsl_acc_add(&want, tsl_loss_cross_entropy_at(&a, x.data(), base,
                                                                             label, g2.data()));
                            }
                        }
                    tsl_acc_normalize(&got);
                    tsl_acc_normalize(&want);
                    const char *where = channels_last ? "channels-last" : "plain";
                    for (int64_t i = 0; i < count; i++) { // a NaN's sign and payload vary
                        double e1 =
                            dtype == TSL_F32 ? ((float *)g1.data())[i] : ((double *)g1.data())[i];
                        double e2 =
                            dtype == TSL_F32 ? ((float *)g2.data())[i] : ((double *)g2.data())[i];
                        ASSERT_TRUE((std::isnan(e1) && std::isnan(e2)) ||
                                    std::memcmp(&g1[i * esize], &g2[i * esize], esize) == 0)
                            << "gradient " << i << ", dtype " << dtype << " " << where << " C " << C
                            << " inner " << inner << ": " << e1 << " against " << e2;
                    }
                    ASSERT_EQ(0, std::memcmp(got.limb, want.limb, sizeof got.limb))
                        << "loss limbs, dtype " << dtype << " " << where << " C " << C;
                    ASSERT_EQ(got.nan_count, want.nan_count);
                    ASSERT_EQ(got.pos_inf, want.pos_inf);
                    ASSERT_EQ(got.neg_inf, want.neg_inf);
                    ASSERT_EQ(got.flagged, want.flagged);
                }
}

TEST(LossKernel, CrossEntropyFlagsBadLabels)
{
    std::vector<float> x(2 * 3, 0.5f), grad(6, NAN);
    std::vector<uint8_t> y = {1, 7};
    tsl_loss_args a{};
    a.kind = TSL_LOSS_CROSS_ENTROPY;
    a.dtype = TSL_F32;
    a.label_dtype = TSL_U8;
    a.samples = 2;
    a.classes = 3;
    a.inner = 1;
    a.scale = 0.5;
    tsl_acc acc;
    tsl_acc_init(&acc);
    tsl_loss_tile(&a, x.data(), y.data(), grad.data(), &acc);
    EXPECT_EQ(acc.flagged, 1);
    EXPECT_NEAR(tsl_acc_round(&acc), std::log(3.0), 1e-7); // the valid sample only
    for (int c = 0; c < 3; c++)
        EXPECT_EQ(grad[3 + c], 0.0f);
    EXPECT_NEAR(grad[1], (1.0 / 3 - 1) * 0.5, 1e-7);
}

TEST(LossKernel, MseValueAndGradient)
{
    std::mt19937_64 rng(78);
    std::normal_distribution<double> n01(0, 1);
    std::vector<double> x(37), t(37), grad(37, NAN);
    for (size_t i = 0; i < x.size(); i++) {
        x[i] = n01(rng);
        t[i] = n01(rng);
    }
    tsl_loss_args a{};
    a.kind = TSL_LOSS_MSE;
    a.dtype = TSL_F64;
    a.samples = 1;
    a.classes = 1;
    a.inner = 37;
    a.scale = 1.0 / 37;
    double loss = kernel_loss(a, x.data(), t.data(), grad.data(), 37);
    long double want = 0;
    for (size_t i = 0; i < x.size(); i++)
        want += (long double)(x[i] - t[i]) * (x[i] - t[i]);
    EXPECT_NEAR(loss, (double)(want / 37), 1e-15);
    for (size_t i = 0; i < x.size(); i++)
        EXPECT_NEAR(grad[i], 2 * (x[i] - t[i]) / 37, 1e-16);
}

TEST(LossKernel, L1ValueAndGradient)
{
    std::mt19937_64 rng(79);
    std::normal_distribution<double> n01(0, 1);
    std::vector<double> x(41), t(41), grad(41, NAN);
    for (size_t i = 0; i < x.size(); i++) {
        x[i] = n01(rng);
        t[i] = n01(rng);
    }
    t[7] = x[7]; // equal: gradient 0
    tsl_loss_args a{};
    a.kind = TSL_LOSS_L1;
    a.dtype = TSL_F64;
    a.samples = 1;
    a.classes = 1;
    a.inner = 41;
    a.scale = 1.0 / 41;
    double loss = kernel_loss(a, x.data(), t.data(), grad.data(), 41);
    long double want = 0;
    for (size_t i = 0; i < x.size(); i++)
        want += fabsl((long double)x[i] - t[i]);
    EXPECT_NEAR(loss, (double)(want / 41), 1e-15);
    for (size_t i = 0; i < x.size(); i++) {
        double s = x[i] > t[i] ? 1.0 : x[i] < t[i] ? -1.0 : 0.0;
        EXPECT_EQ(grad[i], s / 41) << i;
    }
    // the gradient against central differences of the loss (away from the kink)
    for (size_t i : {0, 13, 40}) {
        const double h = 1e-6;
        std::vector<double> xp = x, xm = x, scratch(41);
        xp[i] += h;
        xm[i] -= h;
        double fd = (kernel_loss(a, xp.data(), t.data(), scratch.data(), 41) -
                     kernel_loss(a, xm.data(), t.data(), scratch.data(), 41)) /
                    (2 * h);
        EXPECT_NEAR(fd, grad[i], 1e-8) << i;
    }
}

namespace
{

double dice_value(tsl_loss_args a, const std::vector<double> &x, const std::vector<int32_t> &y)
{
    std::vector<tsl_acc> acc((size_t)(3 * a.classes));
    tsl_dice_stats_tile(&a, x.data(), y.data(), acc.data());
    EXPECT_EQ(acc[0].flagged, 0);
    return tsl_dice_loss(&a, acc.data());
}

} // namespace

TEST(LossKernel, SoftDiceValueAndGradient)
{
    std::mt19937_64 rng(79);
    std::normal_distribution<double> n01(0, 1.5);
    const int64_t n = 2, C = 3, inner = 6;
    std::vector<double> x(n * C * inner);
    std::vector<int32_t> y(n * inner);
    for (auto &v : x)
        v = n01(rng);
    for (auto &v : y)
        v = (int32_t)(rng() % C);
    tsl_loss_args a{};
    a.dtype = TSL_F64;
    a.label_dtype = TSL_I32;
    a.samples = n;
    a.classes = C;
    a.inner = inner;
    a.smooth = 1e-5;
    // Reference in long double.
    long double I[3] = {0, 0, 0}, P[3] = {0, 0, 0}, G[3] = {0, 0, 0};
    for (int64_t s = 0; s < n; s++)
        for (int64_t v = 0; v < inner; v++) {
            long double z = 0, e[3];
            for (int64_t c = 0; c < C; c++)
                z += e[c] = std::exp((long double)x[(s * C + c) * inner + v]);
            for (int64_t c = 0; c < C; c++) {
                long double p = e[c] / z, g = y[s * inner + v] == c;
                I[c] += p * g;
                P[c] += p;
                G[c] += g;
            }
        }
    long double mean = 0;
    for (int c = 0; c < 3; c++)
        mean += (2 * I[c] + 1e-5L) / (P[c] + G[c] + 1e-5L);
    double loss = dice_value(a, x, y);
    EXPECT_NEAR(loss, (double)(1 - mean / 3), 1e-14);
    // Gradient.
    std::vector<tsl_acc> acc(3 * C);
    tsl_dice_stats_tile(&a, x.data(), y.data(), acc.data());
    std::vector<double> coef(2 * C), grad(x.size(), NAN);
    tsl_dice_coef(&a, acc.data(), coef.data());
    tsl_dice_grad_tile(&a, x.data(), y.data(), coef.data(), grad.data());
    const double h = 1e-6;
    for (size_t i = 0; i < x.size(); i++) {
        auto xp = x, xm = x;
        xp[i] += h;
        xm[i] -= h;
        double fd = (dice_value(a, xp, y) - dice_value(a, xm, y)) / (2 * h);
        ASSERT_NEAR(grad[i], fd, 1e-8) << "element " << i;
    }
}

// The similarity loss against its definition, the biased MMD^2 of the two batches with
// std::exp's Gaussian mixture over the 19 bandwidths, in f64 (values spread so that several
// bandwidths matter); its gradients against central finite differences of that definition; the
// loss without gradients the same bits; f32 buffers the same loss and the f32-rounded gradients;
// poisoned outputs; different feature counts are refused by the codelet's caller (lower/loss.c).
TEST(LossKernel, SimilarityValueAndGradients)
{
    const int64_t n = 5, f = 6;
    std::mt19937_64 gen(98);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> a((size_t)(n * f)), b((size_t)(n * f));
    for (double &v : a)
        v = (double)(float)(0.3 * normal(gen));
    for (double &v : b)
        v = (double)(float)(0.3 * normal(gen) + 0.2);
    const double sigma[] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1,   5,   10, 15,
                            20,   25,   30,   35,   100,  1e3,  1e4, 1e5, 1e6};
    auto definition = [&](const std::vector<double> &x, const std::vector<double> &y) {
        auto k = [&](const std::vector<double> &p, int64_t i, const std::vector<double> &q,
                     int64_t j) {
            double d = 0, sum = 0;
            for (int64_t c = 0; c < f; c++)
                d += std::pow(p[(size_t)(i * f + c)] - q[(size_t)(j * f + c)], 2);
            for (double s : sigma)
                sum += std::exp(-d / (2 * s * s));
            return sum;
        };
        double xx = 0, yy = 0, xy = 0;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++)
                xx += k(x, i, x, j), yy += k(y, i, y, j), xy += k(x, i, y, j);
        return (xx + yy - 2 * xy) / (double)(n * n);
    };
    tsl_diff_args d = {TSL_F64, 0, n, f, f};
    auto run = [&](const void *x, const void *y, void *da, void *db, tsl_diff_args args) {
        std::vector<double> w((size_t)(3 * n * n), -1e300);
        tsl_acc acc;
        tsl_acc_init(&acc);
        tsl_similarity_tile(&args, x, y, w.data(), &acc, da, db);
        tsl_acc_normalize(&acc);
        return tsl_acc_round(&acc) / (double)(n * n);
    };
    std::vector<double> da((size_t)(n * f), 1e300), db((size_t)(n * f), 1e300);
    const double got = run(a.data(), b.data(), da.data(), db.data(), d);
    const double want = definition(a, b);
    EXPECT_GT(want, 1e-3);
    EXPECT_NEAR(got, want, 1e-12 * want);
    EXPECT_EQ(run(a.data(), b.data(), nullptr, nullptr, d), got);
    const double h = 1e-6;
    for (int e = 0; e < 2; e++)
        for (size_t i = 0; i < a.size(); i++) {
            std::vector<double> up[2] = {a, b}, down[2] = {a, b};
            up[e][i] += h;
            down[e][i] -= h;
            double fd = (definition(up[0], up[1]) - definition(down[0], down[1])) / (2 * h);
            double g = e ? db[i] : da[i];
            EXPECT_NEAR(g, fd, 1e-7 * (1 + std::fabs(fd))) << (e ? "b " : "a ") << i;
        }
    // the same points as floats: the same loss, the gradients rounded once
    std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());
    std::vector<float> daf((size_t)(n * f), NAN), dbf((size_t)(n * f), NAN);
    tsl_diff_args s32 = {TSL_F32, 0, n, f, f};
    EXPECT_EQ(run(af.data(), bf.data(), daf.data(), dbf.data(), s32), got);
    for (size_t i = 0; i < da.size(); i++) {
        EXPECT_EQ(daf[i], (float)da[i]) << i;
        EXPECT_EQ(dbf[i], (float)db[i]) << i;
    }
    // one batch against itself: no discrepancy, no gradient
    std::vector<double> z1((size_t)(n * f), 1e300), z2((size_t)(n * f), 1e300);
    EXPECT_EQ(run(a.data(), a.data(), z1.data(), z2.data(), d), 0.0);
    for (size_t i = 0; i < z1.size(); i++)
        EXPECT_TRUE(z1[i] == 0.0 && z2[i] == 0.0) << i;
}

// Labels scattered into a narrow tile (the executor's u8 or i32 labels): a box of an i64
// array, copied with narrow_labels, keeps every value the type holds and turns the others
// into the invalid label 255 (u8) or -1 (i32).
// The difference loss against its definition, ||A^T B||_F^2 through M = A^T B (features x
// features, not the kernel's Gram matrices), and its gradients 2 B M^T and 2 A M; in f64 also
// against central finite differences; f32 buffers give the f32-rounded gradients; poisoned
// outputs.
TEST(LossKernel, DifferenceValueAndGradients)
{
    const int64_t n = 5, fa = 7, fb = 3;
    std::mt19937_64 gen(97);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::vector<double> a((size_t)(n * fa)), b((size_t)(n * fb));
    for (double &v : a)
        v = (double)(float)normal(gen);
    for (double &v : b)
        v = (double)(float)normal(gen);
    std::vector<double> m((size_t)(fa * fb), 0.0);
    double want = 0;
    for (int64_t p = 0; p < fa; p++)
        for (int64_t q = 0; q < fb; q++) {
            for (int64_t s = 0; s < n; s++)
                m[(size_t)(p * fb + q)] += a[(size_t)(s * fa + p)] * b[(size_t)(s * fb + q)];
            want += m[(size_t)(p * fb + q)] * m[(size_t)(p * fb + q)];
        }
    std::vector<double> wda((size_t)(n * fa), 0.0), wdb((size_t)(n * fb), 0.0);
    for (int64_t s = 0; s < n; s++)
        for (int64_t p = 0; p < fa; p++)
            for (int64_t q = 0; q < fb; q++) {
                wda[(size_t)(s * fa + p)] += 2 * b[(size_t)(s * fb + q)] * m[(size_t)(p * fb + q)];
                wdb[(size_t)(s * fb + q)] += 2 * a[(size_t)(s * fa + p)] * m[(size_t)(p * fb + q)];
            }
    tsl_diff_args d = {TSL_F64, 0, n, fa, fb};
    auto run = [&](const std::vector<double> &x, const std::vector<double> &y, double *da,
                   double *db) {
        std::vector<double> gram((size_t)(2 * n * n), -1e300);
        tsl_acc acc;
        tsl_acc_init(&acc);
        tsl_difference_tile(&d, x.data(), y.data(), gram.data(), &acc, da, db);
        tsl_acc_normalize(&acc);
        return tsl_acc_round(&acc);
    };
    std::vector<double> da((size_t)(n * fa), 1e300), db((size_t)(n * fb), 1e300);
    double got = run(a, b, da.data(), db.data());
    EXPECT_NEAR(got, want, 1e-12 * want);
    for (size_t i = 0; i < da.size(); i++)
        EXPECT_NEAR(da[i], wda[i], 1e-12 * (1 + std::fabs(wda[i]))) << i;
    for (size_t i = 0; i < db.size(); i++)
        EXPECT_NEAR(db[i], wdb[i], 1e-12 * (1 + std::fabs(wdb[i]))) << i;
    EXPECT_EQ(run(a, b, nullptr, nullptr), got); // no gradients: the same loss
    // central differences of the f64 loss
    const double h = 1e-5;
    for (size_t i = 0; i < a.size(); i += 3) {
        std::vector<double> up = a, down = a;
        up[i] += h;
        down[i] -= h;
        double fd = (run(up, b, nullptr, nullptr) - run(down, b, nullptr, nullptr)) / (2 * h);
        EXPECT_NEAR(fd, da[i], 1e-6 * (1 + std::fabs(da[i]))) << "a " << i;
    }
    for (size_t i = 0; i < b.size(); i += 2) {
        std::vector<double> up = b, down = b;
        up[i] += h;
        down[i] -= h;
        double fd = (run(a, up, nullptr, nullptr) - run(a, down, nullptr, nullptr)) / (2 * h);
        EXPECT_NEAR(fd, db[i], 1e-6 * (1 + std::fabs(db[i]))) << "b " << i;
    }
    // f32 buffers: the same sums in double, gradients rounded to float
    std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());
    std::vector<float> daf((size_t)(n * fa), NAN), dbf((size_t)(n * fb), NAN);
    std::vector<double> gram((size_t)(2 * n * n), -1e300);
    tsl_diff_args f = {TSL_F32, 0, n, fa, fb};
    tsl_acc acc;
    tsl_acc_init(&acc);
    tsl_difference_tile(&f, af.data(), bf.data(), gram.data(), &acc, daf.data(), dbf.data());
    tsl_acc_normalize(&acc);
    EXPECT_EQ(tsl_acc_round(&acc), got);
    for (size_t i = 0; i < da.size(); i++)
        EXPECT_EQ(daf[i], (float)da[i]) << i;
    for (size_t i = 0; i < db.size(); i++)
        EXPECT_EQ(dbf[i], (float)db[i]) << i;
}

TEST(LabelCopy, NarrowsI64IntoU8AndI32)
{
    const int64_t rows = 3, cols = 5;
    std::vector<int64_t> whole = {0,   1, 2,          254,         255,          256,
                                  -1,  7, 1000,       1LL << 40,   -(1LL << 33), 3,
                                  200, 9, 2147483647, 2147483648LL};
    whole.resize((size_t)(rows * cols));
    tsl_box_copy_args a;
    std::memset(&a, 0, sizeof a);
    a.ndim = 2;
    a.src_layout = a.dst_layout = TSL_LAYOUT_PLAIN;
    a.src_extent[0] = rows, a.src_extent[1] = cols;
    a.src_offset[0] = 1, a.src_offset[1] = 1; // the 2 x 4 box from (1, 1)
    a.dst_extent[0] = 2, a.dst_extent[1] = 4;
    a.box[0] = 2, a.box[1] = 4;
    a.narrow_labels = 1;
    a.elem_size = 1;
    std::vector<uint8_t> u8(8, 77);
    tsl_box_copy(&a, u8.data(), whole.data());
    a.elem_size = 4;
    std::vector<int32_t> i32(8, 77);
    tsl_box_copy(&a, i32.data(), whole.data());
    for (int64_t r = 0; r < 2; r++)
        for (int64_t c = 0; c < 4; c++) {
            int64_t v = whole[(size_t)((r + 1) * cols + c + 1)];
            size_t k = (size_t)(r * 4 + c);
            EXPECT_EQ(u8[k], v >= 0 && v < 255 ? (uint8_t)v : 255) << "value " << v;
            EXPECT_EQ(i32[k], v >= 0 && v <= INT32_MAX ? (int32_t)v : -1) << "value " << v;
        }
}

// A box added to an addend stored like the destination (the reduction's owner adding its own
// partial's piece and a received sum in one pass): in plain and channels-last layouts, from a
// box inside a larger source into a box inside a larger destination, against element loops.
TEST(BoxAdd, AddsTheSourceBoxToTheAddendIntoTheDestinationBox)
{
    std::mt19937 gen(11);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int32_t layout : {(int32_t)TSL_LAYOUT_PLAIN, (int32_t)TSL_LAYOUT_CHANNELS_LAST}) {
        tsl_box_copy_args a;
        std::memset(&a, 0, sizeof a);
        a.ndim = 4;
        a.elem_size = 4;
        a.src_layout = a.dst_layout = layout;
        const int64_t se[4] = {2, 3, 5, 6}, de[4] = {1, 3, 4, 5}, box[4] = {1, 2, 3, 4};
        const int64_t so[4] = {1, 1, 2, 1}, dof[4] = {0, 1, 1, 0};
        for (int d = 0; d < 4; d++) {
            a.src_extent[d] = se[d], a.dst_extent[d] = de[d], a.box[d] = box[d];
            a.src_offset[d] = so[d], a.dst_offset[d] = dof[d];
        }
        std::vector<float> src(2 * 3 * 5 * 6), addend(3 * 4 * 5), dst(addend.size(), -7.0f);
        for (float &v : src)
            v = u(gen);
        for (float &v : addend)
            v = u(gen);
        tsl_box_add(&a, dst.data(), src.data(), addend.data());
        int64_t ss[4], ds[4];
        tsl_layout_strides(layout, 4, se, ss);
        tsl_layout_strides(layout, 4, de, ds);
        std::vector<int> hit(dst.size(), 0);
        for (int64_t n = 0; n < box[0]; n++)
            for (int64_t c = 0; c < box[1]; c++)
                for (int64_t h = 0; h < box[2]; h++)
                    for (int64_t w = 0; w < box[3]; w++) {
                        int64_t s = (n + so[0]) * ss[0] + (c + so[1]) * ss[1] +
                                    (h + so[2]) * ss[2] + (w + so[3]) * ss[3];
                        int64_t d = (n + dof[0]) * ds[0] + (c + dof[1]) * ds[1] +
                                    (h + dof[2]) * ds[2] + (w + dof[3]) * ds[3];
                        EXPECT_EQ(dst[(size_t)d], src[(size_t)s] + addend[(size_t)d])
                            << "layout " << layout << " element " << d;
                        hit[(size_t)d] = 1;
                    }
        for (size_t i = 0; i < dst.size(); i++)
            if (!hit[i])
                EXPECT_EQ(dst[i], -7.0f) << "outside the box, element " << i;
    }
}
