// Layer-parallel training by multigrid in time (plan parts layers=, levels=, cf=, iters=,
// biters=, relax=): the MGRIT forward and adjoint V-cycles against the serial executor (the
// default plan, one sweep through the steps) on ODE networks of the zoo, at 1, 2 and 4 ranks
// (layers= spreads the steps over the ranks). Exact schedules (two levels with as many
// F-relaxation cycles as coarse steps, which makes every C-point exact) and a three-level
// schedule with eight cycles must give the serial executor's loss, output, every parameter
// gradient and the parameters after three SGD steps bit for bit (the coarse right-hand sides
// are kept as two terms, so a converged coarse step is the fine value exactly); one cycle must
// not; the residual norms must fall; bad plans fail before any task.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "model_test.h"
#include "mpi_test_env.h"

using namespace tsltest;

namespace
{

struct Outcome {
    double loss = 0;
    std::vector<std::vector<float>> t; // output, gradients, parameters after 3 steps
    std::vector<double> forward_res, backward_res;
    std::vector<float> fresh; // the inference output of the model before any training
};

const int64_t kSample[3] = {2, 6, 6}, kBatch = 4, kClasses = 3;

// `zoo` on kBatch (2, 6, 6) samples under `plan_text` ("" for the serial default): the loss
// and gradients of one batch, the inference output, and the parameters after three steps of
// momentum SGD on it; the residual norms of the first gradient step.
void run(const char *zoo, const std::string &plan_text, Outcome *r)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph(zoo, 3, kSample, kClasses, &g), TSL_OK) << tsl_last_error();
    tsl_plan plan;
    ASSERT_EQ(tsl_plan_parse(plan_text.c_str(), &plan), TSL_OK) << tsl_last_error();
    tsl_model_t m = nullptr;
    ASSERT_EQ(tsl_model_create_plan(&m, ctx, g, seed + 7, plan_text.empty() ? nullptr : &plan),
              TSL_OK)
        << tsl_context_last_error(ctx);
    Batch b = make_batch(kBatch, 2 * 6 * 6, kClasses, seed + 8);
    r->fresh.assign((size_t)(kBatch * kClasses), NAN);
    ASSERT_EQ(tsl_model_forward(m, kBatch, b.x.data(), 0, r->fresh.data()), TSL_OK)
        << tsl_context_last_error(ctx);
    MPI_Bcast(r->fresh.data(), (int)r->fresh.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    ASSERT_EQ(tsl_model_gradients(m, kBatch, b.x.data(), b.y.data(), &r->loss), TSL_OK)
        << tsl_context_last_error(ctx);
    if (tsl_model_mgrit_segments(m) > 0) {
        for (int dir = 0; dir < 2; dir++) {
            double norms[64];
            int32_t count = 0;
            ASSERT_EQ(tsl_model_mgrit_residuals(m, 0, dir, 64, norms, &count), TSL_OK)
                << tsl_context_last_error(ctx);
            (dir ? r->backward_res : r->forward_res).assign(norms, norms + std::min(count, 64));
        }
    }
    std::vector<float> y((size_t)(kBatch * kClasses));
    ASSERT_EQ(tsl_model_forward(m, kBatch, b.x.data(), 0, y.data()), TSL_OK)
        << tsl_context_last_error(ctx);
    MPI_Bcast(y.data(), (int)y.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    r->t.push_back(y);
    push_params(m, g, true, &r->t);
    tsl_optimizer_t opt = momentum_sgd();
    ASSERT_NE(opt, nullptr);
    for (int k = 0; k < 3; k++)
        ASSERT_EQ(tsl_model_train_step(m, kBatch, b.x.data(), b.y.data(), opt, nullptr, nullptr),
                  TSL_OK)
            << tsl_context_last_error(ctx);
    push_params(m, g, false, &r->t);
    tsl_optimizer_destroy(opt);
    tsl_model_destroy(m);
    tsl_graph_destroy(g);
}

// max |a - b| / max |b| over a tensor.
double rel(const std::vector<float> &a, const std::vector<float> &b)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        d = std::max(d, (double)std::fabs(a[i] - b[i]));
        s = std::max(s, (double)std::fabs(b[i]));
    }
    return a.size() == b.size() ? d / (s > 0 ? s : 1) : INFINITY;
}

