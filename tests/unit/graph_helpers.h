// Small graphs the graph-library tests build alike.
#pragma once

#include <gtest/gtest.h>

extern "C" {
#include "tessel/graph.h"
}

// A graph with one input of (channels, 8, 8) samples (*x), and 3x3-ready 2-D convolution
// parameters of padding 1 (*cp).
inline tsl_graph_t graph_on_8x8(int64_t channels, int32_t *x, tsl_conv_params *cp)
{
    tsl_graph_t g = nullptr;
    EXPECT_EQ(tsl_graph_create(&g), TSL_OK);
    const int64_t sample[3] = {channels, 8, 8};
    tsl_conv_params_init(cp, 2);
    cp->padding[0] = cp->padding[1] = 1;
    EXPECT_EQ(tsl_graph_input(g, 3, sample, x), TSL_OK);
    return g;
}
