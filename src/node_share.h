/* Which cores a rank gets among the ranks sharing a node (context.c). No StarPU, no MPI. */
#ifndef TESSEL_SRC_NODE_SHARE_H
#define TESSEL_SRC_NODE_SHARE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Local rank @p local of @p nlocal ranks sharing @p cores cores gets the cores [*first,
 * *first + *count): cores / nlocal of them, in rank order, the last for its StarPU-MPI
 * thread. Returns 0 (StarPU's own binding) for a rank alone on its node or fewer than two
 * cores per rank. */
int tsl_node_share(int local, int nlocal, int cores, int *first, int *count);

#ifdef __cplusplus
}
#endif

#endif