// The first tensor further than `tol` from the reference (relative to its largest value), or "".
std::string differs(const Outcome &got, const Outcome &ref, double tol)
{
    std::ostringstream why;
    if (got.t.size() != ref.t.size())
        why << got.t.size() << " tensors, not " << ref.t.size();
    else if (std::fabs(got.loss - ref.loss) > tol * std::fabs(ref.loss))
        why << "loss " << got.loss << " vs " << ref.loss;
    for (size_t k = 0; why.str().empty() && k < ref.t.size(); k++)
        if (!(rel(got.t[k], ref.t[k]) <= tol))
            why << (k == 0                  ? "output"
                    : k <= ref.t.size() / 2 ? "gradient "
                                            : "parameter ")
                << k << ": " << rel(got.t[k], ref.t[k]);
    return why.str();
}

} // namespace

// Two levels with iterations >= N / cf (F-relaxation makes one more C-point exact per cycle)
// equal the serial executor on the same layer groups and tiles bit for bit, at 1, 2 and 4
// ranks; and that serial executor (levels=1) gives the default plan's results within the
// rounding that other tiles bring (as the other plans' tests allow).
TEST(Mgrit, ExactSchedulesEqualTheSerialExecutor)
{
    SamePlacementInEveryRun same_placement; // bits compared across runs
    struct Case {
        const char *plan, *serial;
    };
    const std::vector<Case> cases[3] = {
        {{"levels=2,cf=2,iters=4,biters=4,relax=F", ""},
         {"levels=2,cf=4,iters=2,biters=2,relax=F", ""},
         {"levels=2,cf=2,iters=4,biters=4,relax=FCF", ""},
         {"levels=3,cf=2,iters=4,biters=4,relax=F,skip=1", ""}},
        {{"layers=2,levels=2,cf=2,iters=4,biters=4,relax=F", "layers=2"},
         {"layers=2,levels=2,cf=2,iters=4,biters=4,relax=FCF,skip=1", "layers=2"}},
        {{"layers=4,levels=2,cf=2,iters=4,biters=4,relax=F", "layers=4"},
         {"layers=2,data=2,levels=2,cf=4,iters=2,biters=2", "layers=2,data=2"}},
    };
    if (size == 3 || size > 4)
        GTEST_SKIP() << "plans for 1, 2 and 4 ranks";
    for (const char *zoo : {"odetanh8", "odenet8"}) {
        Outcome ref;
        run(zoo, "", &ref);
        for (const Case &c : cases[size == 1 ? 0 : size == 2 ? 1 : 2]) {
            SCOPED_TRACE(std::string(zoo) + " with plan " + c.plan);
            Outcome serial, got;
            if (*c.serial) {
                run(zoo, c.serial, &serial);
                EXPECT_EQ(differs(serial, ref, 1e-4), "") << "serial executor on " << c.serial;
            } else {
                serial = ref;
            }
            run(zoo, c.plan, &got);
            EXPECT_EQ(differs(got, serial, 0.0), "");
        }
    }
}

