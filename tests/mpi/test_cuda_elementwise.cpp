// CUDA elementwise, fill, copy and optimizer codelets against their CPU functions (the shared
// runner and checks: cuda_test.h). Every one of these is exact: the CUDA kernels share their
// element functions with the CPU loops and are compiled without multiply-add contraction, so
// the results must be the same bits.
#include <cstring>

#include "cuda_test.h"

extern "C" {
#include "codelets/copy.h"
#include "codelets/elementwise.h"
#include "codelets/elementwise_math.h"
#include "codelets/fill.h"
#include "codelets/optimizer.h"
}

namespace
{
using namespace tsltest;

const size_t odd_n = 100003; // more than one block, not a multiple of one

// ---- scale, axpy, add, mul ----

template <typename T> void check_elementwise()
{
    tsl_elementwise_args a{};
    a.dtype = dtype_of<T>();
    a.count = (int64_t)odd_n;
    a.alpha = -0.3711;
    std::vector<T> x = random_values<T>(odd_n, 1, (T)-4, (T)4);
    std::vector<T> y = random_values<T>(odd_n, 2, (T)-4, (T)4);

    // scale: x = alpha x
    std::vector<T> want(odd_n), got = x;
    for (size_t i = 0; i < odd_n; i++)
        want[i] = x[i] * (T)a.alpha;
    run_on_cuda(tsl_cl_scale, a, {cuda_buf(got, STARPU_RW)});
    EXPECT_TRUE(same_bits(got, want)) << "scale: worst " << worst_error(got, want);

    // axpy: y += alpha x
    std::vector<T> xin = x;
    got = y;
    for (size_t i = 0; i < odd_n; i++)
        want[i] = y[i] + (T)a.alpha * x[i];
    run_on_cuda(tsl_cl_axpy, a, {cuda_buf(xin, STARPU_R), cuda_buf(got, STARPU_RW)});
    EXPECT_TRUE(same_bits(got, want)) << "axpy: worst " << worst_error(got, want);
    EXPECT_EQ(xin, x) << "axpy wrote x";

    // add (alpha a + b) into a poisoned destination, and in place (dst is the first input, RW)
    for (size_t i = 0; i < odd_n; i++)
        want[i] = (T)a.alpha * x[i] + y[i];
    std::vector<T> yin = y;
    got = poisoned<T>(odd_n);
    run_on_cuda(tsl_cl_add, a,
                {cuda_buf(xin, STARPU_R), cuda_buf(yin, STARPU_R), cuda_buf(got, STARPU_W)});
    EXPECT_TRUE(same_bits(got, want)) << "add: worst " << worst_error(got, want);
    // dst RW, as when it is one of the inputs (the runner registers each vector once)
    std::vector<T> acc = x;
    run_on_cuda(tsl_cl_add, a,
                {cuda_buf(xin, STARPU_R), cuda_buf(yin, STARPU_R), cuda_buf(acc, STARPU_RW)});
    EXPECT_TRUE(same_bits(acc, want)) << "add (RW destination): worst " << worst_error(acc, want);

    // mul (a b) into a poisoned destination
    for (size_t i = 0; i < odd_n; i++)
        want[i] = x[i] * y[i];
    got = poisoned<T>(odd_n);
    run_on_cuda(tsl_cl_mul, a,
                {cuda_buf(xin, STARPU_R), cuda_buf(yin, STARPU_R), cuda_buf(got, STARPU_W)});
    EXPECT_TRUE(same_bits(got, want)) << "mul: worst " << worst_error(got, want);
}

} // namespace

TEST(Cuda, ElementwiseF32MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    check_elementwise<float>();
}

TEST(Cuda, ElementwiseF64MatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    check_elementwise<double>();
}

