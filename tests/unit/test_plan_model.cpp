// The performance model and the plan search (graph/plan_model.c): the candidates against an
// enumeration written here, the search against brute force on a synthetic cost table, the
// model's terms on plans whose answer is known, and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

extern "C" {
#include "tessel/graph.h"
#include "tessel/plan.h"
}

#include "graph_helpers.h"

namespace
{

// The model's prediction of the plan `text` for g (a parse or prediction error fails the test).
tsl_plan_prediction predicted(tsl_graph_t g, const tsl_plan_costs &costs, const char *text,
                              int32_t ranks, int32_t workers, int64_t batch, int32_t states)
{
    tsl_plan plan;
    EXPECT_EQ(tsl_plan_parse(text, &plan), TSL_OK) << text;
    tsl_plan_prediction out{};
    EXPECT_EQ(tsl_plan_predict(&plan, g, ranks, workers, batch, states, &costs, &out), TSL_OK)
        << text << ": " << tsl_last_error();
    return out;
}

tsl_graph_t cnn(int64_t side)
{
    const int64_t sample[3] = {1, side, side};
    tsl_graph_t g = nullptr;
    EXPECT_EQ(tsl_zoo_graph("cnn", 3, sample, 10, &g), TSL_OK) << tsl_last_error();
    return g;
}

std::string text(const tsl_plan &p)
{
    char t[256];
    EXPECT_EQ(tsl_plan_format(&p, t, sizeof t), TSL_OK);
    return t;
}

std::vector<tsl_plan> candidates(tsl_graph_t g, int32_t ranks, int32_t workers, int64_t batch)
{
    int32_t n = 0;
    EXPECT_EQ(tsl_plan_candidates(g, ranks, workers, batch, nullptr, 0, &n), TSL_OK);
    std::vector<tsl_plan> plans((size_t)n);
    int32_t again = 0;
    EXPECT_EQ(tsl_plan_candidates(g, ranks, workers, batch, plans.data(), n, &again), TSL_OK);
    EXPECT_EQ(again, n);
    return plans;
}

// The plans the search must consider, enumerated independently of plan_model.c: every
// D x F x A x B x S = ranks (F as filters= or as channels=) (2-D samples of side `side`), micro
// 1/2/4/8 with stages, tiles 1 and W; with `remakes` (a norm's ReLU output the backward can
// make again) each also with recompute=1.
std::set<std::string> expected(int32_t ranks, int32_t workers, int64_t batch, int64_t side,
                               int32_t nops, bool remakes = false)
{
    std::set<std::string> out;
    for (int s = 1; s <= ranks; s++)
        for (int d = 1; d <= ranks; d++)
            for (int f = 1; f <= ranks; f++)
                for (int a = 1; a <= ranks; a++)
                    for (int b = 1; b <= ranks; b++) {
                        if (s * d * f * a * b != ranks || d > batch || a > side || b > side ||
                            s > nops)
                            continue;
                        for (int m : {1, 2, 4, 8}) {
                            if (m > 1 && (s == 1 || m > batch / d))
                                continue;
                            std::vector<int> tiles = {1};
                            if (workers > 1 && (a * b > 1 || batch / d < workers))
                                tiles.push_back(workers);
                            for (int t : tiles)
                                for (const char *cut : {"filters", "channels"}) {
                                    if (f == 1 && std::string(cut) == "channels")
                                        continue;
                                    std::string p = "data=" + std::to_string(d);
                                    if (f > 1)
                                        p += std::string(",") + cut + "=" + std::to_string(f);
                                    if (a * b > 1)
                                        p += ",space=" + std::to_string(a) +
                                             (b > 1 ? "x" + std::to_string(b) : "");
                                    if (s > 1)
                                        p += ",stages=" + std::to_string(s);
                                    if (m > 1)
                                        p += ",micro=" + std::to_string(m);
                                    if (t > 1)
                                        p += ",tiles=" + std::to_string(t);
                                    tsl_plan parsed;
                                    EXPECT_EQ(tsl_plan_parse(p.c_str(), &parsed), TSL_OK) << p;
                                    out.insert(text(parsed));
                                    if (!remakes)
                                        continue;
                                    p += ",recompute=1";
                                    EXPECT_EQ(tsl_plan_parse(p.c_str(), &parsed), TSL_OK) << p;
                                    out.insert(text(parsed));
                                }
                        }
                    }
    return out;
}

// input (1, 8, 8) -> 6 x (conv 3x3 to 8 channels [-> batch norm] -> ReLU) -> flatten ->
// linear to 2; stage 1 (of a hand split) from the batch norm of block `cut` (-1: computed).
tsl_graph_t chain(bool batchnorm, int cut = -1)
{
    const int64_t k[2] = {3, 3};
    tsl_conv_params cp;
    int32_t v = -1;
    tsl_graph_t g = graph_on_8x8(1, &v, &cp);
    for (int i = 0; i < 6; i++) {
        std::string name = "c" + std::to_string(i), bn = "bn" + std::to_string(i);
        EXPECT_EQ(tsl_graph_conv(g, name.c_str(), v, 8, k, &cp, 0, 0, &v), TSL_OK);
        if (batchnorm)
            EXPECT_EQ(tsl_graph_batchnorm(g, bn.c_str(), v, 1e-5, 0.1, &v), TSL_OK);
        if (batchnorm && i == cut)
            EXPECT_EQ(tsl_graph_set_stage(g, v, 1), TSL_OK);
        EXPECT_EQ(tsl_graph_activation(g, v, TSL_ACT_RELU, 0, &v), TSL_OK);
    }
    EXPECT_EQ(tsl_graph_flatten(g, v, &v), TSL_OK);
    EXPECT_EQ(tsl_graph_linear(g, "fc", v, 2, 1, &v), TSL_OK);
    EXPECT_EQ(tsl_graph_set_output(g, v), TSL_OK);
    return g;
}

// The convolutions and linear layers of stage 1 of g under `plan` (2 stages, for `batch` and
// `states` optimizer states as the prediction splits it).
int32_t stage1_layers(tsl_graph_t g, const char *plan, int64_t batch, int32_t states)
{
    tsl_plan p;
    EXPECT_EQ(tsl_plan_parse(plan, &p), TSL_OK);
    int32_t nops = tsl_graph_op_count(g), weighted = 0;
    std::vector<int32_t> stage((size_t)nops);
    EXPECT_EQ(tsl_plan_stages(&p, g, batch, states, stage.data()), TSL_OK) << tsl_last_error();
    for (int32_t o = 0; o < nops; o++) {
        tsl_op_kind kind;
        EXPECT_EQ(tsl_graph_op_info(g, o, &kind, nullptr, nullptr), TSL_OK);
        weighted += stage[(size_t)o] == 1 && (kind == TSL_OP_CONV || kind == TSL_OP_LINEAR);
    }
    return weighted;
}

} // namespace

