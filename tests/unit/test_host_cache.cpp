// The host cache of freed StarPU buffers (src/host_cache.c), driven through its hooks without
// StarPU: blocks come back by exact size, and the bytes in use plus the bytes kept never exceed
// the most bytes ever in use at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "src/host_cache.h"
}

namespace
{

struct Cache {
    explicit Cache(size_t limit)
    {
        tsl_host_cache_install(limit);
    }
    ~Cache()
    {
        tsl_host_cache_uninstall(nullptr);
    }
    void *get(size_t dim)
    {
        void *p = nullptr;
        EXPECT_EQ(tsl_host_cache_malloc(0, &p, dim, 0), 0);
        std::memset(p, 0x5a, dim); // the block is usable
        return p;
    }
    void put(void *p)
    {
        EXPECT_EQ(tsl_host_cache_free(0, p, 0, 0), 0);
    }
    tsl_host_cache_stats stats(size_t *kept)
    {
        tsl_host_cache_stats s;
        EXPECT_EQ(tsl_host_cache_query(&s, kept), 1);
        return s;
    }
};

constexpr size_t KiB = 1024;

} // namespace

TEST(HostCache, FreedBlocksComeBackBySize)
{
    Cache c(1024 * KiB);
    void *a = c.get(100 * KiB), *b = c.get(60 * KiB), *d = c.get(60 * KiB);
    c.put(a), c.put(d);
    size_t kept = 0;
    c.stats(&kept);
    EXPECT_EQ(kept, 160 * KiB);
    void *again = c.get(100 * KiB), *again60 = c.get(60 * KiB);
    EXPECT_EQ(again, a);
    EXPECT_EQ(again60, d);
    tsl_host_cache_stats s = c.stats(&kept);
    EXPECT_EQ(kept, 0u);
    EXPECT_EQ(s.reused, 2);
    EXPECT_EQ(s.allocated, 3);
    EXPECT_EQ(s.evicted, 0);
    EXPECT_EQ(s.in_use, 220 * KiB);
    c.put(b), c.put(again), c.put(again60);
    s = c.stats(&kept);
    EXPECT_EQ(s.in_use, 0u);
    EXPECT_EQ(kept, 220 * KiB);
    void *big = c.get(300 * KiB); // over the limit's quarter (256 KiB): never kept
    c.put(big);
    s = c.stats(&kept);
    EXPECT_EQ(kept, 220 * KiB) << "a 300 KiB block was kept";
}

// A block that must come from the C library first gives back kept blocks until in use + kept
// + the new block is at most the high-water mark plus a quarter of the limit: the smallest
// kept block that covers the excess, else the largest.
TEST(HostCache, NewBlocksGiveKeptOnesBackAboveTheHighWaterMark)
{
    Cache c(400 * KiB); // keeps blocks up to 100 KiB; slack 100 KiB
    void *a = c.get(100 * KiB), *b = c.get(100 * KiB), *d = c.get(100 * KiB),
         *e = c.get(40 * KiB);    // mark 340
    c.put(a), c.put(d), c.put(e); // in use 100, kept 240
    size_t kept = 0;
    tsl_host_cache_stats s = c.stats(&kept);
    EXPECT_EQ(s.high_water, 340 * KiB);
    EXPECT_EQ(kept, 240 * KiB);
    void *f = c.get(90 * KiB); // 100 + 240 + 90 = 430, within 340 + 100
    s = c.stats(&kept);
    EXPECT_EQ(s.evicted, 0);
    EXPECT_EQ(kept, 240 * KiB);
    void *g = c.get(95 * KiB); // 190 + 240 + 95 = 525: 85 over; one 100 KiB block covers it
    s = c.stats(&kept);
    EXPECT_EQ(s.evicted, 1);
    EXPECT_EQ(kept, 140 * KiB);
    EXPECT_EQ(s.high_water, 340 * KiB);
    void *h = c.get(30 * KiB); // 285 + 140 + 30 = 455: 15 over; the 40 KiB block goes
    s = c.stats(&kept);
    EXPECT_EQ(s.evicted, 2);
    EXPECT_EQ(kept, 100 * KiB);
    c.put(b);                     // in use 215, kept 200 (two 100 KiB blocks)
    void *big = c.get(300 * KiB); // a new mark, 515: kept may be 100 over it, one block goes
    s = c.stats(&kept);
    EXPECT_EQ(s.high_water, 515 * KiB);
    EXPECT_EQ(s.evicted, 3);
    EXPECT_EQ(kept, 100 * KiB);
    for (void *p : {f, g, h, big})
        c.put(p);
}

// Random steps of allocations and frees (a step's activations and gradients, with sizes that
// repeat): at every point in use + kept stays within the most in use so far (counted here
// independently) plus a quarter of the limit, and most blocks after the first step come from
// the cache.
TEST(HostCache, KeptBlocksNeverRaiseThePeak)
{
    const size_t limit = 4096 * KiB;
    Cache c(limit);
    std::mt19937 rng(7);
    const size_t sizes[] = {16 * KiB, 64 * KiB, 96 * KiB, 256 * KiB, 512 * KiB, 1000 * KiB};
    std::vector<std::pair<void *, size_t>> live;
    size_t in_use = 0, most = 0;
    for (int step = 0; step < 20; step++) {
        std::mt19937 pattern(step % 3); // three kinds of step, each repeating
        int n = 10 + (int)(pattern() % 20);
        for (int i = 0; i < n; i++) {
            size_t dim = sizes[pattern() % 6];
            live.push_back({c.get(dim), dim});
            in_use += dim;
            most = std::max(most, in_use);
            if (pattern() % 3 == 0 && !live.empty()) { // free one at random
                size_t k = rng() % live.size();
                c.put(live[k].first);
                in_use -= live[k].second;
                live.erase(live.begin() + (long)k);
            }
            size_t kept = 0;
            tsl_host_cache_stats s = c.stats(&kept);
            ASSERT_EQ(s.in_use, in_use);
            ASSERT_EQ(s.high_water, most);
            ASSERT_LE(s.in_use + kept, most + limit / 4) << "step " << step << " op " << i;
            ASSERT_LE(kept, limit);
        }
        while (!live.empty()) { // the end of the step frees everything
            c.put(live.back().first);
            in_use -= live.back().second;
            live.pop_back();
        }
    }
    size_t kept = 0;
    tsl_host_cache_stats s = c.stats(&kept);
    EXPECT_GT(s.reused, 2 * s.allocated) << "the cache hardly reused anything";
    EXPECT_GT(s.evicted, 0) << "the steps never climbed past what was kept";
}
