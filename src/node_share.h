/* Which cores a rank gets among the ranks sharing a node (context.c). No StarPU, no MPI. */
#ifndef TESSEL_SRC_NODE_SHARE_H
#define TESSEL_SRC_NODE_SHARE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Local rank @p local of @p nlocal ranks sharing @p cores cores gets the cores [*first,
 * *first + *count): with at least two cores per rank, cores / nlocal of them in rank order,
 * the last for its StarPU-MPI thread; with fewer and @p yielding (its idle threads yield their
 * core), one core, local % cores, for its workers and its StarPU-MPI thread together.
 * Returns 0 (StarPU's own binding) for a rank alone on its node, or fewer than two cores per
 * rank without @p yielding. */
int tsl_node_share(int local, int nlocal, int cores, int yielding, int *first, int *count);

#ifdef __cplusplus
}
#endif

#endif
