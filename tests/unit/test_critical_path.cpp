// The critical path of a task graph in submission order (src/critical_path.c) on graphs whose
// longest path is known: chains, fans, reads that overlap, writes after reads.
#include <gtest/gtest.h>

#include <vector>

extern "C" {
#include "src/critical_path.h"
}

namespace
{

struct Graph {
    std::vector<int64_t> first{0}, ids;
    std::vector<uint8_t> access;
    std::vector<double> duration;
    void task(double d, std::vector<std::pair<int64_t, uint8_t>> data)
    {
        for (auto &a : data) {
            ids.push_back(a.first);
            access.push_back(a.second);
        }
        first.push_back((int64_t)ids.size());
        duration.push_back(d);
    }
    std::pair<double, double> path() const
    {
        double critical = -1, total = -1;
        EXPECT_EQ(tsl_critical_path((int64_t)duration.size(), first.data(), ids.data(),
                                    access.data(), duration.data(), &critical, &total),
                  0);
        return {critical, total};
    }
};

const uint8_t R = TSL_ACCESS_R, W = TSL_ACCESS_W, RW = TSL_ACCESS_R | TSL_ACCESS_W;

TEST(CriticalPath, AChainIsTheSumAndIndependentTasksTheLongest)
{
    Graph chain;
    chain.task(1, {{7, W}});
    chain.task(2, {{7, RW}});
    chain.task(3, {{7, RW}, {9, R}}); // 9: never written, no dependency
    EXPECT_EQ(chain.path(), std::make_pair(6.0, 6.0));
    Graph apart;
    for (int i = 0; i < 4; i++)
        apart.task(1.0 + i, {{100 + i, W}});
    EXPECT_EQ(apart.path(), std::make_pair(4.0, 10.0));
}

TEST(CriticalPath, ReadersRunTogetherAndAWriterWaitsForThem)
{
    Graph g;
    g.task(1, {{1, W}});
    g.task(5, {{1, R}, {2, W}}); // readers of 1 side by side: 1 .. 6
    g.task(2, {{1, R}, {3, W}}); // 1 .. 3
    g.task(1, {{1, W}});         // after both readers: 6 .. 7
    g.task(4, {{3, R}, {4, W}}); // after the reader that wrote 3 only: 3 .. 7
    g.task(1, {{1, R}, {4, R}}); // 7 .. 8
    EXPECT_EQ(g.path(), std::make_pair(8.0, 14.0));
    // A write resets the readers: the next writer waits for that write, not the old readers.
    Graph h;
    h.task(5, {{1, R}});
    h.task(1, {{1, W}}); // 5 .. 6
    h.task(1, {{1, W}}); // 6 .. 7
    h.task(2, {{1, R}}); // 7 .. 9
    EXPECT_EQ(h.path(), std::make_pair(9.0, 9.0));
}

TEST(CriticalPath, TwoChainsMeetAtTheirJoin)
{
    Graph g;
    for (int k = 0; k < 3; k++) // chain on datum 1: 3 units
        g.task(1, {{1, RW}});
    for (int k = 0; k < 5; k++) // chain on datum 2: 10 units
        g.task(2, {{2, RW}});
    g.task(0.5, {{1, R}, {2, R}, {3, W}});
    EXPECT_EQ(g.path(), std::make_pair(10.5, 13.5));
    Graph none;
    EXPECT_EQ(none.path(), std::make_pair(0.0, 0.0));
}

} // namespace
