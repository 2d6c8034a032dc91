// Shapes, tile grids and owner maps (graph/grid.c): pure, no StarPU.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "src/node_share.h"
#include "tessel/tessel.h"

namespace
{

tsl_shape make_shape(std::vector<int64_t> dims)
{
    tsl_shape s;
    EXPECT_EQ(tsl_shape_make(&s, (int32_t)dims.size(), dims.data()), TSL_OK) << tsl_last_error();
    return s;
}

tsl_tile_grid make_grid(std::vector<int32_t> splits)
{
    tsl_tile_grid g = tsl_tile_grid_single();
    for (size_t d = 0; d < splits.size(); d++)
        g.splits[d] = splits[d];
    return g;
}

std::vector<int32_t> coords_of(int64_t index, const tsl_tile_grid &g, int ndim)
{
    std::vector<int32_t> c(TSL_MAX_DIMS, 0);
    for (int d = ndim - 1; d >= 0; d--) {
        c[d] = (int32_t)(index % g.splits[d]);
        index /= g.splits[d];
    }
    return c;
}

} // namespace

TEST(Shape, MakeAndCount)
{
    tsl_shape s = make_shape({2, 3, 5, 7, 11});
    EXPECT_EQ(s.ndim, 5);
    EXPECT_EQ(tsl_shape_numel(&s), 2 * 3 * 5 * 7 * 11);
    tsl_shape one = make_shape({9});
    EXPECT_EQ(tsl_shape_numel(&one), 9);
    EXPECT_EQ(tsl_shape_numel(nullptr), 0);
    one.ndim = 0;
    EXPECT_EQ(tsl_shape_numel(&one), 0);
}

TEST(Shape, RejectsBadShapes)
{
    tsl_shape s;
    int64_t dims[6] = {1, 2, 3, 4, 5, 6};
    EXPECT_EQ(tsl_shape_make(&s, 0, dims), TSL_ERR_SHAPE);
    EXPECT_STRNE(tsl_last_error(), "");
    EXPECT_EQ(tsl_shape_make(&s, 6, dims), TSL_ERR_SHAPE);
    int64_t negative[2] = {4, -1};
    EXPECT_EQ(tsl_shape_make(&s, 2, negative), TSL_ERR_SHAPE);
    int64_t zero[2] = {4, 0};
    EXPECT_EQ(tsl_shape_make(&s, 2, zero), TSL_ERR_SHAPE);
    int64_t huge[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 2};
    EXPECT_EQ(tsl_shape_make(&s, 3, huge), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_shape_make(nullptr, 2, dims), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_shape_check(nullptr), TSL_ERR_INVALID_ARG);
}

TEST(Dtype, SizesAndNames)
{
    EXPECT_EQ(tsl_dtype_size(TSL_F32), 4u);
    EXPECT_EQ(tsl_dtype_size(TSL_F64), 8u);
    EXPECT_EQ(tsl_dtype_size(TSL_I32), 4u);
    EXPECT_EQ(tsl_dtype_size(TSL_I64), 8u);
    EXPECT_EQ(tsl_dtype_size(TSL_U8), 1u);
    EXPECT_EQ(tsl_dtype_size((tsl_dtype)99), 0u);
    EXPECT_STREQ(tsl_dtype_name(TSL_U8), "u8");
    EXPECT_STREQ(tsl_dtype_name((tsl_dtype)99), "invalid");
}

TEST(TileExtent, BalancedAndCovering)
{
    std::mt19937 rng(1234);
    for (int trial = 0; trial < 2000; trial++) {
        int64_t size = 1 + rng() % 1000;
        int32_t splits = 1 + (int32_t)(rng() % size);
        int64_t expect_start = 0, min_ext = size, max_ext = 0;
        for (int32_t i = 0; i < splits; i++) {
            int64_t start, extent;
            ASSERT_EQ(tsl_tile_extent(size, splits, i, &start, &extent), TSL_OK);
            ASSERT_EQ(start, expect_start);
            ASSERT_GE(extent, 1);
            expect_start += extent;
            min_ext = std::min(min_ext, extent);
            max_ext = std::max(max_ext, extent);
        }
        ASSERT_EQ(expect_start, size);
        ASSERT_LE(max_ext - min_ext, 1); // uneven splits differ by one element at most
    }
    int64_t start, extent;
    tsl_tile_extent(10, 3, 0, &start, &extent);
    EXPECT_EQ(extent, 4);
    tsl_tile_extent(10, 3, 2, &start, &extent);
    EXPECT_EQ(start, 7);
    EXPECT_EQ(extent, 3);
    EXPECT_EQ(tsl_tile_extent(10, 0, 0, &start, &extent), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_tile_extent(10, 11, 0, &start, &extent), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_tile_extent(10, 3, 3, &start, &extent), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_tile_extent(10, 3, -1, &start, &extent), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_tile_extent(10, 3, 0, nullptr, &extent), TSL_ERR_INVALID_ARG);
    EXPECT_STRNE(tsl_last_error(), "");
}

