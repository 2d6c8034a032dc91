/* Checks inside codelets. A codelet cannot return an error to StarPU, so a broken
 * invariant aborts through this one hook, which prints file, line and MPI rank. */
#ifndef TESSEL_CODELETS_CHECK_H
#define TESSEL_CODELETS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

/* MPI rank of this process, set by the context (-1 outside a context). */
extern int tsl_codelet_rank;

#define TSL_CODELET_CHECK(cond, msg)                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "tessel[%d] codelet failure at %s:%d: %s (%s)\n", tsl_codelet_rank,    \
                    __FILE__, __LINE__, (msg), #cond);                                             \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif /* TESSEL_CODELETS_CHECK_H */
