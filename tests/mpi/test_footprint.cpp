// Perf-model footprints: StarPU keeps one history per (symbol, footprint), so two variants of
// one tile size (ReLU and tanh, SGD and Adam, the fill modes, max and average pooling, f32 and
// f64) must get different footprints, while tasks that differ only in values that do not change
// the work (a slope, a seed, a learning rate, a step) must share one. Tasks are built as tessel
// builds them (arguments packed as one STARPU_VALUE) and never submitted.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdint>
#include <vector>

#include "mpi_test_env.h"

extern "C" {
#include "codelets/activation.h"
#include "codelets/fill.h"
#include "codelets/optimizer.h"
#include "codelets/pool.h"
}

namespace
{

// Vector handles with no data (never allocated): a footprint reads their sizes only.
struct Handles {
    std::vector<starpu_data_handle_t> h;
    Handles(std::initializer_list<uint32_t> sizes, size_t elem_size = sizeof(float))
    {
        for (uint32_t n : sizes) {
            starpu_data_handle_t handle;
            starpu_vector_data_register(&handle, -1, 0, n, elem_size);
            h.push_back(handle);
        }
    }
    ~Handles()
    {
        for (starpu_data_handle_t handle : h)
            starpu_data_unregister(handle);
    }
};

// The footprint the codelet's perf model gives a task over `handles` with `args`.
template <typename A>
uint32_t footprint(struct starpu_codelet &cl, const A &args, const Handles &handles)
{
    EXPECT_NE(cl.model, nullptr);
    EXPECT_NE(cl.model->footprint, nullptr) << cl.name << ": data footprint only";
    if (!cl.model || !cl.model->footprint)
        return 0;
    // STARPU_TASK_SET_MODE writes the modes of a codelet with a fixed buffer count into the
    // codelet itself: they are put back below, or every later task of it would see these.
    const std::vector<enum starpu_data_access_mode> declared(cl.modes, cl.modes + STARPU_NMAXBUFS);
    struct starpu_task *task = starpu_task_create();
    task->destroy = 0; // destroyed here, never submitted
    task->cl = &cl;
    task->nbuffers = (int)handles.h.size();
    for (size_t i = 0; i < handles.h.size(); i++) {
        STARPU_TASK_SET_HANDLE(task, handles.h[i], i);
        STARPU_TASK_SET_MODE(task, i == 0 ? STARPU_R : STARPU_RW, i);
    }
    starpu_codelet_pack_args(&task->cl_arg, &task->cl_arg_size, STARPU_VALUE, &args, sizeof args,
                             0);
    task->cl_arg_free = 1;
    uint32_t fp = cl.model->footprint(task);
    starpu_task_destroy(task);
    std::copy(declared.begin(), declared.end(), cl.modes);
    return fp;
}

} // namespace

// Codelet names and perf-model symbols are what StarPU's calibration files are keyed on.
TEST(Footprint, NamesAndSymbolsStay)
{
    EXPECT_STREQ(tsl_cl_act_forward.name, "tsl_act_fwd");
    EXPECT_STREQ(tsl_cl_act_forward.model->symbol, "tsl_act_fwd");
    EXPECT_STREQ(tsl_cl_update.model->symbol, "tsl_update");
    EXPECT_STREQ(tsl_cl_fill.model->symbol, "tsl_fill");
    EXPECT_STREQ(tsl_cl_pool_forward.model->symbol, "tsl_pool_fwd");
    EXPECT_EQ(tsl_cl_act_forward.model->type, STARPU_HISTORY_BASED);
}

TEST(Footprint, ActivationKind)
{
    Handles xy({4096, 4096});
    tsl_act_args relu = {};
    relu.kind = TSL_ACT_RELU;
    relu.dtype = TSL_F32;
    relu.count = 4096;
    tsl_act_args tanh_args = relu, leaky = relu, leaky2 = relu;
    tanh_args.kind = TSL_ACT_TANH;
    leaky.kind = TSL_ACT_LEAKY_RELU;
    leaky.slope = 0.01;
    leaky2.kind = TSL_ACT_LEAKY_RELU;
    leaky2.slope = 0.2;
    uint32_t f_relu = footprint(tsl_cl_act_forward, relu, xy);
    EXPECT_NE(f_relu, footprint(tsl_cl_act_forward, tanh_args, xy));
    EXPECT_NE(f_relu, footprint(tsl_cl_act_forward, leaky, xy));
    EXPECT_EQ(f_relu, footprint(tsl_cl_act_forward, relu, xy));
    // The slope is a value, not a variant.
    EXPECT_EQ(footprint(tsl_cl_act_forward, leaky, xy), footprint(tsl_cl_act_forward, leaky2, xy));
    // The tile size still counts.
    Handles bigger({8192, 8192});
    EXPECT_NE(f_relu, footprint(tsl_cl_act_forward, relu, bigger));
    EXPECT_NE(footprint(tsl_cl_act_backward, relu, xy),
              footprint(tsl_cl_act_backward, tanh_args, xy));
}

