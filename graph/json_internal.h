/* What the model-file reader (json_read.c) and writer (json_write.c) share: the vocabulary of
 * keys and layer ops (json_vocab.c). Pure C. */
#ifndef TESSEL_GRAPH_JSON_INTERNAL_H
#define TESSEL_GRAPH_JSON_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "graph_internal.h"

#define FORMAT_NAME "tessel-model"
#define MAX_FILE_BYTES (16 << 20) /* a model file is a few kilobytes */
#define MAX_ATTRIBUTE 2147483647  /* sizes, counts and factors fit in 31 bits */

/* ---- the vocabulary: keys and layer ops ---- */

enum key {
    K_NAME,
    K_OP,
    K_INPUTS,
    K_SHAPE,
    K_OUT,
    K_KERNEL,
    K_STRIDE,
    K_PADDING,
    K_DILATION,
    K_GROUPS,
    K_OUTPUT_PADDING,
    K_BIAS,
    K_EPS,
    K_MOMENTUM,
    K_SLOPE,
    K_SCALE,
    K_COUNT_INCLUDE_PAD,
    K_CEIL_MODE,
    K_START,
    K_STOP,
    K_H,
    K_P,
    K_STAGE,
    K_PADDING_MODE,
    K_SIZE,
    K_SHARE,
    K_CHANNELS,
    KEY_COUNT
};

extern const char *const json_key_names[KEY_COUNT];
/* The model file's names of the convolutions' padding modes (a tsl_padding_mode each). */
extern const char *const json_padding_mode_names[TSL_PADDING_MODE_COUNT];

#define BIT(k) (1u << (k))
#define COMMON_KEYS (BIT(K_NAME) | BIT(K_OP) | BIT(K_INPUTS) | BIT(K_STAGE))
#define CONV_KEYS                                                                                  \
    (COMMON_KEYS | BIT(K_OUT) | BIT(K_KERNEL) | BIT(K_STRIDE) | BIT(K_PADDING) | BIT(K_DILATION) | \
     BIT(K_GROUPS) | BIT(K_BIAS))
#define POOL_KEYS (COMMON_KEYS | BIT(K_KERNEL) | BIT(K_STRIDE) | BIT(K_PADDING) | BIT(K_CEIL_MODE))

enum layer_op {
    L_INPUT,
    L_CONV,
    L_CONV_TRANSPOSE,
    L_BATCHNORM,
    L_ACTIVATION, /* every row of the activation table, by its name */
    L_MAXPOOL,
    L_AVGPOOL,
    L_GLOBAL_AVGPOOL,
    L_UPSAMPLE_NEAREST,
    L_UPSAMPLE_LINEAR,
    L_CONCAT,
    L_ADD,
    L_FLATTEN,
    L_LINEAR,
    L_SUB, /* read only: tsl_graph_sub() makes an add, written as one */
    L_MUL,
    L_SLICE,
    L_DROPOUT,
    L_GROUPNORM,
    L_LAYERNORM,
    L_INSTANCENORM,
    LAYER_OP_COUNT
};

typedef struct layer_spec {
    const char *op;
    uint32_t keys;       /* the keys a layer of this op may have */
    int32_t named;       /* the graph keeps its name (its parameters are named after it) */
    int32_t min_inputs;  /* 0: the input layer */
    int32_t max_inputs;  /* ... */
    int32_t needs_space; /* its input needs 1 to 3 spatial dimensions */
} layer_spec;

extern const layer_spec json_specs[LAYER_OP_COUNT];

/* Defaults, as PyTorch's modules have them. */
#define DEFAULT_EPS 1e-5
#define DEFAULT_MOMENTUM 0.1
#define DEFAULT_DROPOUT 0.5
extern const int64_t json_zeros[3], json_ones[3];

/* The "op" of a layer: its spec's, or for an activation the activation table's name. */
const char *json_op_text(int32_t op, tsl_activation act);

/* The keys a layer may have: its spec's, and "slope" for an activation that takes one. */
uint32_t json_op_keys(int32_t op, tsl_activation act);

/* The layer op named `name` (an activation's kind in *act), or -1. */
int32_t json_find_op(const char *name, tsl_activation *act);

/* Every op a model file may name, comma-separated, in the specs' order. */
void json_op_list(char *text, size_t size);

#endif /* TESSEL_GRAPH_JSON_INTERNAL_H */