// Dropout (x through uniform draws u, p = 0.37) into a poisoned destination: the CPU element
// function's bits, some elements zeroed and some scaled.
TEST(Cuda, DropoutMatchesCpuBitForBit)
{
    SKIP_WITHOUT_CUDA();
    tsl_elementwise_args a{};
    a.dtype = TSL_F32;
    a.count = (int64_t)odd_n;
    a.alpha = 0.37;
    std::vector<float> x = random_values<float>(odd_n, 3, -4.0f, 4.0f);
    std::vector<float> u = random_values<float>(odd_n, 4, 0.0f, 1.0f);
    std::vector<float> want(odd_n), got = poisoned<float>(odd_n);
    size_t zeros = 0;
    for (size_t i = 0; i < odd_n; i++) {
        want[i] = tsl_dropout_f32(x[i], u[i], a.alpha);
        zeros += want[i] == 0.0f;
    }
    run_on_cuda(tsl_cl_dropout, a,
                {cuda_buf(x, STARPU_R), cuda_buf(u, STARPU_R), cuda_buf(got, STARPU_W)});
    EXPECT_TRUE(same_bits(got, want)) << "dropout: worst " << worst_error(got, want);
    EXPECT_GT(zeros, odd_n / 4);
    EXPECT_LT(zeros, odd_n / 2);
}

TEST(Cuda, MarkRecordsTheCudaWorker)
{
    SKIP_WITHOUT_CUDA();
    tsl_mark_args a{};
    a.rank = 3;
    a.count = (int64_t)odd_n;
    std::vector<int32_t> tile(odd_n, -7);
    run_on_cuda(tsl_cl_mark, a, {cuda_buf(tile, STARPU_W)});
    int32_t worker = tile[0] - 3000;
    ASSERT_GE(worker, 0);
    ASSERT_LT(worker, (int32_t)starpu_worker_get_count());
    EXPECT_EQ(starpu_worker_get_type(worker), STARPU_CUDA_WORKER);
    EXPECT_EQ(std::count(tile.begin(), tile.end(), tile[0]), (long)odd_n);
}

// ---- fills ----

namespace
{

// A fill of the tile at `start` of extent `extent` of a tensor of `shape` (4-D) stored in
// `layout`, on CUDA into a poisoned tile, against tsl_fill_tile().
template <typename T>
void check_fill(tsl_fill_mode mode, int32_t layout, double a_value, double b_value)
{
    const int64_t shape[4] = {5, 7, 9, 11}, start[4] = {2, 3, 1, 4}, extent[4] = {3, 4, 7, 6};
    tsl_fill_args f;
    std::memset(&f, 0, sizeof f);
    f.dtype = std::is_same<T, float>::value     ? TSL_F32
              : std::is_same<T, double>::value  ? TSL_F64
              : std::is_same<T, int32_t>::value ? TSL_I32
              : std::is_same<T, int64_t>::value ? TSL_I64
                                                : TSL_U8;
    f.mode = mode;
    f.ndim = 4;
    f.seed = 12345 + seed;
    f.a = a_value;
    f.b = b_value;
    f.layout = layout;
    int64_t s = 1;
    for (int d = 3; d >= 0; d--) {
        f.global_strides[d] = s;
        s *= shape[d];
        f.start[d] = start[d];
        f.extent[d] = extent[d];
    }
    size_t n = (size_t)(extent[0] * extent[1] * extent[2] * extent[3]);
    std::vector<T> want(n), got(n);
    std::memset(got.data(), 0xa5, n * sizeof(T)); // poisoned (NaN-like bits for floats)
    tsl_fill_tile(&f, want.data());
    run_on_cuda(tsl_cl_fill, f, {cuda_buf(got, STARPU_W)});
    EXPECT_TRUE(same_bits(got, want))
        << "fill mode " << mode << ", dtype " << f.dtype << ", layout " << layout;
}

} // namespace

TEST(Cuda, FillMatchesCpuBitForBit)
{
    SKIP_WITHOUT_CUDA();
    for (int32_t layout : {(int32_t)TSL_LAYOUT_PLAIN, (int32_t)TSL_LAYOUT_CHANNELS_LAST}) {
        check_fill<float>(TSL_FILL_CONSTANT, layout, 0.7, 0);
        check_fill<float>(TSL_FILL_UNIFORM, layout, -0.25, 0.25);
        check_fill<float>(TSL_FILL_UNIFORM, layout, 0.99999999, 1.0); // rounds to `high`
        check_fill<double>(TSL_FILL_CONSTANT, layout, -3.5, 0);
        check_fill<double>(TSL_FILL_UNIFORM, layout, -2.0, 3.0);
        check_fill<int32_t>(TSL_FILL_UNIFORM, layout, -50.0, 50.0);
        check_fill<int64_t>(TSL_FILL_UNIFORM, layout, 0.0, 1e12);
        check_fill<uint8_t>(TSL_FILL_UNIFORM, layout, 0.0, 256.0);
        check_fill<uint8_t>(TSL_FILL_CONSTANT, layout, 7.0, 0);
    }
}

