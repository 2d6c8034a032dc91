/* Opening the files the library reads (common/file.h). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file.h"

int tsl_open_regular(const char *path, const char **why)
{
    /* O_NONBLOCK: opening a named pipe for reading would wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        *why = strerror(errno);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        *why = S_ISDIR(sb.st_mode) ? "it is a directory"
                                   : "not a regular file (a named pipe, device or socket)";
        close(fd);
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        *why = strerror(errno);
        close(fd);
        return -1;
    }
    return fd;
}

FILE *tsl_fopen_regular(const char *path, const char **why)
{
    int fd = tsl_open_regular(path, why);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        *why = strerror(errno);
        close(fd);
    }
    return f;
}
