// CUDA exact sums (codelets/reduce.cu): the partial sum of a tile and the merge of accumulator
// arrays give the CPU's accumulator bit for bit, on values of every kind (huge, tiny, subnormal,
// zeros of both signs, NaN, infinities), every dtype the CPU takes and sizes of one block, many
// blocks, not a multiple of a block, and over 2^20 elements; the exact sum of squared
// differences of two f32 tiles (MGRIT's residual norms) likewise.
#include "cuda_test.h"

#include <cstring>

extern "C" {
#include "codelets/reduce.h"
}

namespace
{
using namespace tsltest;

// Values of every magnitude the dtype has: ordinary, huge, tiny, subnormal, zeros of both
// signs, both signs everywhere; with `nonfinite`, some NaNs and infinities of both signs.
template <typename T> std::vector<T> hard_values(size_t n, uint64_t salt, bool nonfinite)
{
    std::mt19937_64 gen(seed + salt);
    std::uniform_real_distribution<double> unit(0.5, 1.0);
    std::uniform_int_distribution<int> kind(0, 99);
    const int min_exp = std::numeric_limits<T>::min_exponent - std::numeric_limits<T>::digits;
    const int max_exp = std::numeric_limits<T>::max_exponent;
    std::uniform_int_distribution<int> any_exp(min_exp, max_exp - 1);
    std::uniform_int_distribution<int> normal_exp(-20, 20);
    std::vector<T> v(n);
    for (T &x : v) {
        int k = kind(gen);
        double m = unit(gen) * (gen() & 1 ? -1.0 : 1.0);
        if (k < 60)
            x = (T)std::ldexp(m, normal_exp(gen));
        else if (k < 75)
            x = (T)std::ldexp(m, any_exp(gen));
        else if (k < 82) // subnormal
            x = (T)std::ldexp(m, min_exp + (int)(gen() % std::numeric_limits<T>::digits));
        else if (k < 88) // huge
            x = (T)std::ldexp(m, max_exp - 1 - (int)(gen() % 4));
        else if (k < 94)
            x = (T)(gen() & 1 ? -0.0 : 0.0);
        else if (!nonfinite)
            x = (T)std::ldexp(m, normal_exp(gen));
        else if (k < 96)
            x = std::numeric_limits<T>::quiet_NaN();
        else
            x = (gen() & 1 ? -1 : 1) * std::numeric_limits<T>::infinity();
    }
    return v;
}

template <typename T> std::vector<T> integer_values(size_t n, uint64_t salt)
{
    std::mt19937_64 gen(seed + salt);
    std::vector<T> v(n);
    for (T &x : v)
        x = (T)gen(); // every bit pattern: int32 of both signs, INT32_MIN included
    return v;
}

bool same_bits(const tsl_acc &a, const tsl_acc &b)
{
    return std::memcmp(&a, &b, sizeof a) == 0;
}
using tsltest::same_bits; // and the vectors' (cuda_test.h)

uint64_t bits_of(double v)
{
    uint64_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

// The partial sum of `data` on a CUDA worker against the CPU's (what its CPU codelet computes).
template <typename T> void check_partial(std::vector<T> data, const char *what)
{
    tsl_sum_args a{};
    a.dtype = std::is_same<T, float>::value     ? TSL_F32
              : std::is_same<T, double>::value  ? TSL_F64
              : std::is_same<T, int32_t>::value ? TSL_I32
                                                : TSL_U8;
    a.count = (int64_t)data.size();
    std::vector<tsl_acc> want(1);
    tsl_acc_init(&want[0]);
    tsl_acc_add_array(&want[0], (tsl_dtype)a.dtype, data.data(), a.count);
    tsl_acc_normalize(&want[0]);

    std::vector<T> in = data;
    if (in.empty())
        in.resize(1); // StarPU registers no empty vector; count stays 0
    std::vector<tsl_acc> got = garbage_accs(1);
    run_on_cuda(tsl_cl_sum_partial, a, {cuda_buf(in, STARPU_R), cuda_buf(got, STARPU_W)});
    EXPECT_TRUE(same_bits(got[0], want[0])) << what << ", " << data.size() << " elements";
    EXPECT_EQ(bits_of(tsl_acc_round(&got[0])), bits_of(tsl_acc_round(&want[0])))
        << what << ", " << data.size() << " elements";
}

const size_t sizes[] = {0, 1, 255, 256, 100003, (1u << 20) + 4099};

} // namespace

TEST(CudaReduce, PartialF32MatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    for (size_t n : sizes) {
        check_partial(random_values<float>(n, 1, -3.0f, 5.0f), "f32 ordinary");
        check_partial(hard_values<float>(n, 2, false), "f32 every magnitude");
        check_partial(hard_values<float>(n, 3, true), "f32 with NaN and infinities");
    }
}

TEST(CudaReduce, PartialF64MatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    for (size_t n : sizes) {
        check_partial(random_values<double>(n, 4, -3.0, 5.0), "f64 ordinary");
        check_partial(hard_values<double>(n, 5, false), "f64 every magnitude");
        check_partial(hard_values<double>(n, 6, true), "f64 with NaN and infinities");
    }
}

TEST(CudaReduce, PartialOnlyInfinitiesAndCancellation)
{
    SKIP_WITHOUT_CUDA();
    const double inf = std::numeric_limits<double>::infinity();
    check_partial(std::vector<double>{inf, 1.0, -inf}, "+inf and -inf");
    check_partial(std::vector<double>(1000, -inf), "-inf only");
    std::vector<double> cancel = hard_values<double>(50001, 7, false);
    size_t half = cancel.size();
    for (size_t i = 0; i < half; i++)
        cancel.push_back(-cancel[i]);
    cancel.push_back(std::ldexp(1.0, -1074)); // all that is left: the smallest subnormal
    check_partial(cancel, "exact cancellation");
    check_partial(std::vector<double>(3000000, 0.1), "3e6 equal values (carries)");
}

TEST(CudaReduce, PartialIntegersMatchCpuBits)
{
    SKIP_WITHOUT_CUDA();
    for (size_t n : sizes) {
        check_partial(integer_values<int32_t>(n, 8), "i32");
        check_partial(integer_values<uint8_t>(n, 9), "u8");
    }
}

TEST(CudaReduce, SquaredDifferencesMatchCpuBits)
{
    SKIP_WITHOUT_CUDA();
    for (size_t n : sizes) {
        for (int kind = 0; kind < 3; kind++) {
            std::vector<float> x = kind == 0 ? random_values<float>(n, 11, -3.0f, 5.0f)
                                             : hard_values<float>(n, 12, kind == 2),
                               y = kind == 0 ? random_values<float>(n, 13, -3.0f, 5.0f)
                                             : hard_values<float>(n, 14, kind == 2);
            for (size_t i = 0; i < n; i += 7) // some equal pairs: differences of zero
                y[i] = x[i];
            tsl_sum_args a{};
            a.dtype = TSL_F32;
            a.count = (int64_t)n;
            std::vector<tsl_acc> want(1);
            tsl_acc_init(&want[0]);
            std::vector<float> d(n);
            for (size_t i = 0; i < n; i++)
                d[i] = x[i] - y[i];
            tsl_acc_add_squares_f32(&want[0], d.data(), (int64_t)n);
            tsl_acc_normalize(&want[0]);
            if (x.empty()) {
                x.resize(1);
                y.resize(1);
            }
            std::vector<tsl_acc> got = garbage_accs(1);
            run_on_cuda(tsl_cl_sum_sqdiff, a,
                        {cuda_buf(x, STARPU_R), cuda_buf(y, STARPU_R), cuda_buf(got, STARPU_W)});
            EXPECT_TRUE(same_bits(got[0], want[0])) << "kind " << kind << ", " << n << " elements";
        }
    }
}

TEST(CudaReduce, MergeMatchesCpuBits)
{
    SKIP_WITHOUT_CUDA();
    const size_t n = 37; // accumulators per array, more than one block of merges
    std::vector<tsl_acc> src(n), dst(n);
    for (size_t k = 0; k < n; k++) {
        tsl_acc_init(&src[k]);
        tsl_acc_init(&dst[k]);
        // Unnormalised accumulators of every kind of value, some with counts and flags.
        std::vector<double> a = hard_values<double>(200 + k, 10 + k, k % 3 == 0);
        std::vector<double> b = hard_values<double>(300 + k, 100 + k, k % 5 == 0);
        for (double v : a)
            tsl_acc_add(&src[k], v);
        for (double v : b)
            tsl_acc_add(&dst[k], v);
        src[k].flagged = (int64_t)k;
        dst[k].flagged = 2;
    }
    std::vector<tsl_acc> want = dst;
    for (size_t k = 0; k < n; k++)
        tsl_acc_merge(&want[k], &src[k]);
    std::vector<tsl_acc> src_copy = src, got = dst;
    run_on_cuda(tsl_cl_sum_merge, tsl_sum_args{},
                {cuda_buf(src_copy, STARPU_R), cuda_buf(got, STARPU_RW)});
    for (size_t k = 0; k < n; k++) {
        EXPECT_TRUE(same_bits(got[k], want[k])) << "accumulator " << k;
        EXPECT_EQ(bits_of(tsl_acc_round(&got[k])), bits_of(tsl_acc_round(&want[k])))
            << "accumulator " << k;
    }
}