// Normal fills call log and cos, whose last bits differ between the C library and CUDA: the
// codelet keeps them on CPU workers.
TEST(Cuda, NormalFillStaysOnCpuWorkers)
{
    SKIP_WITHOUT_CUDA();
    ASSERT_NE(tsl_cl_fill.can_execute, nullptr);
    tsl_fill_args f;
    std::memset(&f, 0, sizeof f);
    f.dtype = TSL_F32;
    f.ndim = 1;
    f.extent[0] = 1;
    f.global_strides[0] = 1;
    struct starpu_task *task = starpu_task_create();
    task->cl = &tsl_cl_fill;
    task->destroy = 0;
    for (int32_t mode :
         {(int32_t)TSL_FILL_CONSTANT, (int32_t)TSL_FILL_UNIFORM, (int32_t)TSL_FILL_NORMAL}) {
        f.mode = mode;
        starpu_codelet_pack_args(&task->cl_arg, &task->cl_arg_size, STARPU_VALUE, &f, sizeof f, 0);
        for (unsigned w = 0; w < starpu_worker_get_count(); w++) {
            bool cuda = starpu_worker_get_type((int)w) == STARPU_CUDA_WORKER;
            EXPECT_EQ(tsl_cl_fill.can_execute(w, task, 0), cuda && mode == TSL_FILL_NORMAL ? 0 : 1)
                << "mode " << mode << ", worker " << w;
        }
        free(task->cl_arg);
        task->cl_arg = nullptr;
    }
    task->cl = nullptr;
    starpu_task_destroy(task);
}

// ---- copies ----

namespace
{

// A box of a 4-D array copied between the layouts, elements of T (1, 4 or 8 bytes), into a
// partly poisoned destination: only the box may change.
template <typename T> void check_box_copy(int32_t src_layout, int32_t dst_layout, bool accumulate)
{
    tsl_box_copy_args a;
    std::memset(&a, 0, sizeof a);
    a.ndim = 4;
    a.elem_size = (int32_t)sizeof(T);
    a.src_layout = src_layout;
    a.dst_layout = dst_layout;
    a.accumulate = accumulate ? 1 : 0;
    const int64_t se[4] = {3, 5, 9, 7}, so[4] = {1, 1, 2, 3}, de[4] = {2, 6, 8, 5},
                  dof[4] = {0, 2, 1, 1}, box[4] = {2, 3, 6, 4};
    for (int d = 0; d < 4; d++) {
        a.src_extent[d] = se[d];
        a.src_offset[d] = so[d];
        a.dst_extent[d] = de[d];
        a.dst_offset[d] = dof[d];
        a.box[d] = box[d];
    }
    size_t sn = 3 * 5 * 9 * 7, dn = 2 * 6 * 8 * 5;
    std::vector<T> src(sn), dst_init(dn);
    const double lo = std::is_integral<T>::value ? 0.0 : -100.0;
    std::vector<double> r = random_values<double>(sn + dn, 7 + sizeof(T), lo, 100.0);
    for (size_t i = 0; i < sn; i++)
        src[i] = (T)r[i];
    for (size_t i = 0; i < dn; i++)
        dst_init[i] = accumulate || i % 3 ? (T)r[sn + i] : std::numeric_limits<T>::quiet_NaN();
    std::vector<T> want = dst_init, got = dst_init, src_copy = src;
    tsl_box_copy(&a, want.data(), src.data());
    run_on_cuda(tsl_cl_box_copy, a, {cuda_buf(src_copy, STARPU_R), cuda_buf(got, STARPU_RW)});
    EXPECT_TRUE(same_bits(got, want))
        << "box copy of " << sizeof(T) << "-byte elements, layouts " << src_layout << " -> "
        << dst_layout << (accumulate ? ", accumulating" : "");
}

} // namespace

TEST(Cuda, BoxCopyMatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    for (int32_t sl : {(int32_t)TSL_LAYOUT_PLAIN, (int32_t)TSL_LAYOUT_CHANNELS_LAST})
        for (int32_t dl : {(int32_t)TSL_LAYOUT_PLAIN, (int32_t)TSL_LAYOUT_CHANNELS_LAST}) {
            check_box_copy<float>(sl, dl, false);
            check_box_copy<float>(sl, dl, true);
            check_box_copy<double>(sl, dl, false);
            check_box_copy<uint8_t>(sl, dl, false);
            check_box_copy<int64_t>(sl, dl, false);
        }
}