// Three levels, cf 2, eight cycles each way, 16 tanh steps (4 per rank at 4 ranks): the serial
// executor's bits; and one cycle of F-relaxation does not get there.
TEST(Mgrit, ThreeLevelsEightCyclesMatchTheSerialExecutor)
{
    SamePlacementInEveryRun same_placement; // bits compared across runs
    if (size == 3 || size > 4)
        GTEST_SKIP() << "plans for 1, 2 and 4 ranks";
    std::string layers = size > 1 ? "layers=" + std::to_string(size) : "";
    Outcome ref, got, few;
    run("odetanh16", layers, &ref); // the serial executor on the same layer groups
    std::string sep = layers.empty() ? "" : ",";
    run("odetanh16", layers + sep + "levels=3,cf=2,iters=8,biters=8", &got);
    EXPECT_EQ(differs(got, ref, 0.0), "");
    run("odetanh16", layers + sep + "levels=3,cf=2,iters=1,biters=1,relax=F", &few);
    EXPECT_NE(differs(few, ref, 1e-6), "") << "one cycle should not be exact";
    // Inference sweeps the steps by default (infer=exact): on the same parameters (before any
    // training) the serial executor's output bit for bit though the training schedule is one
    // cycle; infer=mgrit runs that cycle, and changes nothing of training.
    EXPECT_EQ(rel(few.fresh, ref.fresh), 0.0) << "inference with infer=exact";
    Outcome cycles;
    run("odetanh16", layers + sep + "levels=3,cf=2,iters=1,biters=1,relax=F,infer=mgrit", &cycles);
    EXPECT_GT(rel(cycles.fresh, ref.fresh), 1e-6) << "inference with infer=mgrit";
    for (size_t k = 1; k < few.t.size() && k < cycles.t.size(); k++)
        EXPECT_EQ(rel(cycles.t[k], few.t[k]), 0.0) << "infer= changed training, tensor " << k;
}

// The residual norms of the forward and the adjoint cycles do not increase, the first falls
// (a convergence factor below 1), and every rank reads the same norms.
TEST(Mgrit, ResidualNormsFall)
{
    if (size == 3 || size > 4)
        GTEST_SKIP() << "plans for 1, 2 and 4 ranks";
    std::string layers = size > 1 ? "layers=" + std::to_string(size) + "," : "";
    Outcome r;
    run("odetanh16", layers + "levels=2,cf=4,iters=3,biters=3,relax=F", &r);
    for (const std::vector<double> *res : {&r.forward_res, &r.backward_res}) {
        ASSERT_EQ(res->size(), 3u);
        EXPECT_GT((*res)[0], 0.0);
        EXPECT_LT((*res)[1], (*res)[0]) << "convergence factor " << (*res)[1] / (*res)[0];
        EXPECT_LE((*res)[2], (*res)[1]);
        std::vector<double> first(*res);
        MPI_Bcast(first.data(), (int)first.size(), MPI_DOUBLE, 0, MPI_COMM_WORLD);
        EXPECT_EQ(first, *res) << "rank " << rank << " read other norms";
    }
}

// Plans MGRIT cannot run are errors when the model is made, before any task.
TEST(Mgrit, BadPlansAreRefusedBeforeAnyTask)
{
    struct Bad {
        const char *zoo, *plan, *says;
    };
    const Bad bad[] = {
        {"odetanh8", "levels=4,cf=2", "coarsest level"}, // 8 / 8 = 1 point
        {"odetanh6", "levels=2,cf=4", "multiple of"},    // 6 steps, cf 4
        {"cnn", "levels=2", "has none"},                 // no ODE segment
        {"odetanh8", "levels=2,cf=1", "at least 2"},     // coarsening factor
        {"odetanh8", "levels=2,iters=65", "iterations"}, // too many to report
    };
    for (const Bad &b : bad) {
        SCOPED_TRACE(std::string(b.zoo) + " with " + b.plan);
        tsl_graph_t g = nullptr;
        ASSERT_EQ(tsl_zoo_graph(b.zoo, 3, kSample, kClasses, &g), TSL_OK) << tsl_last_error();
        std::string text = std::string(b.plan) + (size > 1 ? ",data=" + std::to_string(size) : "");
        tsl_plan plan;
        ASSERT_EQ(tsl_plan_parse(text.c_str(), &plan), TSL_OK) << tsl_last_error();
        tsl_model_t m = nullptr;
        EXPECT_EQ(tsl_model_create_plan(&m, ctx, g, seed, &plan), TSL_ERR_INVALID_ARG);
        EXPECT_EQ(m, nullptr);
        EXPECT_NE(std::string(tsl_context_last_error(ctx)).find(b.says), std::string::npos)
            << tsl_context_last_error(ctx);
        tsl_graph_destroy(g);
    }
}

