/* Loaded with LD_PRELOAD by the tests of out-of-memory reports: malloc, calloc and realloc of
 * at least TSL_TEST_FAIL_ALLOC_MIB MiB fail (return NULL, errno ENOMEM); smaller ones go to
 * glibc's allocator. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t count, size_t size);
void *__libc_realloc(void *ptr, size_t size);

static int too_large(size_t bytes)
{
    const char *mib = getenv("TSL_TEST_FAIL_ALLOC_MIB");
    if (!mib || bytes < ((size_t)strtoull(mib, NULL, 10) << 20))
        return 0;
    errno = ENOMEM;
    return 1;
}

void *malloc(size_t size)
{
    return too_large(size) ? NULL : __libc_malloc(size);
}

void *calloc(size_t count, size_t size)
{
    return size && count > SIZE_MAX / size ? NULL
           : too_large(count * size)       ? NULL
                                           : __libc_calloc(count, size);
}

void *realloc(void *ptr, size_t size)
{
    return too_large(size) ? NULL : __libc_realloc(ptr, size);
}
