/* tessel eval: loss and accuracy of saved parameters on a dataset's test split, and optionally
 * the network's outputs on it. Every rank takes part (the model's tile tasks span the ranks);
 * rank 0 prints and writes. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

enum { OPT_OUTPUTS = OPT_COMMAND_FIRST };

typedef struct eval_options {
    train_options run;
    const char *outputs;
} eval_options;

static void usage_eval(FILE *out)
{
    fprintf(
        out,
        "usage: tessel eval --data SPEC --load-params DIR [--model NAME] [--batch B]\n"
        "                   [--outputs FILE] [--plan PLAN] [--loss L] [--ncpu N] [--sched NAME]\n"
        "                   [--spin]\n"
        "  loss and accuracy of saved parameters on the data's test split (--loss as\n"
        "  tessel train takes it; default cross_entropy)\n"
        "  --outputs FILE  also write the network's outputs (logits, inference mode) on\n"
        "                  every test sample, in order, as a float32 .npy file of shape\n"
        "                  samples x output shape (written a batch at a time)\n");
}

static int handle_eval_option(const cli_parser *parser, int id, const char *value)
{
    eval_options *o = parser->state;
    if (id == OPT_OUTPUTS) {
        o->outputs = value;
        return OPTION_OK;
    }
    cli_parser run = *parser;
    run.state = &o->run;
    return parse_run_option(&run, id, value);
}

/* Parse the options; returns -1 to exit 0 (help), an exit code > 0, or 0. */
static int parse_eval(int argc, char **argv, eval_options *o)
{
    static const struct option options[] = {CLI_HELP_OPTION,
                                            CLI_COMMON_OPTIONS,
                                            CLI_RUN_OPTIONS,
                                            {"outputs", required_argument, NULL, OPT_OUTPUTS},
                                            {0}};
    train_options_init(&o->run);
    o->outputs = NULL;
    cli_parser parser = {"tessel eval", options, usage_eval, &o->run.common, handle_eval_option, o};
    int code = cli_parse(&parser, argc, argv);
    if (code || (code = check_run_options(&parser, &o->run)))
        return code;
    if (!o->run.load_params) {
        fprintf(stderr, "%s: --load-params is required\n", parser.command);
        return EXIT_USAGE;
    }
    return 0;
}

/* The model's outputs for test samples idx[0 .. count) into `out` on rank 0, for a model of
 * several inputs: each input's batch read on rank 0 (x, then each further input by its name)
 * into a tensor there, the forward into a tensor there (collective). */
static tsl_status forward_inputs(const session *s, const int64_t *idx, int64_t count, float *out)
{
    tsl_tensor_t xs[TSL_GRAPH_MAX_GRAPH_INPUTS] = {NULL}, y = NULL;
    tsl_owner_map root = tsl_owner_single(0);
    float *buf = NULL;
    tsl_status st = TSL_OK;
    for (int32_t k = 0; k < s->ninputs && !st; k++) {
        const tsl_shape *in = &s->input_shapes[k];
        tsl_shape shape = {.ndim = in->ndim + 1};
        shape.dims[0] = count;
        for (int32_t d = 0; d < in->ndim; d++)
            shape.dims[d + 1] = in->dims[d];
        int64_t per = tsl_shape_numel(in);
        if ((st = tsl_tensor_create(&xs[k], s->ctx, TSL_F32, &shape, NULL, &root)))
            break;
        if (rank_of_process == 0) {
            int64_t start[TSL_MAX_DIMS] = {0};
            st = (buf = malloc(sizeof *buf * (size_t)(count * per))) ? TSL_OK
                                                                     : TSL_ERR_OUT_OF_MEMORY;
            if (!st && k == 0)
                st = tsl_dataset_read(s->test, idx, count, buf, NULL);
            for (int64_t i = 0; !st && k > 0 && i < count; i++)
                st = tsl_dataset_read_input_box(s->test, s->input_names[k], idx[i], start, in->dims,
                                                buf + i * per);
        }
        if (!(st = agree(st)))
            st = tsl_tensor_scatter(xs[k], 0, buf);
        free(buf);
        buf = NULL;
    }
    tsl_shape os = {.ndim = s->output_shape.ndim + 1};
    os.dims[0] = count;
    for (int32_t d = 0; d < s->output_shape.ndim; d++)
        os.dims[d + 1] = s->output_shape.dims[d];
    if (!st)
        st = tsl_tensor_create(&y, s->ctx, TSL_F32, &os, NULL, &root);
    if (!st)
        st = tsl_model_forward_values_inputs(s->model, s->ninputs, xs, 0, 1, &s->output_value, &y);
    if (!st)
        st = tsl_tensor_gather(y, 0, out);
    for (int32_t k = 0; k < s->ninputs; k++)
        tsl_tensor_destroy(xs[k]);
    tsl_tensor_destroy(y);
    return st;
}