TEST(TileGrid, CheckAndCount)
{
    tsl_shape s = make_shape({4, 3, 10});
    tsl_tile_grid g = make_grid({2, 3, 10});
    EXPECT_EQ(tsl_tile_grid_check(&g, &s), TSL_OK);
    EXPECT_EQ(tsl_tile_grid_count(&g, 3), 60);
    tsl_tile_grid too_many = make_grid({5, 1, 1});
    EXPECT_EQ(tsl_tile_grid_check(&too_many, &s), TSL_ERR_SHAPE);
    tsl_tile_grid zero = make_grid({0, 1, 1});
    EXPECT_EQ(tsl_tile_grid_check(&zero, &s), TSL_ERR_SHAPE);
    EXPECT_EQ(tsl_tile_grid_check(nullptr, &s), TSL_ERR_INVALID_ARG);
    EXPECT_EQ(tsl_tile_grid_count(nullptr, 3), 0);
    EXPECT_EQ(tsl_tile_grid_count(&g, 0), 0);
    EXPECT_EQ(tsl_tile_grid_count(&zero, 3), 0);
}

TEST(OwnerMap, LinearBlockIsContiguousAndBalanced)
{
    tsl_tile_grid g = make_grid({3, 1, 4, 5});
    int ntiles = 60;
    for (int nranks = 1; nranks <= 7; nranks++) {
        tsl_owner_map m = tsl_owner_block(nullptr);
        std::vector<int> count(nranks, 0);
        int previous = 0;
        for (int i = 0; i < ntiles; i++) {
            auto c = coords_of(i, g, 4);
            int32_t r;
            ASSERT_EQ(tsl_owner_map_rank(&m, c.data(), 4, &g, nranks, &r), TSL_OK);
            ASSERT_GE(r, previous); // contiguous runs in row-major order
            previous = r;
            count[r]++;
        }
        for (int r = 0; r < nranks; r++)
            EXPECT_NEAR(count[r], ntiles / (double)nranks, 1.0);
    }
}

TEST(OwnerMap, BlockProcessGridGivesBoxes)
{
    // 4 x 6 tiles on a 2 x 3 process grid: each rank owns a 2 x 2 box.
    tsl_tile_grid g = make_grid({4, 6});
    int32_t pgrid[TSL_MAX_DIMS] = {2, 3, 0, 0, 0};
    tsl_owner_map m = tsl_owner_block(pgrid);
    std::map<int, std::vector<std::pair<int, int>>> tiles;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) {
            int32_t c[TSL_MAX_DIMS] = {i, j, 0, 0, 0}, r;
            ASSERT_EQ(tsl_owner_map_rank(&m, c, 2, &g, 6, &r), TSL_OK);
            EXPECT_EQ(r, (i / 2) * 3 + (j / 2));
            tiles[r].push_back({i, j});
        }
    EXPECT_EQ(tiles.size(), 6u);
    for (auto &kv : tiles)
        EXPECT_EQ(kv.second.size(), 4u);
}

TEST(OwnerMap, BlockCyclic)
{
    tsl_tile_grid g = make_grid({8, 6});
    int32_t pgrid[TSL_MAX_DIMS] = {2, 2, 0, 0, 0}, block[TSL_MAX_DIMS] = {2, 1, 0, 0, 0};
    tsl_owner_map m = tsl_owner_block_cyclic(pgrid, block);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 6; j++) {
            int32_t c[TSL_MAX_DIMS] = {i, j, 0, 0, 0}, r;
            ASSERT_EQ(tsl_owner_map_rank(&m, c, 2, &g, 4, &r), TSL_OK);
            EXPECT_EQ(r, ((i / 2) % 2) * 2 + (j % 2));
        }
}

