/* The vocabulary of model files (docs/model-format.md): keys and layer ops, activations by
 * the op table's names. */
#include <stdio.h>
#include <string.h>

#include "json_internal.h"
#include "op_table.h"

const char *const json_key_names[KEY_COUNT] = {"name",
                                               "op",
                                               "inputs",
                                               "shape",
                                               "out",
                                               "kernel",
                                               "stride",
                                               "padding",
                                               "dilation",
                                               "groups",
                                               "output_padding",
                                               "bias",
                                               "eps",
                                               "momentum",
                                               "slope",
                                               "scale",
                                               "count_include_pad",
                                               "ceil_mode",
                                               "start",
                                               "stop",
                                               "h",
                                               "p",
                                               "stage",
                                               "padding_mode",
                                               "size",
                                               "share",
                                               "channels"};

const char *const json_padding_mode_names[TSL_PADDING_MODE_COUNT] = {"zeros", "reflect",
                                                                     "replicate", "circular"};

const layer_spec json_specs[LAYER_OP_COUNT] = {
    [L_INPUT] = {"input", BIT(K_NAME) | BIT(K_OP) | BIT(K_SHAPE), 0, 0, 0, 0},
    [L_CONV] = {"conv", CONV_KEYS | BIT(K_PADDING_MODE) | BIT(K_SHARE), 1, 1, 1, 1},
    [L_CONV_TRANSPOSE] = {"conv_transpose", CONV_KEYS | BIT(K_OUTPUT_PADDING) | BIT(K_SHARE), 1, 1,
                          1, 1},
    [L_BATCHNORM] = {"batchnorm", COMMON_KEYS | BIT(K_EPS) | BIT(K_MOMENTUM), 1, 1, 1, 0},
    [L_ACTIVATION] = {"activation", COMMON_KEYS, 0, 1, 1, 0},
    [L_MAXPOOL] = {"maxpool", POOL_KEYS, 0, 1, 1, 1},
    [L_AVGPOOL] = {"avgpool", POOL_KEYS | BIT(K_COUNT_INCLUDE_PAD), 0, 1, 1, 1},
    [L_GLOBAL_AVGPOOL] = {"global_avgpool", COMMON_KEYS, 0, 1, 1, 1},
    [L_UPSAMPLE_NEAREST] = {"upsample_nearest", COMMON_KEYS | BIT(K_SCALE) | BIT(K_SIZE), 0, 1, 1,
                            1},
    [L_UPSAMPLE_LINEAR] = {"upsample_linear", COMMON_KEYS | BIT(K_SCALE) | BIT(K_SIZE), 0, 1, 1, 1},
    [L_CONCAT] = {"concat", COMMON_KEYS, 0, 1, TSL_GRAPH_MAX_INPUTS, 0},
    [L_ADD] = {"add", COMMON_KEYS | BIT(K_H), 0, 2, TSL_GRAPH_MAX_INPUTS, 0},
    [L_FLATTEN] = {"flatten", COMMON_KEYS, 0, 1, 1, 0},
    [L_LINEAR] = {"linear", COMMON_KEYS | BIT(K_OUT) | BIT(K_BIAS) | BIT(K_SHARE), 1, 1, 1, 0},
    [L_SUB] = {"sub", COMMON_KEYS, 0, 2, 2, 0},
    [L_MUL] = {"mul", COMMON_KEYS, 0, 2, 2, 0},
    [L_SLICE] = {"slice", COMMON_KEYS | BIT(K_START) | BIT(K_STOP) | BIT(K_CHANNELS), 0, 1, 1, 0},
    [L_DROPOUT] = {"dropout", COMMON_KEYS | BIT(K_P), 0, 1, 1, 0},
    [L_GROUPNORM] = {"group_norm", COMMON_KEYS | BIT(K_GROUPS) | BIT(K_EPS) | BIT(K_SHARE), 1, 1, 1,
                     0},
    [L_LAYERNORM] = {"layer_norm", COMMON_KEYS | BIT(K_EPS) | BIT(K_SHARE), 1, 1, 1, 0},
    [L_INSTANCENORM] = {"instance_norm", COMMON_KEYS | BIT(K_EPS) | BIT(K_SHARE), 1, 1, 1, 1},
};

const int64_t json_zeros[3] = {0, 0, 0}, json_ones[3] = {1, 1, 1};

const char *json_op_text(int32_t op, tsl_activation act)
{
    return op == L_ACTIVATION ? tsl_activation_info_of(act)->name : json_specs[op].op;
}

uint32_t json_op_keys(int32_t op, tsl_activation act)
{
    return json_specs[op].keys |
           (op == L_ACTIVATION && tsl_activation_info_of(act)->takes_slope ? BIT(K_SLOPE) : 0);
}

int32_t json_find_op(const char *name, tsl_activation *act)
{
    if (tsl_activation_find(name, act) == 0)
        return L_ACTIVATION;
    for (int32_t op = 0; op < LAYER_OP_COUNT; op++)
        if (op != L_ACTIVATION && strcmp(json_specs[op].op, name) == 0)
            return op;
    return -1;
}

void json_op_list(char *text, size_t size)
{
    size_t n = 0;
    text[0] = 0;
    for (int32_t op = 0; op < LAYER_OP_COUNT; op++)
        for (int k = 0; k < (op == L_ACTIVATION ? TSL_ACTIVATION_COUNT : 1); k++) {
            int w = snprintf(text + n, size - n, "%s%s", n ? ", " : "",
                             json_op_text(op, (tsl_activation)k));
            if (w < 0 || (size_t)w >= size - n)
                return;
            n += (size_t)w;
        }
}