TEST(Cuda, BoxAddAndLabelNarrowingMatchCpu)
{
    SKIP_WITHOUT_CUDA();
    tsl_box_copy_args a;
    std::memset(&a, 0, sizeof a);
    a.ndim = 3;
    a.src_layout = a.dst_layout = TSL_LAYOUT_PLAIN;
    const int64_t se[3] = {4, 9, 13}, so[3] = {1, 2, 3}, de[3] = {3, 5, 9}, box[3] = {3, 5, 9};
    for (int d = 0; d < 3; d++) {
        a.src_extent[d] = se[d];
        a.src_offset[d] = so[d];
        a.dst_extent[d] = de[d];
        a.box[d] = box[d];
    }
    const size_t sn = 4 * 9 * 13, dn = 3 * 5 * 9;
    // dst = box of src + addend (f32)
    a.elem_size = 4;
    std::vector<float> src = random_values<float>(sn, 21, -1.f, 1.f);
    std::vector<float> addend = random_values<float>(dn, 22, -1.f, 1.f);
    std::vector<float> want(dn), got = poisoned<float>(dn);
    tsl_box_add(&a, want.data(), src.data(), addend.data());
    run_on_cuda(tsl_cl_box_copy, a,
                {cuda_buf(src, STARPU_R), cuda_buf(got, STARPU_W), cuda_buf(addend, STARPU_R)});
    EXPECT_TRUE(same_bits(got, want)) << "box add";
    // i64 labels narrowed to u8 and i32, values in and out of range
    std::vector<int64_t> labels(sn);
    for (size_t i = 0; i < sn; i++)
        labels[i] = (int64_t)(i * 37 % 600) - 100 + (i % 11 == 0 ? (int64_t)1 << 33 : 0);
    a.narrow_labels = 1;
    a.elem_size = 1;
    std::vector<uint8_t> want8(dn), got8(dn, 0x5a);
    tsl_box_copy(&a, want8.data(), labels.data());
    run_on_cuda(tsl_cl_box_copy, a, {cuda_buf(labels, STARPU_R), cuda_buf(got8, STARPU_W)});
    EXPECT_EQ(got8, want8) << "labels to u8";
    a.elem_size = 4;
    std::vector<int32_t> want32(dn), got32(dn, 0x5a5a5a5a);
    tsl_box_copy(&a, want32.data(), labels.data());
    run_on_cuda(tsl_cl_box_copy, a, {cuda_buf(labels, STARPU_R), cuda_buf(got32, STARPU_W)});
    EXPECT_EQ(got32, want32) << "labels to i32";
}

TEST(Cuda, PackUnpackAndCopyMatchCpu)
{
    SKIP_WITHOUT_CUDA();
    // three pieces of odd sizes at offsets with gaps in a pack of bytes
    std::vector<float> p0 = random_values<float>(1001, 31, -1.f, 1.f);
    std::vector<double> p1 = random_values<double>(77, 32, -1.0, 1.0);
    std::vector<uint8_t> p2(13);
    for (size_t i = 0; i < p2.size(); i++)
        p2[i] = (uint8_t)(i * 19);
    tsl_pack_args a;
    std::memset(&a, 0, sizeof a);
    a.n = 3;
    a.offset[0] = 8;
    a.offset[1] = a.offset[0] + 1001 * 4 + 4;
    a.offset[2] = a.offset[1] + 77 * 8;
    const size_t pack_bytes = (size_t)a.offset[2] + 13 + 3;
    std::vector<uint8_t> want(pack_bytes, 0xee), got(pack_bytes, 0xee);
    void *pieces[3] = {p0.data(), p1.data(), p2.data()};
    size_t bytes[3] = {1001 * 4, 77 * 8, 13};
    tsl_pack(&a, want.data(), pack_bytes, pieces, bytes);
    run_on_cuda(tsl_cl_pack, a,
                {cuda_buf(p0, STARPU_R), cuda_buf(p1, STARPU_R), cuda_buf(p2, STARPU_R),
                 cuda_buf(got, STARPU_RW)});
    EXPECT_EQ(got, want) << "pack";
    // unpack into poisoned pieces
    a.unpack = 1;
    std::vector<float> u0 = poisoned<float>(1001);
    std::vector<double> u1 = poisoned<double>(77);
    std::vector<uint8_t> u2(13, 0xff);
    run_on_cuda(tsl_cl_pack, a,
                {cuda_buf(got, STARPU_R), cuda_buf(u0, STARPU_W), cuda_buf(u1, STARPU_W),
                 cuda_buf(u2, STARPU_W)});
    EXPECT_TRUE(same_bits(u0, p0) && same_bits(u1, p1) && u2 == p2) << "unpack";
    // whole-buffer copy (its argument is unused)
    struct {
        int64_t count;
    } none = {0};
    std::vector<double> c = poisoned<double>(77), p1_copy = p1;
    run_on_cuda(tsl_cl_copy, none, {cuda_buf(p1_copy, STARPU_R), cuda_buf(c, STARPU_W)});
    EXPECT_TRUE(same_bits(c, p1)) << "copy";
}