TEST(OwnerMap, SingleAndCallback)
{
    tsl_tile_grid g = make_grid({3, 3});
    int32_t c[TSL_MAX_DIMS] = {2, 1, 0, 0, 0}, r = -1;
    tsl_owner_map single = tsl_owner_single(2);
    EXPECT_EQ(tsl_owner_map_rank(&single, c, 2, &g, 4, &r), TSL_OK);
    EXPECT_EQ(r, 2);
    tsl_owner_map cb = tsl_owner_callback(
        [](const int32_t *tile, int32_t, const tsl_tile_grid *, int32_t nranks, void *user) {
            return (tile[0] + tile[1] + *(int32_t *)user) % nranks;
        },
        &r);
    int32_t out;
    EXPECT_EQ(tsl_owner_map_rank(&cb, c, 2, &g, 4, &out), TSL_OK);
    EXPECT_EQ(out, (2 + 1 + 2) % 4);
}

// A map over a rank group deals tiles as over a context of the group's size, shifted to the
// group's first rank; a group that does not fit is an error.
TEST(OwnerMap, RankGroupsShiftTheDeal)
{
    tsl_tile_grid g = make_grid({6, 4});
    int32_t pg[TSL_MAX_DIMS] = {3, 1, 0, 0, 0};
    const tsl_owner_map maps[] = {tsl_owner_block(nullptr), tsl_owner_block(pg)};
    for (const tsl_owner_map &plain : maps)
        for (int32_t first = 0; first <= 4; first += 2) {
            tsl_owner_map grouped = tsl_owner_on_ranks(plain, first, 3);
            for (int i = 0; i < 24; i++) {
                auto c = coords_of(i, g, 2);
                int32_t want, got;
                ASSERT_EQ(tsl_owner_map_rank(&plain, c.data(), 2, &g, 3, &want), TSL_OK);
                ASSERT_EQ(tsl_owner_map_rank(&grouped, c.data(), 2, &g, 7, &got), TSL_OK);
                EXPECT_EQ(got, first + want);
            }
        }
    int32_t c[TSL_MAX_DIMS] = {0, 0, 0, 0, 0}, r;
    tsl_owner_map single = tsl_owner_on_ranks(tsl_owner_single(1), 4, 2);
    ASSERT_EQ(tsl_owner_map_rank(&single, c, 2, &g, 6, &r), TSL_OK);
    EXPECT_EQ(r, 5);
    tsl_owner_map past = tsl_owner_on_ranks(tsl_owner_block(nullptr), 4, 3);
    EXPECT_EQ(tsl_owner_map_rank(&past, c, 2, &g, 6, &r), TSL_ERR_INVALID_ARG);
    tsl_owner_map empty = tsl_owner_on_ranks(tsl_owner_block(nullptr), 1, 0);
    EXPECT_EQ(tsl_owner_map_rank(&empty, c, 2, &g, 6, &r), TSL_ERR_INVALID_ARG);
    tsl_owner_map big = tsl_owner_on_ranks(tsl_owner_single(2), 0, 2);
    EXPECT_EQ(tsl_owner_map_rank(&big, c, 2, &g, 6, &r), TSL_ERR_SHAPE);
}

