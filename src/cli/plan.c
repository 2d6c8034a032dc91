/* tessel plan: what a plan means for a model on a dataset, without running anything: how the
 * input is tiled, and the estimated tile memory of every rank (tsl_plan_estimate). Pure (no
 * MPI, no StarPU) but for --plan auto, whose calibration runs the model once (auto_plan.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void usage_plan(FILE *out)
{
    fprintf(
        out,
        "usage: tessel plan --data SPEC [--model NAME|FILE] [--plan PLAN] [--ranks N]\n"
        "                   [--batch B] [--ncpu W] [--optimizer sgd|adam|adamw]\n"
        "                   [--mem-per-rank M [--overhead-mib O]]\n"
        "                   [--plan auto [--objective time|memory] [--link GBPS,US] [--json F]\n"
        "                    [--scaling F]]\n"
        "  how PLAN (default: samples over all ranks and workers) tiles the model's tensors\n"
        "  on N ranks (default: the plan's rank count) of W CPU workers (default 1), and\n"
        "  the estimated tile memory of every rank for training with batches of B\n"
        "  (default 64): activations, gradients, labels, and the parameters where the\n"
        "  placement puts them, with their gradients and the optimizer state (adam, the\n"
        "  default, and adamw keep two copies; sgd one); with stages=, the stage table: each\n"
        "  stage's ranks, layers, largest rank's estimated tiles (all, and live at once\n"
        "  with received copies) and forward flops; and the bytes each rank sends per\n"
        "  training step (parameters, batch-norm sums, halos, stage boundaries, losses)\n"
        "  --mem-per-rank M   a verdict: whether every rank fits in M MiB (its tiles live\n"
        "                     at once, received copies and the process overhead)\n"
        "  --overhead-mib O   a rank's memory outside its tiles (default 48: measured\n"
        "                     28-43 MiB, bench/RESULTS.md)\n"
        "  --plan auto        choose the plan: every factorisation of the ranks into data,\n"
        "                     space, stages (micro-batches, tiles) predicted by the\n"
        "                     performance model from a calibration of the model on this\n"
        "                     machine (measured once with W workers, kept in the StarPU\n"
        "                     home; for N > 1 one a run on several ranks kept comes\n"
        "                     first); prints the five best that fit the memory (--mem-per-rank,\n"
        "                     default this node's memory / N), then the chosen plan's detail\n"
        "  --objective time|memory  what --plan auto minimises (default time: predicted\n"
        "                     s/step; memory: the largest rank's peak, for the largest sample)\n"
        "  --link GBPS,US     the network between ranks for --plan auto (GB/s and latency in\n"
        "                     microseconds); needed for N > 1 ranks, as one process cannot\n"
        "                     measure it\n");
}

/* How the parameters are kept (tsl_plan_param_placement). */
static int print_placement(const tsl_plan *plan, tsl_graph_t g, int32_t ranks,
                           const int32_t *op_stage)
{
    int32_t np = tsl_graph_param_count(g), nsharded = 0;
    tsl_tile_grid *grids = calloc((size_t)np + 1, sizeof *grids);
    tsl_owner_map *owners = calloc((size_t)np + 1, sizeof *owners);
    int32_t *sharded = calloc((size_t)np + 1, sizeof *sharded);
    tsl_status st = grids && owners && sharded
                        ? tsl_plan_param_placement(plan, g, ranks, op_stage, grids, owners, sharded)
                        : TSL_ERR_OUT_OF_MEMORY;
    int64_t bytes[4] = {0, 0, 0, 0};
    int32_t ncut = 0, ncut2 = 0;
    for (int32_t i = 0; i < np && !st; i++) {
        tsl_shape s;
        if ((st = tsl_graph_param_info(g, i, NULL, &s, NULL)))
            break;
        nsharded += sharded[i] == 1;
        ncut += sharded[i] == 2;
        ncut2 += sharded[i] == 3;
        bytes[sharded[i] < 4 ? sharded[i] : 0] += 4 * tsl_shape_numel(&s);
    }
    if (!st)
        printf("parameters: %d of %d sharded over their stage's ranks (%.2f MiB: weights of %d "
               "elements and more), %d whole on one rank each (%.2f MiB)",
               (int)nsharded, (int)np, (double)bytes[1] / 1048576.0,
               plan ? (int)plan->shard : TSL_PLAN_SHARD_DEFAULT,
               (int)(np - nsharded - ncut - ncut2), (double)bytes[0] / 1048576.0);
    if (!st && ncut)
        printf(", %d cut by filters over the %s groups (%.2f MiB)", (int)ncut,
               plan && plan->channels > 1 ? "channel" : "filter", (double)bytes[2] / 1048576.0);
    if (!st && ncut2)
        printf(", %d cut by input channels (and filters) over the channel groups (%.2f MiB)",
               (int)ncut2, (double)bytes[3] / 1048576.0);
    if (!st)
        printf("\n");
    free(grids);
    free(owners);
    free(sharded);
    return st ? fail(st, "placing the parameters") : 0;
}