TEST(PlanModel, CandidatesAreEveryFactorisation)
{
    tsl_graph_t g = cnn(28);
    for (int32_t ranks : {1, 2, 4, 6, 8})
        for (int32_t workers : {1, 2}) {
            std::vector<tsl_plan> got = candidates(g, ranks, workers, 16);
            std::set<std::string> names;
            for (const tsl_plan &p : got) {
                EXPECT_EQ(tsl_plan_ranks(&p), ranks) << text(p);
                names.insert(text(p));
            }
            EXPECT_EQ(names.size(), got.size()) << "a candidate twice";
            EXPECT_EQ(names, expected(ranks, workers, 16, 28, tsl_graph_op_count(g)))
                << ranks << " ranks, " << workers << " workers";
        }
    // few samples: no sample group larger than the batch, no micro-batch of nothing
    for (const tsl_plan &p : candidates(g, 8, 1, 2)) {
        EXPECT_LE(p.data, 2) << text(p);
        EXPECT_LE(p.micro, 2 / p.data) << text(p);
    }
    tsl_graph_destroy(g);
    // batch norms with ReLUs that convolutions read: each plan also remaking those outputs,
    // right after it; without the batch norms none
    for (bool bn : {true, false}) {
        g = chain(bn);
        for (int32_t ranks : {1, 2, 4}) {
            std::vector<tsl_plan> got = candidates(g, ranks, 2, 16);
            std::set<std::string> names;
            for (size_t i = 0; i < got.size(); i++) {
                names.insert(text(got[i]));
                if (got[i].recompute) { // its twin before it
                    ASSERT_GT(i, 0u);
                    tsl_plan twin = got[i];
                    twin.recompute = 0;
                    EXPECT_EQ(text(got[i - 1]), text(twin));
                }
            }
            EXPECT_EQ(names.size(), got.size()) << "a candidate twice";
            EXPECT_EQ(names, expected(ranks, 2, 16, 8, tsl_graph_op_count(g), bn))
                << ranks << " ranks, batch norm " << bn;
        }
        tsl_graph_destroy(g);
    }
}