TEST(OwnerMap, RejectsBadMaps)
{
    tsl_tile_grid g = make_grid({3, 3});
    int32_t c[TSL_MAX_DIMS] = {0, 0, 0, 0, 0}, r;
    tsl_owner_map single = tsl_owner_single(4);
    EXPECT_EQ(tsl_owner_map_rank(&single, c, 2, &g, 4, &r), TSL_ERR_SHAPE);
    int32_t big[TSL_MAX_DIMS] = {3, 2, 0, 0, 0};
    tsl_owner_map block = tsl_owner_block(big);
    EXPECT_EQ(tsl_owner_map_rank(&block, c, 2, &g, 4, &r), TSL_ERR_SHAPE);
    int32_t zero[TSL_MAX_DIMS] = {0, 2, 0, 0, 0};
    tsl_owner_map bad = tsl_owner_block_cyclic(zero, zero);
    EXPECT_EQ(tsl_owner_map_rank(&bad, c, 2, &g, 4, &r), TSL_ERR_INVALID_ARG);
    int32_t pg[TSL_MAX_DIMS] = {2, 2, 0, 0, 0}, noblock[TSL_MAX_DIMS] = {0, 0, 0, 0, 0};
    tsl_owner_map nob = tsl_owner_block_cyclic(pg, noblock);
    EXPECT_EQ(tsl_owner_map_rank(&nob, c, 2, &g, 4, &r), TSL_ERR_INVALID_ARG);
    tsl_owner_map nocb = tsl_owner_callback(nullptr, nullptr);
    EXPECT_EQ(tsl_owner_map_rank(&nocb, c, 2, &g, 4, &r), TSL_ERR_INVALID_ARG);
    tsl_owner_map wild = tsl_owner_callback(
        [](const int32_t *, int32_t, const tsl_tile_grid *, int32_t, void *) { return 99; },
        nullptr);
    EXPECT_EQ(tsl_owner_map_rank(&wild, c, 2, &g, 4, &r), TSL_ERR_SHAPE);
    int32_t outside[TSL_MAX_DIMS] = {3, 0, 0, 0, 0};
    tsl_owner_map ok = tsl_owner_block(nullptr);
    EXPECT_EQ(tsl_owner_map_rank(&ok, outside, 2, &g, 4, &r), TSL_ERR_INVALID_ARG);
    EXPECT_STRNE(tsl_last_error(), "");
}

TEST(Status, StringsNameEveryCode)
{
    for (int code = 0; code >= -10; code--)
        EXPECT_EQ(std::strncmp(tsl_status_string((tsl_status)code), "TSL_", 4), 0) << code;
    EXPECT_NE(std::strstr(tsl_status_string((tsl_status)-99), "UNKNOWN"), nullptr);
}

// Ranks sharing a node get disjoint runs of at least two cores in rank order (workers, then
// the StarPU-MPI thread), all within the node. With fewer than two cores per rank, ranks whose
// threads yield get one core each, spread evenly over the node (no core holds more than
// ceil(ranks / cores) ranks, disjoint where the cores suffice); ranks whose threads spin, and
// a rank alone, leave the binding to StarPU.
TEST(NodeShare, DisjointRunsOfAtLeastTwoCoresPerRank)
{
    for (int yielding = 0; yielding <= 1; yielding++)
        for (int nlocal = 1; nlocal <= 8; nlocal++)
            for (int cores = 1; cores <= 40; cores++) {
                std::vector<int> ranks_on((size_t)cores, 0);
                for (int local = 0; local < nlocal; local++) {
                    int first = -1, count = -1;
                    int got = tsl_node_share(local, nlocal, cores, yielding, &first, &count);
                    bool wide = cores >= 2 * nlocal;
                    ASSERT_EQ(got, nlocal >= 2 && (wide || yielding))
                        << nlocal << " ranks, " << cores << " cores, yielding " << yielding;
                    if (!got)
                        continue;
                    EXPECT_EQ(count, wide ? cores / nlocal : 1);
                    if (wide)
                        EXPECT_EQ(first, local * count);
                    ASSERT_GE(first, 0);
                    ASSERT_LE(first + count, cores);
                    for (int c = first; c < first + count; c++)
                        ranks_on[(size_t)c]++;
                }
                if (nlocal < 2 || (cores < 2 * nlocal && !yielding))
                    continue;
                for (int c = 0; c < cores; c++)
                    EXPECT_LE(ranks_on[(size_t)c], (nlocal + cores - 1) / cores)
                        << "core " << c << " given to " << ranks_on[(size_t)c] << " of " << nlocal
                        << " ranks on " << cores << " cores";
            }
    int first = 0, count = 0;
    EXPECT_EQ(tsl_node_share(2, 2, 8, 1, &first, &count), 0); // not a local rank
    EXPECT_EQ(tsl_node_share(-1, 2, 8, 1, &first, &count), 0);
    EXPECT_EQ(tsl_node_share(0, 2, 0, 1, &first, &count), 0); // no core
}