// A value inside a segment MGRIT solves is not made whole: a loss term on it set on the model,
// or a forward asking for it, is refused before any task; named in the graph's loss, the value
// ends the run of steps there (the graph has fewer steps to solve), and u_N stays available.
TEST(Mgrit, ValuesInsideASegmentAreNotReadByLossesOrForwards)
{
    tsl_graph_t g = nullptr;
    ASSERT_EQ(tsl_zoo_graph("odetanh8", 3, kSample, kClasses, &g), TSL_OK) << tsl_last_error();
    tsl_ode_segment seg[4];
    int32_t count = 0;
    ASSERT_EQ(tsl_graph_ode_segments(g, 4, seg, &count), TSL_OK);
    ASSERT_EQ(count, 1);
    ASSERT_EQ(seg[0].steps, 8);
    // u_4: the output of the fourth step's add, inside the run
    int32_t inside = -1, u_n = seg[0].output;
    tsl_graph_op_info(g, seg[0].first_op + 4 * seg[0].ops_per_step - 1, nullptr, nullptr, &inside);
    ASSERT_GE(inside, 0);
    std::string text = "levels=2,cf=2" + (size > 1 ? ",data=" + std::to_string(size) : "");
    tsl_plan plan;
    ASSERT_EQ(tsl_plan_parse(text.c_str(), &plan), TSL_OK);
    tsl_model_t m = nullptr;
    ASSERT_EQ(tsl_model_create_plan(&m, ctx, g, seed, &plan), TSL_OK)
        << tsl_context_last_error(ctx);
    const tsl_loss_term on_inside[2] = {{TSL_MODEL_LOSS_CROSS_ENTROPY, 1.0, 0, 0},
                                        {TSL_MODEL_LOSS_MSE, 1.0, inside + 1, u_n + 1}};
    EXPECT_EQ(tsl_model_set_loss(m, 2, on_inside), TSL_ERR_INVALID_ARG);
    EXPECT_NE(std::string(tsl_context_last_error(ctx)).find("inside a segment MGRIT solves"),
              std::string::npos)
        << tsl_context_last_error(ctx);
    tsl_shape us;
    ASSERT_EQ(tsl_graph_value_shape(g, u_n, &us), TSL_OK);
    int64_t xd[4] = {2, kSample[0], kSample[1], kSample[2]},
            od[4] = {2, us.dims[0], us.dims[1], us.dims[2]};
    tsl_shape xs, os;
    tsl_shape_make(&xs, 4, xd);
    tsl_shape_make(&os, 4, od);
    tsl_tensor_t x = nullptr, o = nullptr;
    ASSERT_EQ(tsl_tensor_create(&x, ctx, TSL_F32, &xs, nullptr, nullptr), TSL_OK);
    ASSERT_EQ(tsl_tensor_create(&o, ctx, TSL_F32, &os, nullptr, nullptr), TSL_OK);
    ASSERT_EQ(tsl_tensor_fill_constant(x, 0.5), TSL_OK);
    EXPECT_EQ(tsl_model_forward_values_tensors(m, x, 0, 1, &inside, &o), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_model_forward_values_tensors(m, x, 0, 1, &u_n, &o), TSL_OK)
        << tsl_context_last_error(ctx);
    tsl_model_destroy(m);
    // In the graph's loss: the run ends before the value, which is then a step's output.
    ASSERT_EQ(tsl_graph_set_loss(g, 2, on_inside), TSL_OK) << tsl_last_error();
    ASSERT_EQ(tsl_graph_ode_segments(g, 4, seg, &count), TSL_OK);
    int32_t steps = 0;
    for (int32_t k = 0; k < count; k++)
        steps += seg[k].steps;
    EXPECT_LT(steps, 8);
    tsl_tensor_destroy(x);
    tsl_tensor_destroy(o);
    tsl_graph_destroy(g);
}