/* The stage table: each stage's ranks, ops, largest rank's estimated tiles (all, and live at
 * once with received copies) and flops. */
static int print_stages(const tsl_plan *plan, tsl_graph_t g, long ranks, int64_t batch,
                        const int32_t *op_stage, const int64_t *bytes, const int64_t *peak,
                        const int64_t *received)
{
    int32_t stages = tsl_plan_depth(plan), group = (int32_t)(ranks / stages);
    printf("stage ranks      ops          first op -> last op            tiles (largest rank)  "
           "live + received (largest)  forward GFLOP\n");
    for (int32_t s = 0; s < stages; s++) {
        int32_t count = 0, first = -1, last = -1;
        double flops = 0;
        for (int32_t o = 0; o < tsl_graph_op_count(g); o++) {
            if (op_stage[o] != s)
                continue;
            double f = 0;
            tsl_status st = tsl_graph_op_flops(g, o, batch, &f);
            if (st)
                return fail(st, "estimating flops");
            flops += f;
            count++;
            first = first < 0 ? o : first;
            last = o;
        }
        int64_t largest = 0, live = 0;
        for (int32_t r = s * group; r < (s + 1) * group; r++) {
            largest = bytes[r] > largest ? bytes[r] : largest;
            live = peak[r] + received[r] > live ? peak[r] + received[r] : live;
        }
        char names[64] = "-";
        if (count) {
            tsl_op_kind k1, k2;
            const char *n1, *n2;
            tsl_graph_op_info(g, first, &k1, &n1, NULL);
            tsl_graph_op_info(g, last, &k2, &n2, NULL);
            snprintf(names, sizeof names, "%s -> %s", *n1 ? n1 : tsl_op_kind_name(k1),
                     *n2 ? n2 : tsl_op_kind_name(k2));
        }
        char rk[24];
        snprintf(rk, sizeof rk, "%d-%d", (int)(s * group), (int)((s + 1) * group - 1));
        printf("%-5d %-10s %-12d %-30s %10.1f MiB %20.1f MiB %22.3f\n", (int)s, rk, (int)count,
               names, (double)largest / 1048576.0, (double)live / 1048576.0, flops / 1e9);
    }
    return 0;
}

enum {
    OPT_RANKS = OPT_COMMAND_FIRST,
    OPT_WORKERS,
    OPT_OPTIMIZER,
    OPT_MEM,
    OPT_OVERHEAD,
    OPT_OBJECTIVE,
    OPT_LINK,
    OPT_JSON,
    OPT_SCALING
};

typedef struct plan_options {
    const char *model, *data, *plan_text, *optimizer;
    long ranks, batch, workers, mem_mib, overhead_mib;
    int objective;             /* --objective: a tsl_plan_objective */
    const char *json;          /* --json FILE: --plan auto's ranking */
    const char *scaling;       /* --scaling FILE: the strong- and weak-scaling curves */
    double link_gbps, link_us; /* --link (0: not given) */
} plan_options;

/* tessel plan starts no StarPU: --ncpu is the workers of the ranks it plans for. */
static int parse_plan_option(const cli_parser *parser, int id, const char *v)
{
    plan_options *o = parser->state;
    int bad = 0;
    switch (id) {
    case OPT_MODEL:
        o->model = v;
        break;
    case OPT_DATA:
        o->data = v;
        break;
    case OPT_PLAN:
        o->plan_text = v;
        break;
    case OPT_RANKS:
        bad = parse_int_arg(v, 1, 1 << 20, &o->ranks);
        break;
    case OPT_BATCH:
        bad = parse_int_arg(v, 1, 1L << 24, &o->batch);
        break;
    case OPT_WORKERS:
        bad = parse_int_arg(v, 1, 4096, &o->workers);
        break;
    case OPT_OPTIMIZER:
        bad = !optimizer_known(v);
        o->optimizer = v;
        break;
    case OPT_MEM:
        bad = parse_int_arg(v, 1, 1L << 30, &o->mem_mib);
        break;
    case OPT_OVERHEAD:
        bad = parse_int_arg(v, 0, 1L << 30, &o->overhead_mib);
        break;
    case OPT_JSON:
        o->json = v;
        break;
    case OPT_SCALING:
        o->scaling = v;
        break;
    case OPT_OBJECTIVE:
        bad = strcmp(v, "time") != 0 && strcmp(v, "memory") != 0;
        o->objective = strcmp(v, "memory") == 0 ? TSL_OBJECTIVE_MEMORY : TSL_OBJECTIVE_TIME;
        break;
    case OPT_LINK: {
        char tail = 0;
        bad = sscanf(v, "%lf,%lf%c", &o->link_gbps, &o->link_us, &tail) != 2 ||
              !(o->link_gbps > 0 && o->link_gbps < 1e6) || !(o->link_us >= 0 && o->link_us < 1e6);
        break;
    }
    default:
        return OPTION_UNKNOWN;
    }
    return bad ? OPTION_BAD_VALUE : OPTION_OK;
}