namespace
{

// A synthetic cost table: seconds and peak from a hash of the plan's text.
tsl_status synthetic(const tsl_plan *plan, void *, tsl_plan_prediction *out)
{
    std::string t = text(*plan);
    uint64_t h = 1469598103934665603ull;
    for (char c : t)
        h = (h ^ (unsigned char)c) * 1099511628211ull;
    std::memset(out, 0, sizeof *out);
    out->seconds = (double)(h % 1000) / 100.0;
    out->peak_bytes = (int64_t)((h >> 20) % 500) * 1024;
    out->sent_bytes = (int64_t)((h >> 40) % 7) * 1000; // few values: ties on time break on it
    out->binding = (int32_t)(h % TSL_TERM_COUNT);
    return TSL_OK;
}

// Synthetic costs that grow with recompute=1 (remaking adds work), so the rule is seen.
tsl_status synthetic_remaking(const tsl_plan *plan, void *user, tsl_plan_prediction *out)
{
    tsl_plan kept = *plan;
    kept.recompute = 0;
    tsl_status st = synthetic(&kept, user, out);
    if (plan->recompute) {
        out->seconds *= 1.1;
        out->peak_bytes = out->peak_bytes * 3 / 4;
    }
    return st;
}

// tsl_plan_search() against brute force over the candidates' synthetic costs: the best by
// (time, bytes sent, peak) or (peak, time), then candidate order, within the budget; for time a
// recompute=1 plan only where the same plan without it does not fit.
void search_equals_brute_force(tsl_graph_t g, int32_t ranks)
{
    std::vector<tsl_plan> all = candidates(g, ranks, 2, 32);
    for (int objective : {TSL_OBJECTIVE_TIME, TSL_OBJECTIVE_MEMORY})
        for (int64_t budget : {(int64_t)0, (int64_t)250 * 1024}) {
            int best = -1, fit = 0;
            tsl_plan_prediction pb{}, pi;
            auto key = [objective](const tsl_plan_prediction &p) {
                return objective ? std::vector<double>{(double)p.peak_bytes, p.seconds}
                                 : std::vector<double>{p.seconds, (double)p.sent_bytes,
                                                       (double)p.peak_bytes};
            };
            auto fits = [budget](const tsl_plan &p) {
                tsl_plan_prediction q;
                synthetic_remaking(&p, nullptr, &q);
                return budget <= 0 || q.peak_bytes <= budget;
            };
            for (size_t i = 0; i < all.size(); i++) {
                synthetic_remaking(&all[i], nullptr, &pi);
                if (!fits(all[i]))
                    continue;
                tsl_plan twin = all[i];
                twin.recompute = 0;
                if (objective == TSL_OBJECTIVE_TIME && all[i].recompute && fits(twin))
                    continue;
                fit++;
                if (best < 0 || key(pi) < key(pb)) {
                    best = (int)i;
                    pb = pi;
                }
            }
            ASSERT_GE(best, 0);
            std::vector<tsl_plan_prediction> ranked(5);
            int32_t count = 0;
            ASSERT_EQ(tsl_plan_search(g, ranks, 2, 32, 2, nullptr, budget, objective,
                                      synthetic_remaking, nullptr, ranked.data(), 5, &count),
                      TSL_OK)
                << tsl_last_error();
            EXPECT_EQ(count, fit);
            EXPECT_EQ(text(ranked[0].plan), text(all[(size_t)best]))
                << ranks << " ranks, objective " << objective << ", budget " << budget;
            for (int32_t i = 1; i < 5 && i < count; i++) { // sorted
                double a = objective ? (double)ranked[i - 1].peak_bytes : ranked[i - 1].seconds;
                double b = objective ? (double)ranked[i].peak_bytes : ranked[i].seconds;
                EXPECT_LE(a, b);
                if (budget > 0)
                    EXPECT_LE(ranked[i].peak_bytes, budget);
            }
        }
    // nothing fits: a clear error naming the smallest need
    int32_t count = 0;
    tsl_plan_prediction one;
    EXPECT_EQ(tsl_plan_search(g, ranks, 2, 32, 2, nullptr, 1, TSL_OBJECTIVE_TIME,
                              synthetic_remaking, nullptr, &one, 1, &count),
              TSL_ERR_RESOURCE);
    EXPECT_NE(std::string(tsl_last_error()).find("fits in"), std::string::npos);
}

} // namespace

TEST(PlanModel, SearchEqualsBruteForceOnASyntheticTable)
{
    for (int net = 0; net < 2; net++) // (the second with recompute=1 twins)
        for (int32_t ranks : {2, 4, 8}) {
            tsl_graph_t g = net ? chain(true) : cnn(28);
            search_equals_brute_force(g, ranks);
            tsl_graph_destroy(g);
        }
}

