// CUDA convolution codelets (cuDNN) against the CPU kernels (oneDNN): forward (with bias, with
// accumulation), backward data and backward weights (with the bias gradient), for convolutions and
// transposed convolutions in 1-D, 2-D and 3-D, plain and channels-last tiles, odd sizes, strides,
// padding, dilation, groups and a run of the weights' input channels. The convolution kernels are
// f32 only (conv.h). TF32 is off (mpi_test_main.cpp), so they agree within 1e-5.
#include "cuda_test.h"

#include <cstring>
#include <string>

extern "C" {
#include "codelets/conv.h"
}

namespace
{
using namespace tsltest;

constexpr double tolerance = 1e-5;

struct Case {
    const char *name;
    int spatial;
    bool transposed, channels_last, bias;
    int64_t samples, in_channels, out_channels, groups;
    int64_t in_size[3], kernel[3], stride[3], padding[3], dilation[3];
    int64_t output_padding[3]; // transposed only, below the stride
    int64_t w_in_channels, w_in_offset;
};

int64_t volume(int sp, const int64_t *size)
{
    int64_t v = 1;
    for (int d = 0; d < sp; d++)
        v *= size[d];
    return v;
}

tsl_conv_task_args args_of(const Case &c)
{
    tsl_conv_task_args t;
    std::memset(&t, 0, sizeof t);
    tsl_conv_args &a = t.conv;
    a.spatial = c.spatial;
    a.has_bias = c.bias ? 1 : 0;
    a.transposed = c.transposed ? 1 : 0;
    a.channels_last = c.channels_last ? 1 : 0;
    a.samples = c.samples;
    a.in_channels = c.in_channels;
    a.out_channels = c.out_channels;
    a.groups = c.groups;
    a.w_in_channels = c.w_in_channels;
    a.w_in_offset = c.w_in_offset;
    for (int d = 0; d < 3; d++) {
        bool used = d < c.spatial;
        a.in_size[d] = used ? c.in_size[d] : 1;
        a.kernel[d] = used ? c.kernel[d] : 1;
        a.stride[d] = used ? c.stride[d] : 1;
        a.padding[d] = used ? c.padding[d] : 0;
        a.dilation[d] = used ? c.dilation[d] : 1;
        int64_t span = a.dilation[d] * (a.kernel[d] - 1) + 1;
        if (!used)
            a.out_size[d] = 1;
        else if (c.transposed)
            a.out_size[d] =
                (a.in_size[d] - 1) * a.stride[d] - 2 * a.padding[d] + span + c.output_padding[d];
        else
            a.out_size[d] = (a.in_size[d] + 2 * a.padding[d] - span) / a.stride[d] + 1;
    }
    return t;
}

void check_case(const Case &c)
{
    tsl_conv_task_args t = args_of(c);
    const tsl_conv_args &a = t.conv;
    const int sp = a.spatial;
    const int64_t kv = volume(sp, a.kernel);
    const size_t nx = (size_t)(a.samples * a.in_channels * volume(sp, a.in_size));
    const size_t ny = (size_t)(a.samples * a.out_channels * volume(sp, a.out_size));
    // (O, I / groups, k...) weights, or (I, O / groups, k...) transposed; a run of the input
    // channels lies in w_in_channels of them (columns, or a transposed weight's rows)
    const int64_t w_in = c.w_in_channels > 0 ? c.w_in_channels : a.in_channels / a.groups;
    const int64_t w_rows =
        c.transposed ? (c.w_in_channels > 0 ? w_in : a.in_channels) : a.out_channels;
    const int64_t w_cols = c.transposed ? a.out_channels / a.groups : w_in;
    const size_t nw = (size_t)(w_rows * w_cols * kv);
    const size_t nb = (size_t)a.out_channels;
    const std::string what =
        std::string(c.name) + (c.channels_last ? ", channels-last" : ", plain");
#ifdef TESSEL_USE_CUDA
    ASSERT_TRUE(tsl_conv_cuda_supports(&t)) << what;
#endif

    std::vector<float> x = random_values<float>(nx, 11, -1.0f, 1.0f);
    std::vector<float> w = random_values<float>(nw, 12, -1.0f, 1.0f);
    std::vector<float> b = random_values<float>(nb, 13, -1.0f, 1.0f);
    std::vector<float> dy = random_values<float>(ny, 14, -1.0f, 1.0f);

    // Forward, y = and y +=.
    for (int accumulate : {0, 1}) {
        tsl_conv_task_args ta = t;
        ta.conv.accumulate = accumulate;
        std::vector<float> y0 = random_values<float>(ny, 15, -1.0f, 1.0f);
        std::vector<float> y_cpu = accumulate ? y0 : std::vector<float>(ny);
        std::vector<float> y_gpu = accumulate ? y0 : poisoned<float>(ny);
        tsl_conv_forward_kernel(&ta.conv, x.data(), w.data(), c.bias ? b.data() : nullptr,
                                y_cpu.data());
        std::vector<CudaBuf> bufs = {cuda_buf(x, STARPU_R), cuda_buf(w, STARPU_R)};
        if (c.bias)
            bufs.push_back(cuda_buf(b, STARPU_R));
        bufs.push_back(cuda_buf(y_gpu, accumulate ? STARPU_RW : STARPU_W));
        run_on_cuda(tsl_cl_conv_forward, ta, bufs);
        EXPECT_LE(worst_error(y_gpu, y_cpu), tolerance)
            << "forward" << (accumulate ? " (accumulate), " : ", ") << what;
    }

    // Backward data (no bias, no accumulation in the backward tasks).
    tsl_conv_task_args tb = t;
    tb.conv.has_bias = 0;
    std::vector<float> dx_cpu(nx), dx_gpu = poisoned<float>(nx);
    tsl_conv_backward_data_kernel(&tb.conv, dy.data(), w.data(), dx_cpu.data());
    run_on_cuda(tsl_cl_conv_backward_data, tb,
                {cuda_buf(dy, STARPU_R), cuda_buf(w, STARPU_R), cuda_buf(dx_gpu, STARPU_W)});
    EXPECT_LE(worst_error(dx_gpu, dx_cpu), tolerance) << "backward data, " << what;

    // Backward weights: dw (its run of input channels) and db overwritten; outside the run the
    // poison stays on both. (A run's dw travels read-write, as the library's later parts of a
    // concatenation pass it: a write-only buffer on the GPU would start as whatever the device
    // memory held.)
    std::vector<float> dw_cpu = poisoned<float>(nw), dw_gpu = poisoned<float>(nw);
    std::vector<float> db_cpu(nb), db_gpu = poisoned<float>(nb);
    tsl_conv_backward_weights_kernel(&a, x.data(), dy.data(), dw_cpu.data(),
                                     c.bias ? db_cpu.data() : nullptr);
    std::vector<CudaBuf> bufs = {cuda_buf(x, STARPU_R), cuda_buf(dy, STARPU_R),
                                 cuda_buf(dw_gpu, c.w_in_channels > 0 ? STARPU_RW : STARPU_W)};
    if (c.bias)
        bufs.push_back(cuda_buf(db_gpu, STARPU_W));
    run_on_cuda(tsl_cl_conv_backward_weights, t, bufs);
    EXPECT_LE(worst_error(dw_gpu, dw_cpu), tolerance) << "backward weights, " << what;
    if (c.bias)
        EXPECT_LE(worst_error(db_gpu, db_cpu), tolerance) << "bias gradient, " << what;
}

// name, spatial, transposed, channels_last (set per run), bias, samples, in, out, groups,
// in_size, kernel, stride, padding, dilation, output_padding, w_in_channels, w_in_offset
// clang-format off
const Case cases[] = {
    {"1-D, stride 2, padding 1", 1, false, false, true, 2, 3, 5, 1,
     {7}, {3}, {2}, {1}, {1}, {0}, 0, 0},
    {"1-D, dilation 2", 1, false, false, false, 3, 5, 3, 1,
     {11}, {3}, {1}, {2}, {2}, {0}, 0, 0},
    {"2-D, stride 2, padding 1", 2, false, false, true, 2, 3, 5, 1,
     {7, 5}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {0, 0}, 0, 0},
    {"2-D, dilation 2, padding 2, kernel 3x2", 2, false, false, true, 2, 5, 3, 1,
     {9, 7}, {3, 2}, {1, 2}, {2, 1}, {2, 1}, {0, 0}, 0, 0},
    {"2-D, groups 3", 2, false, false, true, 2, 6, 9, 3,
     {7, 5}, {3, 3}, {2, 1}, {1, 1}, {1, 1}, {0, 0}, 0, 0},
    {"2-D, a run of the weights' input channels", 2, false, false, false, 2, 3, 5, 1,
     {7, 5}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, 7, 2},
    {"1-D, kernel 1 over one position (a linear layer's run of features)", 1, false, false,
     true, 4, 3, 6, 1, {1}, {1}, {1}, {0}, {1}, {0}, 9, 5},
    {"3-D, 3x5x7, stride 2, padding 1", 3, false, false, true, 2, 3, 5, 1,
     {3, 5, 7}, {3, 3, 3}, {2, 2, 2}, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, 0, 0},
    {"3-D, dilation 2", 3, false, false, false, 1, 5, 3, 1,
     {5, 7, 9}, {3, 3, 3}, {1, 1, 1}, {2, 1, 0}, {2, 2, 1}, {0, 0, 0}, 0, 0},
    {"transposed 1-D, stride 2", 1, true, false, true, 2, 3, 5, 1,
     {7}, {3}, {2}, {1}, {1}, {1}, 0, 0},
    {"transposed 2-D, stride 2, kernel 2", 2, true, false, true, 2, 5, 3, 1,
     {3, 5}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, {0, 0}, 0, 0},
    {"transposed 2-D, padding 1, output padding 1, dilation 2", 2, true, false, true, 2, 3, 5, 1,
     {5, 7}, {3, 3}, {2, 2}, {1, 1}, {2, 1}, {1, 0}, 0, 0},
    {"transposed 2-D, groups 2", 2, true, false, true, 2, 4, 6, 2,
     {5, 3}, {3, 3}, {2, 1}, {1, 1}, {1, 1}, {1, 0}, 0, 0},
    {"transposed 3-D, 3x5x7", 3, true, false, true, 2, 5, 3, 1,
     {3, 5, 7}, {2, 2, 2}, {2, 2, 2}, {0, 0, 0}, {1, 1, 1}, {0, 0, 0}, 0, 0},
    {"transposed 2-D, a run of the weights' input channels", 2, true, false, true, 2, 3, 4, 1,
     {4, 5}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, {0, 0}, 7, 2},
};
// clang-format on

} // namespace

TEST(CudaConv, PlainMatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    for (Case c : cases) {
        c.channels_last = false;
        check_case(c);
    }
}

TEST(CudaConv, ChannelsLastMatchesCpu)
{
    SKIP_WITHOUT_CUDA();
    for (Case c : cases) {
        c.channels_last = true;
        check_case(c);
    }
}

// Windowed tasks (halo slabs) and geometries without symmetric padding stay on CPU workers.
TEST(CudaConv, UnsupportedTasksStayOnCpu)
{
#ifdef TESSEL_USE_CUDA
    Case c = cases[2];
    tsl_conv_task_args t = args_of(c);
    EXPECT_TRUE(tsl_conv_cuda_supports(&t));
    tsl_conv_task_args windowed = t;
    windowed.windowed = 1;
    EXPECT_FALSE(tsl_conv_cuda_supports(&windowed));
    tsl_conv_task_args cropped = t;
    cropped.conv.out_size[0] -= 1; // less right padding than left
    EXPECT_FALSE(tsl_conv_cuda_supports(&cropped));
#else
    GTEST_SKIP() << "built without CUDA (TESSEL_CUDA off)";
#endif
}