/* Parse the options; returns -1 to exit 0 (help), an exit code > 0, or 0. */
static int parse_plan(int argc, char **argv, plan_options *o)
{
    static const struct option options[] = {CLI_HELP_OPTION,
                                            {"model", required_argument, NULL, OPT_MODEL},
                                            {"data", required_argument, NULL, OPT_DATA},
                                            {"plan", required_argument, NULL, OPT_PLAN},
                                            {"ranks", required_argument, NULL, OPT_RANKS},
                                            {"batch", required_argument, NULL, OPT_BATCH},
                                            {"ncpu", required_argument, NULL, OPT_WORKERS},
                                            {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
                                            {"mem-per-rank", required_argument, NULL, OPT_MEM},
                                            {"overhead-mib", required_argument, NULL, OPT_OVERHEAD},
                                            {"objective", required_argument, NULL, OPT_OBJECTIVE},
                                            {"link", required_argument, NULL, OPT_LINK},
                                            {"json", required_argument, NULL, OPT_JSON},
                                            {"scaling", required_argument, NULL, OPT_SCALING},
                                            {0}};
    *o = (plan_options){.model = "cnn",
                        .optimizer = "adam",
                        .batch = 64,
                        .workers = 1,
                        .overhead_mib = PLAN_OVERHEAD_MIB};
    cli_parser parser = {"tessel plan", options, usage_plan, NULL, parse_plan_option, o};
    int code = cli_parse(&parser, argc, argv);
    if (code)
        return code;
    if (!o->data) {
        fprintf(stderr, "tessel plan: --data is required\n"
                        "usage: tessel plan [options]   ('tessel plan --help' lists them)\n");
        return EXIT_USAGE;
    }
    return 0;
}

/* Whether each rank fits in mem MiB: its tiles live at once, the copies it receives and the
 * process overhead. */
static void print_verdict(const int64_t *peak, const int64_t *received, long ranks, long mem,
                          long overhead)
{
    long over = 0, worst = 0;
    double need_max = 0;
    for (long r = 0; r < ranks; r++) {
        double need = (double)(peak[r] + received[r]) / 1048576.0 + (double)overhead;
        over += need > (double)mem;
        if (need > need_max) {
            need_max = need;
            worst = r;
        }
    }
    if (!over)
        printf(
            "verdict: fits in %ld MiB per rank (largest need %.0f MiB on rank %ld: tiles live at "
            "once, received copies and %ld MiB of process overhead)\n",
            mem, need_max, worst, overhead);
    else
        printf("verdict: does not fit in %ld MiB per rank on %ld of %ld ranks (largest need %.0f "
               "MiB on rank %ld: tiles live at once, received copies and %ld MiB of process "
               "overhead); more ranks in space=, or recompute=1, lower it\n",
               mem, over, ranks, need_max, worst, overhead);
}

/* Warn when some ranks own no tile of the input (they would idle through every step). */
static void warn_idle_ranks(const tsl_tile_grid *grid, const tsl_owner_map *owners, int32_t ndim,
                            long ranks, long batch)
{
    char *busy = calloc((size_t)ranks, 1);
    if (!busy)
        return;
    int64_t tiles = 1;
    for (int32_t d = 0; d < ndim; d++)
        tiles *= grid->splits[d];
    for (int64_t t = 0; t < tiles; t++) {
        int32_t tile[TSL_MAX_DIMS] = {0}, rank = -1;
        for (int64_t rest = t, d = ndim - 1; d >= 0; d--) {
            tile[d] = (int32_t)(rest % grid->splits[d]);
            rest /= grid->splits[d];
        }
        if (tsl_owner_map_rank(owners, tile, ndim, grid, (int32_t)ranks, &rank) == TSL_OK &&
            rank >= 0 && rank < ranks)
            busy[rank] = 1;
    }
    long idle = 0;
    for (long r = 0; r < ranks; r++)
        idle += !busy[r];
    free(busy);
    if (idle)
        printf("warning: %ld of %ld ranks hold no tile of the input and would idle through every "
               "step (batch %ld): a plan with space= gives them a part of each sample\n",
               idle, ranks, batch);
}

/* The graph's ODE segments (tsl_graph_ode_segments): runs of residual steps u + h F(u), what
 * layer-parallel training works on. */
static int print_segments(tsl_graph_t g, const tsl_plan *plan, long ranks, int64_t batch)
{
    int32_t n = 0;
    tsl_status st = tsl_graph_ode_segments(g, 0, NULL, &n);
    tsl_ode_segment *s = n > 0 ? calloc((size_t)n, sizeof *s) : NULL;
    if (!st && n > 0 && !s)
        return fail_oom("for the ODE segments", (double)n * sizeof *s);
    if (!st && n > 0)
        st = tsl_graph_ode_segments(g, n, s, &n);
    if (st) {
        free(s);
        return fail(st, "finding the ODE segments");
    }
    int32_t longest = 0;
    for (int32_t i = 1; i < n; i++)
        longest = s[i].steps > s[longest].steps ? i : longest;
    if (n == 0) {
        printf("ODE segments: none (no residual steps u + h F(u))\n");
    } else {
        const char *first = "", *last = "";
        tsl_graph_op_info(g, s[longest].first_op, NULL, &first, NULL);
        tsl_graph_op_info(g, s[longest].last_op - 1, NULL, &last, NULL);
        printf("ODE segments: %d; the longest %d steps of %d ops, h %g (%s .. %s)\n", (int)n,
               (int)s[longest].steps, (int)s[longest].ops_per_step, s[longest].h,
               *first ? first : "-", *last ? last : "-");
    }
    int32_t depth = tsl_plan_depth(plan);
    if (plan && (plan->levels > 1 || plan->layers > 1)) {
        /* The multigrid in time: points per level, and the coarse levels' tensors (a point and
         * a right-hand side per coarse point, for the forward and for the adjoint). */
        printf("layer-parallel (MGRIT): %d rank group%s of %ld rank%s along the steps, %d "
               "level%s, cf %d, %d forward and %d backward V-cycles, %s-relaxation; inference %s\n",
               (int)depth, depth == 1 ? "" : "s", ranks / depth, ranks / depth == 1 ? "" : "s",
               (int)plan->levels, plan->levels == 1 ? " (the serial executor)" : "s", (int)plan->cf,
               (int)plan->iters, (int)plan->biters, plan->relax == TSL_RELAX_F ? "F" : "FCF",
               plan->infer == TSL_INFER_MGRIT ? "by the forward's V-cycles (infer=mgrit)"
                                              : "one sweep through the steps (infer=exact)");
        for (int32_t i = 0; i < n && plan->levels > 1; i++) {
            if (s[i].steps < 2)
                continue;
            tsl_shape u;
            tsl_graph_value_shape(g, s[i].input, &u);
            double bytes = 4.0 * (double)batch * (double)tsl_shape_numel(&u), coarse = 0;
            int64_t points = s[i].steps;
            printf("  segment of %d steps: points per level %d", (int)s[i].steps, (int)points);
            for (int32_t l = 1; l < plan->levels; l++) {
                if (points % plan->cf)
                    break;
                points /= plan->cf;
                printf(", %lld", (long long)points);
                coarse += 4.0 * (double)points * bytes;
            }
            printf("; coarse levels %.1f MiB in all (fine states as the serial executor keeps)\n",
                   coarse / 1048576.0);
        }
    }
    free(s);
    return 0;
}

/* The bytes the busiest rank sends in a training step (tsl_plan_estimate_traffic), by term. */
static void print_traffic(const int64_t *sent, long ranks)
{
    const int64_t *total = sent + (int64_t)TSL_TRAFFIC_TOTAL * ranks;
    long top = 0;
    double all = 0;
    for (long r = 0; r < ranks; r++) {
        top = total[r] > total[top] ? r : top;
        all += (double)total[r];
    }
    const double mib = 1048576.0;
    printf("traffic per training step (estimate): rank %ld sends the most, %.3f MiB (parameters "
           "%.3f, batch-norm sums %.3f, halos %.3f, stage boundaries %.3f, losses %.3f); all "
           "ranks %.3f MiB\n",
           top, (double)total[top] / mib, (double)sent[TSL_TRAFFIC_PARAMS * ranks + top] / mib,
           (double)sent[TSL_TRAFFIC_BATCHNORM * ranks + top] / mib,
           (double)sent[TSL_TRAFFIC_HALOS * ranks + top] / mib,
           (double)sent[TSL_TRAFFIC_STAGES * ranks + top] / mib,
           (double)sent[TSL_TRAFFIC_LOSSES * ranks + top] / mib, all / mib);
}

/* --json FILE of --plan auto: every plan that fits, ranked, with its prediction. */
typedef struct ranked_json {
    const plan_options *o;
    long ranks;
    const tsl_plan_costs *costs;
    const tsl_plan_prediction *ranked;
    int32_t count, total;
} ranked_json;

static int write_ranked(FILE *f, const void *arg)
{
    const ranked_json *r = arg;
    fprintf(f, "{\n  \"model\": ");
    json_string(f, r->o->model);
    fprintf(f, ",\n  \"data\": ");
    json_string(f, r->o->data);
    fprintf(f,
            ",\n  \"ranks\": %ld, \"workers\": %ld, \"batch\": %ld, \"objective\": \"%s\",\n"
            "  \"costs\": {\"task_seconds\": %.6g, \"wait_seconds\": %.6g, "
            "\"wait_seconds_windowed\": %.6g, "
            "\"latency\": %.6g, \"bandwidth\": %.6g, \"node_ranks\": %d, \"node_cores\": %d, "
            "\"shared_slowdown\": %.6g, \"wait_seconds_turns\": %.6g},\n"
            "  \"candidates\": %d,\n  \"plans\": [\n",
            r->ranks, r->o->workers, r->o->batch,
            r->o->objective == TSL_OBJECTIVE_MEMORY ? "memory" : "time", r->costs->task_seconds,
            r->costs->wait_seconds, r->costs->wait_seconds_windowed, r->costs->latency,
            r->costs->bandwidth, (int)r->costs->node_ranks, (int)r->costs->node_cores,
            r->costs->shared_slowdown, r->costs->wait_seconds_turns, (int)r->total);
    for (int32_t i = 0; i < r->count; i++) {
        const tsl_plan_prediction *p = &r->ranked[i];
        char text[256];
        tsl_plan_format(&p->plan, text, sizeof text);
        fprintf(f, "    {\"plan\": ");
        json_string(f, text);
        fprintf(f,
                ", \"seconds\": %.6g, \"peak_bytes\": %lld, \"sent_bytes\": %lld, "
                "\"binding\": \"%s\", \"terms\": {",
                p->seconds, (long long)p->peak_bytes, (long long)p->sent_bytes,
                tsl_plan_term_name(p->binding));
        for (int32_t t = 0; t < TSL_TERM_COUNT; t++)
            fprintf(f, "%s\"%s\": %.6g", t ? ", " : "", tsl_plan_term_name(t), p->terms[t]);
        fprintf(f, "}}%s\n", i + 1 < r->count ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    return 0;
}

/* One point of a scaling curve: the best predicted plan at `ranks` for `batch`. */
typedef struct scaling_point {
    long ranks;
    int64_t batch;
    int ok;
    tsl_plan_prediction best;
} scaling_point;

typedef struct scaling_json {
    const scaling_point *strong, *weak;
    int n;
} scaling_json;

static void write_points(FILE *f, const char *name, const scaling_point *p, int n)
{
    fprintf(f, "  \"%s\": [\n", name);
    for (int i = 0; i < n; i++) {
        char text[256] = "";
        if (p[i].ok)
            tsl_plan_format(&p[i].best.plan, text, sizeof text);
        fprintf(f, "    {\"ranks\": %ld, \"batch\": %lld, \"plan\": ", p[i].ranks,
                (long long)p[i].batch);
        json_string(f, text);
        fprintf(f, ", \"seconds\": %.6g, \"peak_bytes\": %lld, \"binding\": \"%s\"}%s\n",
                p[i].ok ? p[i].best.seconds : -1.0,
                (long long)(p[i].ok ? p[i].best.peak_bytes : -1),
                p[i].ok ? tsl_plan_term_name(p[i].best.binding) : "", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]");
}

static int write_scaling(FILE *f, const void *arg)
{
    const scaling_json *s = arg;
    fprintf(f, "{\n");
    write_points(f, "strong", s->strong, s->n);
    fprintf(f, ",\n");
    write_points(f, "weak", s->weak, s->n);
    fprintf(f, "\n}\n");
    return 0;
}

/* --scaling: the best predicted plan at 1, 2, 4, ... ranks (and `ranks`), for the batch (strong)
 * and for the batch per rank (weak), printed and written to o->scaling. */
static int scaling(const plan_options *o, tsl_graph_t g, long ranks, int32_t states,
                   const tsl_plan_costs *costs)
{
    scaling_point strong[48], weak[48];
    int n = 0;
    for (long r = 1; n < 48 && r <= ranks; r = r * 2 <= ranks ? r * 2 : ranks) {
        scaling_point *pts[2] = {&strong[n], &weak[n]};
        for (int k = 0; k < 2; k++) {
            int32_t count = 0;
            pts[k]->ranks = r;
            pts[k]->batch = k ? o->batch * r : o->batch;
            pts[k]->ok =
                tsl_plan_search(g, (int32_t)r, (int32_t)o->workers, pts[k]->batch, states, costs,
                                auto_budget_bytes(o->mem_mib, o->overhead_mib, r), o->objective,
                                NULL, NULL, &pts[k]->best, 1, &count) == TSL_OK;
        }
        n++;
        if (r == ranks)
            break;
    }
    printf("scaling (predicted, the best plan at each rank count; efficiency against 1 rank):\n");
    printf("  %-6s | %-30s %10s %11s %6s | %-8s %-30s %10s %6s\n", "ranks", "strong: plan",
           "s/step", "samples/s", "eff.", "batch", "weak: plan", "s/step", "eff.");
    for (int i = 0; i < n; i++) {
        char a[256] = "-", b[256] = "-";
        if (strong[i].ok)
            tsl_plan_format(&strong[i].best.plan, a, sizeof a);
        if (weak[i].ok)
            tsl_plan_format(&weak[i].best.plan, b, sizeof b);
        double ts = strong[i].ok ? strong[i].best.seconds : 0,
               tw = weak[i].ok ? weak[i].best.seconds : 0;
        double es =
            strong[0].ok && ts > 0 ? strong[0].best.seconds / (ts * (double)strong[i].ranks) : 0;
        double ew = weak[0].ok && tw > 0 ? weak[0].best.seconds / tw : 0;
        printf("  %-6ld | %-30s %10.4g %11.1f %5.0f%% | %-8lld %-30s %10.4g %5.0f%%\n",
               strong[i].ranks, a, ts, ts > 0 ? (double)o->batch / ts : 0, 100 * es,
               (long long)weak[i].batch, b, tw, 100 * ew);
    }
    scaling_json sj = {strong, weak, n};
    if (write_file_atomic(o->scaling, write_scaling, &sj) != 0) {
        fprintf(stderr, "tessel plan: cannot write '%s'\n", o->scaling);
        return EXIT_FAILURE;
    }
    return 0;
}

/* --plan auto: calibrate (or take the cached calibration), rank the candidates, print the
 * best five (all of them to --json); *plan is the choice. Returns an exit code. */
static int choose(const plan_options *o, tsl_graph_t g, long ranks, int32_t states, tsl_plan *plan)
{
    double latency = o->link_us * 1e-6, bandwidth = o->link_gbps * 1e9;
    int kept = !(o->link_gbps > 0) && auto_cached_link(&latency, &bandwidth) == 0;
    if (ranks > 1 && !(bandwidth > 0)) {
        fprintf(stderr,
                "tessel plan: --plan auto for %ld ranks needs the network between them: give "
                "--link GBPS,US, or run tessel train --plan auto on several ranks once (it keeps "
                "what it measures in the StarPU home)\n",
                ranks);
        return EXIT_USAGE;
    }
    tsl_context_config config;
    tsl_context_config_init(&config);
    /* the ops' costs are per worker: measured with at most this machine's cores busy */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    config.ncpu = (int32_t)(cores > 0 && cores < o->workers ? cores : o->workers);
    config.ncuda = 0;
    tsl_context_t ctx = NULL;
    int32_t nops = tsl_graph_op_count(g), count = 0, total = 0;
    double *op_seconds = calloc(6 * (size_t)nops + 1, sizeof *op_seconds);
    tsl_plan_costs costs = {0};
    tsl_plan_prediction *ranked = NULL;
    int cached = 0, code = 0;
    tsl_status st = op_seconds ? tsl_context_create(&ctx, &config) : TSL_ERR_OUT_OF_MEMORY;
    if (!st)
        st = auto_costs(ctx, g, o->batch, (int32_t)ranks, op_seconds, &costs, &cached);
    tsl_context_destroy(ctx);
    costs.bandwidth = bandwidth;
    costs.latency = latency;
    if (!st)
        st = tsl_plan_candidates(g, (int32_t)ranks, (int32_t)o->workers, o->batch, NULL, 0, &total);
    if (!st && !(ranked = calloc((size_t)total + 1, sizeof *ranked)))
        st = TSL_ERR_OUT_OF_MEMORY;
    if (!st)
        st = tsl_plan_search(g, (int32_t)ranks, (int32_t)o->workers, o->batch, states, &costs,
                             auto_budget_bytes(o->mem_mib, o->overhead_mib, ranks), o->objective,
                             NULL, NULL, ranked, total, &count);
    if (st) {
        code = fail(st, "choosing a plan (--plan auto)");
    } else {
        print_ranked(ranked, count < 5 ? count : 5, count, total);
        char text[256];
        tsl_plan_format(&ranked[0].plan, text, sizeof text);
        printf("plan auto: chose %s (predicted %.4g s/step, binding term %s; calibration %s, %ld "
               "workers; network %.3g GB/s, %.3g us%s)\n",
               text, ranked[0].seconds, tsl_plan_term_name(ranked[0].binding),
               cached == 2   ? "from a run on several ranks"
               : cached == 1 ? "from the cache"
                             : "measured now",
               o->workers, bandwidth / 1e9, latency * 1e6,
               kept ? ", as the last run on several ranks measured it" : "");
        *plan = ranked[0].plan;
        ranked_json r = {o, ranks, &costs, ranked, count, total};
        if (o->json && write_file_atomic(o->json, write_ranked, &r) != 0) {
            fprintf(stderr, "tessel plan: cannot write '%s'\n", o->json);
            code = EXIT_FAILURE;
        }
        if (!code && o->scaling)
            code = scaling(o, g, ranks, states, &costs);
    }
    free(ranked);
    free(op_seconds);
    return code;
}

int command_plan(int argc, char **argv)
{
    plan_options o;
    int parsed = parse_plan(argc, argv, &o);
    if (parsed)
        return parsed < 0 ? 0 : parsed;
    const char *model = o.model, *data = o.data, *plan_text = o.plan_text;
    const char *optimizer = o.optimizer;
    long ranks = o.ranks, batch = o.batch, workers = o.workers;
    tsl_plan plan;
    int automatic = plan_text && strcmp(plan_text, "auto") == 0;
    if (plan_text && !automatic && tsl_plan_parse(plan_text, &plan) != TSL_OK) {
        fprintf(stderr, "tessel plan: %s\n", tsl_last_error());
        return EXIT_USAGE;
    }
    if (!ranks)
        ranks = plan_text && !automatic ? (long)tsl_plan_ranks(&plan) : 1;
    tsl_dataset_t ds;
    tsl_status st = tsl_dataset_open(&ds, data, TSL_SPLIT_TRAIN);
    if (st)
        return fail(st, "opening the data");
    tsl_dataset_info info;
    tsl_dataset_get_info(ds, &info);
    tsl_dataset_destroy(ds);
    tsl_graph_t g;
    if ((st = tsl_model_graph(model, info.sample_shape.ndim, info.sample_shape.dims, info.classes,
                              &g)))
        return fail(st, "building the model");
    int32_t states = optimizer_states(optimizer, 1); /* sgd as tessel train's default momentum */
    if (automatic) {
        int code = choose(&o, g, ranks, states, &plan);
        if (code) {
            tsl_graph_destroy(g);
            return code;
        }
    }
    int64_t *bytes = calloc((size_t)ranks, sizeof *bytes), one = 0;
    int64_t *received = calloc((size_t)ranks, sizeof *received);
    int64_t *peak = calloc((size_t)ranks, sizeof *peak), one_peak = 0;
    int32_t *op_stage = calloc((size_t)tsl_graph_op_count(g) + 1, sizeof *op_stage);
    int64_t *sent = calloc((size_t)ranks * TSL_TRAFFIC_TERMS, sizeof *sent);
    tsl_tile_grid grid;
    tsl_owner_map owners;
    const tsl_plan *pp = plan_text ? &plan : NULL; /* (auto: the choice) */
    /* One rank with the plan's memory policy (recompute=), for the ratios. */
    tsl_plan solo;
    tsl_plan_init(&solo);
    solo.recompute = pp ? pp->recompute : 0;
    int code = 0;
    if (!bytes || !received || !peak || !op_stage || !sent)
        code = fail_oom("for the estimates of every rank", (double)ranks * 24);
    else if ((st = tsl_plan_estimate(pp, g, (int32_t)ranks, (int32_t)workers, batch, states,
                                     bytes)) ||
             (st = tsl_plan_estimate_peak(pp, g, (int32_t)ranks, (int32_t)workers, batch, states,
                                          peak)) ||
             (st = tsl_plan_estimate_received(pp, g, (int32_t)ranks, (int32_t)workers, batch,
                                              states, received)) ||
             (st = tsl_plan_estimate(&solo, g, 1, 1, batch, states, &one)) ||
             (st = tsl_plan_estimate_peak(&solo, g, 1, 1, batch, states, &one_peak)) ||
             (st = tsl_plan_stages(pp, g, batch, states, op_stage)) ||
             (st = tsl_plan_estimate_traffic(pp, g, (int32_t)ranks, (int32_t)workers, batch, states,
                                             sent)) ||
             (st = tsl_plan_tensor_tiling(pp, &info.sample_shape, (int32_t)ranks, 0,
                                          (int32_t)workers, batch, &info.sample_shape, 1, &grid,
                                          &owners)))
        code = fail(st, "planning");
    if (!code) {
        char text[256] = "default";
        if (pp)
            tsl_plan_format(pp, text, sizeof text);
        printf("tessel plan: model %s, data %s (samples", model, data);
        for (int d = 0; d < info.sample_shape.ndim; d++)
            printf("%s%lld", d ? "x" : " ", (long long)info.sample_shape.dims[d]);
        printf("), batch %ld, plan %s on %ld ranks x %ld workers\n", batch, text, ranks, workers);
        printf("input tiles (N x C x spatial, stage 0):");
        for (int d = 0; d <= info.sample_shape.ndim; d++)
            printf("%s%d", d ? " x " : " ", (int)grid.splits[d]);
        printf("\n");
        if (tsl_plan_depth(pp) <= 1 &&
            (!pp || (pp->filters == 1 && pp->channels == 1))) /* (filters= and
                                                               * channels=: the input on group 0) */
            warn_idle_ranks(&grid, &owners, info.sample_shape.ndim + 1, ranks, batch);
        printf("rank  tiles (all)   tiles (most live at once)  received copies (at its peak)"
               "      sends per step\n");
        int64_t largest = 0, largest_peak = 0, with_received = 0;
        for (long r = 0; r < ranks; r++) {
            char tiles[32], live[32];
            snprintf(tiles, sizeof tiles, "%.1f MiB", (double)bytes[r] / 1048576.0);
            snprintf(live, sizeof live, "%.1f MiB", (double)peak[r] / 1048576.0);
            char got[32];
            snprintf(got, sizeof got, "%.1f MiB", (double)received[r] / 1048576.0);
            printf("%-5ld %-13s %-26s %-33s %.3f MiB\n", r, tiles, live, got,
                   (double)sent[TSL_TRAFFIC_TOTAL * ranks + r] / 1048576.0);
            largest = bytes[r] > largest ? bytes[r] : largest;
            largest_peak = peak[r] > largest_peak ? peak[r] : largest_peak;
            if (peak[r] + received[r] > with_received)
                with_received = peak[r] + received[r];
        }
        printf("largest rank %.1f MiB, %.2f of one rank's %.1f MiB\n", (double)largest / 1048576.0,
               (double)largest / (double)one, (double)one / 1048576.0);
        printf("largest rank live at once %.1f MiB, %.2f of one rank's %.1f MiB\n",
               (double)largest_peak / 1048576.0, (double)largest_peak / (double)one_peak,
               (double)one_peak / 1048576.0);
        printf("largest rank live at once with received copies %.1f MiB\n",
               (double)with_received / 1048576.0);
        if (o.mem_mib)
            print_verdict(peak, received, ranks, o.mem_mib, o.overhead_mib);
        if (tsl_plan_depth(pp) > 1)
            code = print_stages(pp, g, ranks, batch, op_stage, bytes, peak, received);
        if (!code)
            code = print_placement(pp, g, (int32_t)ranks, op_stage);
        if (!code)
            print_traffic(sent, ranks);
        if (!code)
            code = print_segments(g, pp, ranks, batch);
    }
    free(bytes);
    free(received);
    free(peak);
    free(op_stage);
    free(sent);
    tsl_graph_destroy(g);
    return code;
}