// Micro-batches overlap a pipeline's stages; batch norm's statistics are exact over the whole
// batch, so a batch norm waits for every micro-batch, and a network with one after every
// convolution overlaps its stages only between the batch norms at their edge.
TEST(PlanModel, PipelinesOverlapOnlyBetweenBatchNorms)
{
    for (int c = 0; c < 3; c++) {
        bool bn = c > 0;
        SCOPED_TRACE(!bn      ? "no batch norm"
                     : c == 1 ? "a batch norm after every convolution"
                              : "and the second stage starting at one");
        tsl_graph_t g = chain(bn, c == 2 ? 3 : -1);
        int32_t nops = tsl_graph_op_count(g);
        std::vector<double> op(nops, 1e-4);
        tsl_plan_costs costs{};
        costs.nops = nops;
        costs.op_seconds = op.data();
        costs.bandwidth = 1e15; // (the stage boundaries' bytes cost nothing)
        // (the stages' ops fixed: balance=memory may cut the chain elsewhere for each micro)
        auto predict = [&](const char *p) {
            return predicted(g, costs, (std::string(p) + ",balance=layers").c_str(), 2, 1, 16, 1)
                .seconds;
        };
        double serial = 1e-4 * 16 * (nops - 1), one = predict("stages=2"),
               four = predict("stages=2,micro=4"), eight = predict("stages=2,micro=8");
        // One micro-batch: the stages in turn, but for what stage 1 makes after the input
        // gradient stage 0 waits for: its first convolution's weights' gradients, half of that
        // op's backward (2/3 of its time u, one op's time for the batch), beside stage 0's longer
        // backward. Its other layers with weights make theirs in turn.
        const double u = 1e-4 * 16;
        const int32_t weighted = stage1_layers(g, "stages=2,balance=layers", 16, 1);
        EXPECT_GE(weighted, 3);
        EXPECT_NEAR(one, serial - u / 3, 1e-6 * serial);
        EXPECT_LE(eight, four * (1 + 1e-9));
        EXPECT_LE(four, one * (1 + 1e-9));
        if (!bn) // the stages overlap for all but the fill and drain
            EXPECT_LT(four, 0.75 * one) << four << " s against " << one << " s";
        else
            EXPECT_GT(four, 0.9 * one) << four << " s against " << one << " s";
        // the step's waits that do not grow with the tasks count once, whatever the plan
        costs.wait_seconds = 1e-3;
        EXPECT_NEAR(predict("stages=2,micro=8"), eight + 1e-3, 1e-12);
        EXPECT_NEAR(predict("stages=2"), one + 1e-3, 1e-12);
        costs.wait_seconds = 0;
        if (c == 2) {
            // Stage 1 = bn3 ... fc waits for all of stage 0's forward (it starts with a batch
            // norm); its backward ends in a segment of bn3 alone (a third of an op's time is its
            // forward for ops with parameters, so 2/3 u), and stage 0's backward starts on
            // micro-batch 0 once bn3 is done with it: beyond c4's weights' gradients, the only
            // overlap is 3/4 of bn3's backward.
            EXPECT_EQ(weighted, 3); // c4, c5, fc
            EXPECT_NEAR(four, serial - u / 3 - 0.75 * (2.0 / 3.0) * u, 1e-9);
        }
        tsl_graph_destroy(g);
    }
}