// ---- optimizer updates ----

namespace
{

template <typename T> void check_update(const tsl_update_args &a, int nstate)
{
    const size_t n = (size_t)a.count;
    std::vector<T> p = random_values<T>(n, 41, (T)-1, (T)1);
    std::vector<T> g = random_values<T>(n, 42, (T)-1, (T)1);
    std::vector<T> s0 = random_values<T>(n, 43, (T)-0.1, (T)0.1);
    std::vector<T> s1 = random_values<T>(n, 44, (T)0, (T)0.01);
    std::vector<T> pw = p, s0w = s0, s1w = s1;
    tsl_update(&a, pw.data(), g.data(), nstate > 0 ? s0w.data() : nullptr,
               nstate > 1 ? s1w.data() : nullptr);
    std::vector<T> pg = p, gg = g, s0g = s0, s1g = s1;
    std::vector<CudaBuf> bufs = {cuda_buf(pg, STARPU_RW), cuda_buf(gg, STARPU_R)};
    if (nstate > 0)
        bufs.push_back(cuda_buf(s0g, STARPU_RW));
    if (nstate > 1)
        bufs.push_back(cuda_buf(s1g, STARPU_RW));
    run_on_cuda(tsl_cl_update, a, bufs);
    const char *what = a.kind == TSL_OPT_SGD ? "SGD" : "Adam";
    EXPECT_TRUE(same_bits(pg, pw))
        << what << " param, step " << a.step << ", worst " << worst_error(pg, pw);
    if (nstate > 0)
        EXPECT_TRUE(same_bits(s0g, s0w)) << what << " state 0, step " << a.step;
    if (nstate > 1)
        EXPECT_TRUE(same_bits(s1g, s1w)) << what << " state 1, step " << a.step;
    EXPECT_EQ(gg, g) << what << " wrote the gradient";
}

template <typename T> void check_updates()
{
    tsl_update_args a;
    std::memset(&a, 0, sizeof a);
    a.dtype = dtype_of<T>();
    a.count = (int64_t)odd_n;
    a.kind = TSL_OPT_SGD;
    a.sgd.lr = 0.05;
    a.sgd.weight_decay = 1e-3;
    for (int64_t step : {1, 4}) {
        a.step = step;
        a.sgd.momentum = 0;
        check_update<T>(a, 0);
        a.sgd.momentum = 0.9;
        a.sgd.dampening = 0.1;
        a.sgd.nesterov = 0;
        check_update<T>(a, 1);
        a.sgd.dampening = 0;
        a.sgd.nesterov = 1;
        check_update<T>(a, 1);
    }
    a.kind = TSL_OPT_ADAM;
    a.adam.lr = 1e-3;
    a.adam.beta1 = 0.9;
    a.adam.beta2 = 0.999;
    a.adam.eps = 1e-8;
    a.adam.weight_decay = 0.01;
    for (int32_t decoupled : {0, 1})
        for (int64_t step : {1, 7}) {
            a.adam.decoupled = decoupled;
            a.step = step;
            check_update<T>(a, 2);
        }
}

} // namespace

TEST(Cuda, OptimizerUpdateF32MatchesCpuBitForBit)
{
    SKIP_WITHOUT_CUDA();
    check_updates<float>();
}

TEST(Cuda, OptimizerUpdateF64MatchesCpuBitForBit)
{
    SKIP_WITHOUT_CUDA();
    check_updates<double>();
}
