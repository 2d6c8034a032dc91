/* Memory the library hands to callers (tessel/io.h: tsl_free()). */
#include <stdlib.h>

#include "tessel/io.h"

void tsl_free(void *ptr)
{
    free(ptr);
}