// Stages on parallel branches of the graph run at once: input (2, 8, 8) -> channel 0 -> three
// 3x3 convolutions (branch A, stage 0); channel 1 -> three more (branch B, stage 1, from the
// input on stage 0) -> A + B -> flatten -> linear (stage 1). B's forward needs nothing of stage
// 0, so it runs beside A; the add waits for A. One micro-batch: stage 1's forward ends at
// max(A, B) + the head, not A + B + the head (a chain of the same ops does).
TEST(PlanModel, PipelineStagesOnParallelBranchesRunAtOnce)
{
    const int64_t k[2] = {3, 3}, lo0[3] = {0, 0, 0}, hi0[3] = {1, 8, 8}, lo1[3] = {1, 0, 0},
                  hi1[3] = {2, 8, 8};
    tsl_conv_params cp;
    int32_t x = -1, a, b, v;
    tsl_graph_t g = graph_on_8x8(2, &x, &cp);
    ASSERT_EQ(tsl_graph_slice(g, x, lo0, hi0, &a), TSL_OK);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(tsl_graph_conv(g, ("a" + std::to_string(i)).c_str(), a, 4, k, &cp, 0, 0, &a),
                  TSL_OK);
    ASSERT_EQ(tsl_graph_slice(g, x, lo1, hi1, &b), TSL_OK);
    ASSERT_EQ(tsl_graph_set_stage(g, b, 1), TSL_OK);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(tsl_graph_conv(g, ("b" + std::to_string(i)).c_str(), b, 4, k, &cp, 0, 0, &b),
                  TSL_OK);
    ASSERT_EQ(tsl_graph_add(g, a, b, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_flatten(g, v, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_linear(g, "fc", v, 2, 1, &v), TSL_OK);
    ASSERT_EQ(tsl_graph_set_output(g, v), TSL_OK);
    int32_t nops = tsl_graph_op_count(g);
    ASSERT_EQ(nops, 12); // input, slice, 3 convs, slice, 3 convs, add, flatten, fc
    std::vector<double> op(nops, 1e-4);
    tsl_plan_costs costs{};
    costs.nops = nops;
    costs.op_seconds = op.data();
    costs.bandwidth = 1e15;
    tsl_plan plan;
    ASSERT_EQ(tsl_plan_parse("stages=2", &plan), TSL_OK);
    tsl_plan_prediction out;
    ASSERT_EQ(tsl_plan_predict(&plan, g, 2, 1, 16, 1, &costs, &out), TSL_OK) << tsl_last_error();
    // u: one op for the batch; the forwards take a third of an op with parameters (convs, fc),
    // half of the others. Forward: A (slice + 3 convs) and B alike at once, then add, flatten,
    // fc; backward: fc, flatten, add, then B and A at once again.
    const double u = 1e-4 * 16, branch_f = u / 2 + 3 * u / 3, head_f = u / 2 + u / 2 + u / 3;
    const double branch_b = u / 2 + 3 * 2 * u / 3, head_b = u / 2 + u / 2 + 2 * u / 3;
    EXPECT_NEAR(out.seconds, branch_f + head_f + head_b + branch_b, 1e-9);
    EXPECT_LT(out.seconds, 0.7 * u * (nops - 1)); // the ops one after the other
    tsl_graph_destroy(g);
}

// The peak estimate of a pipeline: a rank takes its micro-batches through the backward one
// after the other, so micro-batch j's input gradients are made after micro-batch j - 1's output
// and output gradient are gone; the peak at the backward's start shrinks with more of them (the
// forward's end, every activation alive, is the same).
TEST(PlanModel, PipelinePeaksMakeTheMicroBatchesGradientsInTurn)
{
    tsl_graph_t g = chain(false);
    auto peak = [&](const char *p) {
        tsl_plan plan;
        EXPECT_EQ(tsl_plan_parse(p, &plan), TSL_OK);
        int64_t bytes[2] = {0, 0};
        EXPECT_EQ(tsl_plan_estimate_peak(&plan, g, 2, 1, 16, 1, bytes), TSL_OK)
            << p << ": " << tsl_last_error();
        return std::max(bytes[0], bytes[1]);
    };
    int64_t one = peak("stages=2"), two = peak("stages=2,micro=2"), four = peak("stages=2,micro=4");
    EXPECT_LT(two, one);
    EXPECT_LT(four, two);
    // what goes is at most the largest op's input gradients and output for the batch: 8
    // channels of 8 x 8 floats for 16 samples, three such values
    EXPECT_GE(four, one - 3 * 16 * 8 * 8 * 8 * 4);
    tsl_graph_destroy(g);
}

TEST(PlanModel, PredictionsFollowTheGeometry)
{
    tsl_graph_t g = cnn(28);
    int32_t nops = tsl_graph_op_count(g);
    std::vector<double> op(nops, 1e-4);
    std::vector<double> windowed(nops, 3e-4);
    tsl_plan_costs costs{};
    costs.nops = nops;
    costs.op_seconds = op.data();
    costs.latency = 1e-6;
    costs.bandwidth = 1e10;
    auto predict = [&](const char *p, int32_t ranks, int32_t workers) {
        return predicted(g, costs, p, ranks, workers, 64, 2);
    };
    tsl_plan_prediction one = predict("data=1", 1, 1), two = predict("data=2", 2, 1),
                        four = predict("data=4", 4, 1), w2 = predict("data=1", 1, 2);
    double serial = 1e-4 * 64 * (nops - 1); // every op but the input, one worker
    EXPECT_NEAR(one.terms[TSL_TERM_COMPUTE], serial, 1e-9 * serial);
    EXPECT_NEAR(two.terms[TSL_TERM_COMPUTE], serial / 2, 1e-9 * serial);
    EXPECT_NEAR(four.terms[TSL_TERM_COMPUTE], serial / 4, 1e-9 * serial);
    EXPECT_NEAR(w2.terms[TSL_TERM_COMPUTE], serial / 2, 1e-9 * serial);
    EXPECT_EQ(one.terms[TSL_TERM_PARAMS], 0.0); // one rank sends nothing
    EXPECT_GT(two.terms[TSL_TERM_PARAMS], 0.0);
    EXPECT_GT(two.sent_bytes, 0);
    EXPECT_EQ(one.binding, TSL_TERM_COMPUTE);
    // a pipeline: (the stages' times + (M - 1) x the slowest) / M; one micro-batch runs the
    // stages one after the other (the serial work, but for stage 1's first layer's weights'
    // gradients beside stage 0's backward: a third of that op's time), more overlap them down
    // to the slowest
    tsl_plan_prediction pipe1 = predict("stages=2", 2, 1),
                        pipe4 = predict("stages=2,micro=4", 2, 1);
    EXPECT_GE(stage1_layers(g, "stages=2", 64, 2), 2);
    EXPECT_NEAR(pipe1.seconds, serial - 1e-4 * 64 / 3, 0.01 * serial);
    EXPECT_LT(pipe4.seconds, pipe1.seconds);
    EXPECT_GE(pipe4.seconds, 0.625 * serial * 0.99); // the slowest stage holds >= half the work
    EXPECT_GT(pipe4.seconds, two.seconds);
    EXPECT_GT(pipe4.terms[TSL_TERM_BUBBLE], 0.0);
    EXPECT_LT(pipe4.terms[TSL_TERM_BUBBLE], pipe4.seconds);
    // ops on spatial tiles take their windowed costs (3x here); sample tiles do not
    costs.op_seconds_windowed = windowed.data();
    EXPECT_NEAR(predict("data=2", 2, 1).terms[TSL_TERM_COMPUTE], serial / 2, 1e-9 * serial);
    tsl_plan_prediction space = predict("space=2", 2, 1);
    EXPECT_GT(space.terms[TSL_TERM_COMPUTE], 2.0 * serial / 2); // all but the head on windows
    EXPECT_LE(space.terms[TSL_TERM_COMPUTE], 3.0 * serial / 2 * (1 + 1e-9));
    // cut along the last spatial dimension (space=1x2), the costs measured so where there are
    // (5x here), else the windows'
    std::vector<double> rows(nops, 5e-4);
    costs.op_seconds_windowed_last = rows.data();
    EXPECT_EQ(predict("space=2", 2, 1).terms[TSL_TERM_COMPUTE], space.terms[TSL_TERM_COMPUTE]);
    tsl_plan_prediction along_rows = predict("space=1x2", 2, 1);
    EXPECT_GT(along_rows.terms[TSL_TERM_COMPUTE], 3.0 * serial / 2); // (windows: at most 3x)
    EXPECT_LE(along_rows.terms[TSL_TERM_COMPUTE], 5.0 * serial / 2 * (1 + 1e-9));
    costs.op_seconds_windowed_last = nullptr;
    EXPECT_EQ(predict("space=1x2", 2, 1).terms[TSL_TERM_COMPUTE], space.terms[TSL_TERM_COMPUTE]);
    costs.op_seconds_windowed = nullptr;
    // spatial halos overlap the work; under channel groups the input's other channel tiles
    // (the "halos" term there) come before each pass, on the critical path like the sums
    costs.bandwidth = 1e8;
    auto work = [](const tsl_plan_prediction &p) {
        return p.terms[TSL_TERM_COMPUTE] + p.terms[TSL_TERM_TASKS];
    };
    tsl_plan_prediction filt = predict("filters=2", 2, 1), sp = predict("space=2", 2, 1);
    ASSERT_GT(filt.terms[TSL_TERM_HALOS], 0.0);
    ASSERT_GT(sp.terms[TSL_TERM_HALOS], 0.0);
    double filt_overlapped = filt.terms[TSL_TERM_PARAMS] + filt.terms[TSL_TERM_STAGES];
    EXPECT_NEAR(filt.seconds,
                std::max(work(filt), filt_overlapped) + filt.terms[TSL_TERM_BATCHNORM] +
                    filt.terms[TSL_TERM_HALOS],
                1e-9 * filt.seconds);
    double sp_overlapped =
        sp.terms[TSL_TERM_PARAMS] + sp.terms[TSL_TERM_HALOS] + sp.terms[TSL_TERM_STAGES];
    EXPECT_NEAR(sp.seconds, std::max(work(sp), sp_overlapped) + sp.terms[TSL_TERM_BATCHNORM],
                1e-9 * sp.seconds);
    costs.bandwidth = 1e10;
    // ops on channel tiles take the channel tiles' costs: output channels' (filters=) and, where
    // measured apart, input channels' (channels=)
    {
        std::vector<double> out_ch(nops, 2e-4), in_ch(nops, 6e-4);
        costs.op_seconds_channels = out_ch.data();
        double f0 = predict("filters=2", 2, 1).terms[TSL_TERM_COMPUTE],
               c0 = predict("channels=2", 2, 1).terms[TSL_TERM_COMPUTE];
        costs.op_seconds_input_channels = in_ch.data();
        EXPECT_EQ(predict("filters=2", 2, 1).terms[TSL_TERM_COMPUTE], f0);
        EXPECT_GT(predict("channels=2", 2, 1).terms[TSL_TERM_COMPUTE], 1.5 * c0);
        costs.op_seconds_channels = costs.op_seconds_input_channels = nullptr;
        EXPECT_LT(predict("channels=2", 2, 1).terms[TSL_TERM_COMPUTE], c0);
        // cheaper on channel tiles than on samples (wide layers cut by filters): that cost too
        std::vector<double> cheap(nops, 0.5e-4);
        costs.op_seconds_channels = cheap.data();
        double f1 = predict("filters=2", 2, 1).terms[TSL_TERM_COMPUTE],
               d1 = predict("data=2", 2, 1).terms[TSL_TERM_COMPUTE];
        EXPECT_LT(f1, 0.9 * d1);
        EXPECT_GT(f1, 0.5 * d1 * (1 - 1e-9)); // (ops without channel tiles at 1e-4)
        costs.op_seconds_channels = nullptr;
    }
    // the step's waits, once: a spatial plan's those of the calibration's windows (halos)
    {
        tsl_plan_prediction d0 = predict("data=2", 2, 1), s0 = predict("space=2", 2, 1);
        costs.wait_seconds = 1e-3;
        costs.wait_seconds_windowed = 3e-3;
        EXPECT_NEAR(predict("data=2", 2, 1).seconds, d0.seconds + 1e-3, 1e-12);
        EXPECT_NEAR(predict("space=2", 2, 1).seconds, s0.seconds + 3e-3, 1e-12);
        EXPECT_NEAR(predict("space=2", 2, 1).terms[TSL_TERM_TASKS], s0.terms[TSL_TERM_TASKS] + 3e-3,
                    1e-12);
        costs.wait_seconds_windowed = 0; // not measured: the default run's
        EXPECT_NEAR(predict("space=2", 2, 1).seconds, s0.seconds + 1e-3, 1e-12);
        costs.wait_seconds = 0;
    }
    // a slow network binds a data-parallel step
    costs.bandwidth = 1e3;
    EXPECT_EQ(predict("data=2", 2, 1).binding, TSL_TERM_PARAMS);
    // bad arguments
    tsl_plan plan;
    tsl_plan_prediction out;
    ASSERT_EQ(tsl_plan_parse("data=2", &plan), TSL_OK);
    costs.bandwidth = 0;
    EXPECT_EQ(tsl_plan_predict(&plan, g, 2, 1, 64, 2, &costs, &out), TSL_ERR_INVALID_ARG);
    costs.bandwidth = 1e10;
    costs.nops = nops - 1;
    EXPECT_EQ(tsl_plan_predict(&plan, g, 2, 1, 64, 2, &costs, &out), TSL_ERR_INVALID_ARG);
    costs.nops = nops;
    EXPECT_EQ(tsl_plan_predict(&plan, g, 4, 1, 64, 2, &costs, &out), TSL_ERR_INVALID_ARG);
    tsl_graph_destroy(g);
}

// Four ranks on a node of two cores (tessel binds local rank l to core l mod 2): a core runs
// its two ranks' tasks one at a time. A plan that keeps every rank busy at once (data=4) takes
// the core's sum of its ranks' work, with the tasks' slowdown beyond that sharing and the waits
// of ranks busy together; a pipeline whose stages share the cores (ranks 0 and 2 on core 0)
// works in turn, at the tasks' speed alone, with the waits of ranks in turn.
TEST(PlanModel, RanksSharingCoresTakeTurns)
{
    tsl_graph_t g = cnn(28);
    int32_t nops = tsl_graph_op_count(g);
    std::vector<double> op(nops, 1e-4);
    tsl_plan_costs costs{};
    costs.nops = nops;
    costs.op_seconds = op.data();
    costs.latency = 0;
    costs.bandwidth = 1e15; // (nothing to wait for between ranks)
    auto predict = [&](const char *p) { return predicted(g, costs, p, 4, 1, 64, 0); };
    const double serial = 1e-4 * 64 * (nops - 1);
    tsl_plan_prediction data = predict("data=4"), pipe = predict("data=2,stages=2");
    EXPECT_NEAR(data.seconds, serial / 4, 1e-6 * serial); // a core per rank
    EXPECT_EQ(data.terms[TSL_TERM_CORES], 0.0);
    costs.node_ranks = 4;
    costs.node_cores = 2;
    tsl_plan_prediction shared = predict("data=4"), turns = predict("data=2,stages=2");
    EXPECT_NEAR(shared.seconds, serial / 2, 1e-6 * serial); // two ranks' work on each core
    EXPECT_NEAR(shared.terms[TSL_TERM_CORES], serial / 4, 1e-6 * serial);
    // already one at a time: the cores' work, where stage 1's first layer's weights' gradients
    // (a third of that op's time u for the rank's half batch) overlapped stage 0's backward
    const double u = 1e-4 * 32;
    EXPECT_GE(stage1_layers(g, "data=2,stages=2", 64, 0), 2);
    EXPECT_NEAR(pipe.seconds, serial / 2 - u / 3, 1e-6 * serial);
    EXPECT_NEAR(turns.seconds, serial / 2, 1e-6 * serial);
    EXPECT_NEAR(turns.terms[TSL_TERM_CORES], u / 3, 1e-6 * serial);
    // the costs measured with both ranks of a core busy, their tasks 3x slower than alone: 2x
    // is the sharing, 1.5x beyond it for ranks busy at once; in turn, the tasks' speed alone
    costs.shared_slowdown = 3;
    shared = predict("data=4");
    turns = predict("data=2,stages=2");
    EXPECT_NEAR(shared.terms[TSL_TERM_COMPUTE], serial / 12, 1e-6 * serial);
    EXPECT_NEAR(shared.seconds, 2 * serial / 12 * 1.5, 1e-6 * serial);
    // (the core's work at that speed, serial / 6, but for the share of it where its two ranks
    // were busy at once, as stage 1 made its first layer's weights' gradients (u / 9 of the
    // serial / 12 the core's busier rank works), at 1.5x)
    const double together = u / 9 / (serial / 12);
    EXPECT_NEAR(turns.seconds, serial / 6 * (1 + 0.5 * together), 1e-6 * serial);
    // the waits: of ranks busy at once for data=4, of ranks in turn for the pipeline (but for
    // that share)
    costs.wait_seconds = 0.5 * serial;
    costs.wait_seconds_turns = 0.25 * serial;
    EXPECT_NEAR(predict("data=4").seconds, shared.seconds + 0.5 * serial, 1e-6 * serial);
    EXPECT_NEAR(predict("data=2,stages=2").seconds,
                turns.seconds + together * 0.5 * serial + (1 - together) * 0.25 * serial,
                1e-6 * serial);
    // two ranks on the node's two cores share nothing
    costs.node_ranks = 2;
    costs.wait_seconds = costs.wait_seconds_turns = 0;
    costs.shared_slowdown = 0;
    data = predict("data=4");
    EXPECT_NEAR(data.seconds, serial / 4, 1e-6 * serial);
    EXPECT_EQ(data.terms[TSL_TERM_CORES], 0.0);
    tsl_graph_destroy(g);
}

// recompute=1: the batch norms whose ReLU outputs a convolution's backward reads (five of the
// chain's six; the last one's reader, flatten, reads none) remake them in the backward: each
// adds its measured remaking time for the batch and one task per tile; without a measurement a
// quarter of the op's time. It saves memory, and the search takes it for time only where the
// plan without it does not fit the budget, for memory first.
TEST(PlanModel, RecomputeCostsItsRemakingAndSavesMemory)
{
    tsl_graph_t g = chain(true);
    int32_t nops = tsl_graph_op_count(g), nbn = 0;
    std::vector<double> op(nops, 1e-4), again(nops, 0.0);
    for (int32_t o = 0; o < nops; o++) {
        tsl_op_kind kind;
        ASSERT_EQ(tsl_graph_op_info(g, o, &kind, nullptr, nullptr), TSL_OK);
        if (kind == TSL_OP_BATCHNORM && ++nbn < 6)
            again[(size_t)o] = 3e-5;
    }
    ASSERT_EQ(nbn, 6);
    tsl_plan_costs costs{};
    costs.nops = nops;
    costs.op_seconds = op.data();
    costs.op_seconds_recompute = again.data();
    costs.task_seconds = 1e-6;
    costs.bandwidth = 1e10;
    auto predict = [&](const char *p) { return predicted(g, costs, p, 1, 1, 16, 1); };
    tsl_plan_prediction kept = predict("data=1"), remade = predict("data=1,recompute=1");
    EXPECT_NEAR(remade.terms[TSL_TERM_COMPUTE] - kept.terms[TSL_TERM_COMPUTE], 5 * 3e-5 * 16,
                1e-12);
    EXPECT_NEAR(remade.terms[TSL_TERM_TASKS] - kept.terms[TSL_TERM_TASKS], 5 * 1e-6, 1e-12);
    EXPECT_NEAR(remade.seconds - kept.seconds, 5 * (3e-5 * 16 + 1e-6), 1e-12);
    EXPECT_LT(remade.peak_bytes, kept.peak_bytes);
    costs.op_seconds_recompute = nullptr; // not measured: a quarter of the op's time
    EXPECT_NEAR(predict("data=1,recompute=1").seconds - kept.seconds, 5 * (0.25 * 1e-4 * 16 + 1e-6),
                1e-12);
    costs.op_seconds_recompute = again.data();
    auto search = [&](int objective, int64_t budget) {
        tsl_plan_prediction best;
        int32_t count = 0;
        EXPECT_EQ(tsl_plan_search(g, 1, 1, 16, 1, &costs, budget, objective, nullptr, nullptr,
                                  &best, 1, &count),
                  TSL_OK)
            << tsl_last_error();
        return text(best.plan);
    };
    EXPECT_EQ(search(TSL_OBJECTIVE_TIME, 0), text(kept.plan));
    EXPECT_EQ(search(TSL_OBJECTIVE_TIME, remade.peak_bytes), text(remade.plan));
    EXPECT_EQ(search(TSL_OBJECTIVE_MEMORY, 0), text(remade.plan));
    tsl_graph_destroy(g);
}
