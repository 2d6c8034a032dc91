/* Files the library reads, opened so that a path naming something other than a regular file
 * (a named pipe, a device, a socket, a directory) is refused at once instead of blocking or
 * never ending (common/file.c). */
#ifndef TESSEL_COMMON_FILE_H
#define TESSEL_COMMON_FILE_H

#include <stdio.h>

/* Open `path` read-only (close-on-exec) if it is a regular file. Returns the descriptor, or -1
 * with *why (static text) saying what went wrong. */
int tsl_open_regular(const char *path, const char **why);

/* tsl_open_regular() as a stdio stream ("rb"); NULL with *why set on failure. */
FILE *tsl_fopen_regular(const char *path, const char **why);

#endif /* TESSEL_COMMON_FILE_H */