TEST(Footprint, OptimizerKind)
{
    // The same four buffers: only the kind tells the two updates apart.
    Handles four({1000, 1000, 1000, 1000});
    tsl_update_args sgd = {};
    sgd.kind = TSL_OPT_SGD;
    sgd.dtype = TSL_F32;
    sgd.count = 1000;
    sgd.step = 1;
    sgd.sgd.lr = 0.1;
    sgd.sgd.momentum = 0.9;
    tsl_update_args adam = sgd;
    adam.kind = TSL_OPT_ADAM;
    adam.adam.lr = 1e-3;
    uint32_t f_sgd = footprint(tsl_cl_update, sgd, four);
    EXPECT_NE(f_sgd, footprint(tsl_cl_update, adam, four));
    // A later step and another learning rate are the same work.
    tsl_update_args later = sgd;
    later.step = 7;
    later.sgd.lr = 0.05;
    EXPECT_EQ(f_sgd, footprint(tsl_cl_update, later, four));
    // Nesterov momentum is another branch.
    Handles three({1000, 1000, 1000});
    tsl_update_args nesterov = sgd;
    nesterov.sgd.nesterov = 1;
    EXPECT_NE(footprint(tsl_cl_update, sgd, three), footprint(tsl_cl_update, nesterov, three));
}

TEST(Footprint, FillModeAndDtype)
{
    Handles tile({512});
    tsl_fill_args args = {};
    args.dtype = TSL_F32;
    args.ndim = 1;
    args.extent[0] = 512;
    args.global_strides[0] = 1;
    std::vector<uint32_t> seen;
    for (int mode : {TSL_FILL_CONSTANT, TSL_FILL_UNIFORM, TSL_FILL_NORMAL}) {
        args.mode = mode;
        uint32_t f = footprint(tsl_cl_fill, args, tile);
        for (uint32_t other : seen)
            EXPECT_NE(f, other) << "mode " << mode;
        seen.push_back(f);
    }
    // Seed and values are not variants.
    tsl_fill_args reseeded = args;
    reseeded.seed = 12345;
    reseeded.a = 3.0;
    reseeded.b = 0.5;
    EXPECT_EQ(seen.back(), footprint(tsl_cl_fill, reseeded, tile));
    // One handle size, two dtypes (a vector's footprint counts elements only).
    tsl_fill_args f64 = args;
    f64.dtype = TSL_F64;
    EXPECT_NE(seen.back(), footprint(tsl_cl_fill, f64, tile));
}

TEST(Footprint, PoolKind)
{
    Handles xy({4 * 16 * 16, 4 * 8 * 8});
    tsl_pool_args max = {};
    max.dtype = TSL_F32;
    max.spatial = 2;
    max.kind = TSL_POOL_MAX;
    max.channels = 4;
    max.planes = 4;
    for (int d = 0; d < 3; d++) {
        max.in_size[d] = d < 2 ? 16 : 1;
        max.out_size[d] = d < 2 ? 8 : 1;
        max.kernel[d] = d < 2 ? 2 : 1;
        max.stride[d] = max.kernel[d];
    }
    tsl_pool_args avg = max;
    avg.kind = TSL_POOL_AVG;
    uint32_t f_max = footprint(tsl_cl_pool_forward, max, xy);
    EXPECT_NE(f_max, footprint(tsl_cl_pool_forward, avg, xy));
    // Where the tile sits in a larger tensor is not a variant.
    tsl_pool_args moved = max;
    moved.out_origin[0] = 8;
    moved.in_origin[0] = 16;
    EXPECT_EQ(f_max, footprint(tsl_cl_pool_forward, moved, xy));
}