/* The outputs of every test sample into `path` on rank 0, a batch at a time (collective). */
static tsl_status write_outputs(const session *s, int64_t batch, const char *path)
{
    const tsl_dataset_info *info = &s->test_info;
    int64_t x_numel = tsl_shape_numel(&info->sample_shape);
    int64_t out_numel = tsl_shape_numel(&s->output_shape);
    float *x = NULL, *out = NULL;
    int64_t *idx = NULL;
    tsl_npy_writer_t w = NULL;
    tsl_status st = TSL_OK;
    if (rank_of_process == 0) {
        tsl_shape shape = {.ndim = s->output_shape.ndim + 1};
        shape.dims[0] = info->samples;
        for (int32_t d = 0; d < s->output_shape.ndim; d++)
            shape.dims[d + 1] = s->output_shape.dims[d];
        x = malloc(sizeof *x * (size_t)(batch * x_numel));
        out = malloc(sizeof *out * (size_t)(batch * out_numel));
        idx = malloc(sizeof *idx * (size_t)batch);
        if (!x || !out || !idx) {
            fprintf(stderr, "tessel eval: no memory for a batch of %lld outputs\n",
                    (long long)batch);
            st = TSL_ERR_OUT_OF_MEMORY;
        } else
            st = tsl_npy_writer_open(&w, path, TSL_F32, &shape);
    }
    st = agree(st);
    for (int64_t first = 0; first < info->samples && !st; first += batch) {
        int64_t count = info->samples - first < batch ? info->samples - first : batch;
        if (s->ninputs > 1) { /* (idx is only rank 0's) */
            for (int64_t i = 0; rank_of_process == 0 && i < count; i++)
                idx[i] = first + i;
            if ((st = forward_inputs(s, idx, count, out)))
                break;
        } else {
            if (rank_of_process == 0) {
                for (int64_t i = 0; i < count; i++)
                    idx[i] = first + i;
                st = tsl_dataset_read(s->test, idx, count, x, NULL);
            }
            if ((st = agree(st)) || (st = tsl_model_forward(s->model, count, x, 0, out)))
                break;
        }
        if (rank_of_process == 0)
            st = tsl_npy_writer_append(w, out, count * out_numel);
        st = agree(st);
    }
    if (rank_of_process == 0) {
        if (st)
            tsl_npy_writer_discard(w);
        else
            st = tsl_npy_writer_close(w);
    }
    st = agree(st);
    free(x);
    free(out);
    free(idx);
    return st;
}

int command_eval(int argc, char **argv)
{
    eval_options eo;
    int code = parse_eval(argc, argv, &eo);
    if (code)
        return code < 0 ? 0 : code;
    train_options *o = &eo.run;
    session s;
    if ((code = session_context(&s, o)) || (code = session_open(&s, o, 0))) {
        session_end(&s);
        return code;
    }
    double loss = 0, accuracy = 0;
    tsl_status st = evaluate(s.model, s.test, &s.test_info, o->batch, &loss, &accuracy);
    if (st)
        code = fail(st, "evaluating");
    else if (rank_of_process == 0 && s.test_info.targets) /* float targets: no accuracy */
        printf("tessel eval: model %s, data %s: test loss %.4f (%lld samples)\n", o->model, o->data,
               loss, (long long)s.test_info.samples);
    else if (rank_of_process == 0)
        printf("tessel eval: model %s, data %s: test loss %.4f, accuracy %.2f%% (%lld "
               "samples)\n",
               o->model, o->data, loss, 100 * accuracy, (long long)s.test_info.samples);
    if (!code && eo.outputs) {
        if ((st = write_outputs(&s, o->batch, eo.outputs)))
            code = fail(st, "writing the outputs");
        else if (rank_of_process == 0)
            printf("tessel eval: outputs of %lld samples written to %s\n",
                   (long long)s.test_info.samples, eo.outputs);
    }
    session_end(&s);
    return code;
}
