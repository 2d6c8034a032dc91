/* tessel eval: loss and accuracy of saved parameters on a dataset's test split. Every rank
 * takes part (the model's tile tasks span the ranks); rank 0 prints. */
#include <stdio.h>

#include "cli.h"

static void usage_eval(FILE *out)
{
    fprintf(out, "usage: tessel eval --data SPEC --load-params DIR [--model NAME] [--batch B]\n"
                 "                   [--plan PLAN] [--ncpu N] [--sched NAME] [--spin]\n"
                 "  loss and accuracy of saved parameters on the data's test split\n");
}

/* Parse the options; returns -1 to exit 0 (help), an exit code > 0, or 0. */
static int parse_eval(int argc, char **argv, train_options *o)
{
    static const struct option options[] = {
        CLI_HELP_OPTION, CLI_COMMON_OPTIONS, CLI_RUN_OPTIONS, {0}};
    train_options_init(o);
    cli_parser parser = {"tessel eval", options, usage_eval, &o->common, parse_run_option, o};
    int code = cli_parse(&parser, argc, argv);
    if (code || (code = check_run_options(&parser, o)))
        return code;
    if (!o->load_params) {
        fprintf(stderr, "%s: --load-params is required\n", parser.command);
        return EXIT_USAGE;
    }
    return 0;
}

int command_eval(int argc, char **argv)
{
    train_options o;
    int code = parse_eval(argc, argv, &o);
    if (code)
        return code < 0 ? 0 : code;
    session s;
    if ((code = session_context(&s, &o)) || (code = session_open(&s, &o, 0))) {
        session_end(&s);
        return code;
    }
    double loss = 0, accuracy = 0;
    tsl_status st = evaluate(s.model, s.test, &s.test_info, o.batch, &loss, &accuracy);
    if (st)
        code = fail(st, "evaluating");
    else if (rank_of_process == 0)
        printf("tessel eval: model %s, data %s: test loss %.4f, accuracy %.2f%% (%lld "
               "samples)\n",
               o.model, o.data, loss, 100 * accuracy, (long long)s.test_info.samples);
    session_end(&s);
    return code;
}
