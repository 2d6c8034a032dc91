/* `.npy` files: a strict header parser, whole-array read, and atomic writes (whole or streamed).
 * No StarPU. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "file.h"
#include "tessel/io.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_MAX_HEADER ((size_t)1 << 24) /* far beyond any real header; refuses garbage */

/* ---- a tiny parser for the Python dict literal numpy writes ---- */

typedef struct parser {
    const char *text;
    size_t len;
    size_t pos;
} parser;

static void skip_space(parser *p)
{
    while (p->pos < p->len && isspace((unsigned char)p->text[p->pos]))
        p->pos++;
}

static int accept(parser *p, char c)
{
    skip_space(p);
    if (p->pos < p->len && p->text[p->pos] == c) {
        p->pos++;
        return 1;
    }
    return 0;
}

/* A quoted string without escapes (numpy never writes any in these fields). */
static int parse_string(parser *p, char *out, size_t cap)
{
    skip_space(p);
    if (p->pos >= p->len || (p->text[p->pos] != '\'' && p->text[p->pos] != '"'))
        return 0;
    char quote = p->text[p->pos++];
    size_t n = 0;
    while (p->pos < p->len && p->text[p->pos] != quote) {
        if (p->text[p->pos] == '\\' || n + 1 >= cap)
            return 0;
        out[n++] = p->text[p->pos++];
    }
    if (p->pos >= p->len)
        return 0;
    p->pos++;
    out[n] = '\0';
    return 1;
}

static int parse_word(parser *p, const char *word)
{
    skip_space(p);
    size_t n = strlen(word);
    if (p->len - p->pos >= n && strncmp(p->text + p->pos, word, n) == 0) {
        p->pos += n;
        return 1;
    }
    return 0;
}

/* A non-negative integer; 0 on syntax error or overflow. */
static int parse_int(parser *p, int64_t *value)
{
    skip_space(p);
    if (p->pos >= p->len || !isdigit((unsigned char)p->text[p->pos]))
        return 0;
    int64_t v = 0;
    while (p->pos < p->len && isdigit((unsigned char)p->text[p->pos])) {
        int digit = p->text[p->pos++] - '0';
        if (v > (INT64_MAX - digit) / 10)
            return 0;
        v = v * 10 + digit;
    }
    if (p->pos < p->len && (p->text[p->pos] == 'L' || p->text[p->pos] == 'l'))
        p->pos++; /* Python 2 longs */
    *value = v;
    return 1;
}

static tsl_status parse_descr(const char *descr, tsl_dtype *dtype)
{
    size_t n = strlen(descr);
    if (n < 3)
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED, "npy: unsupported dtype '%s'", descr);
    char order = descr[0];
    const char *kind = descr + 1;
    if (strcmp(kind, "u1") == 0 && (order == '|' || order == '<' || order == '>' || order == '=')) {
        *dtype = TSL_U8;
        return TSL_OK;
    }
    if (order == '>')
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED,
                         "npy: big-endian dtype '%s' is not supported (save little-endian)", descr);
    if (order != '<' && order != '=')
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED, "npy: unsupported dtype '%s'", descr);
    if (strcmp(kind, "f4") == 0)
        *dtype = TSL_F32;
    else if (strcmp(kind, "f8") == 0)
        *dtype = TSL_F64;
    else if (strcmp(kind, "i4") == 0)
        *dtype = TSL_I32;
    else if (strcmp(kind, "i8") == 0)
        *dtype = TSL_I64;
    else
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED,
                         "npy: unsupported dtype '%s' (want f4, f8, i4, i8 or u1)", descr);
    return TSL_OK;
}

static tsl_status parse_dict(const char *text, size_t len, tsl_npy_header *h)
{
    parser p = {text, len, 0};
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    int64_t dims[TSL_MAX_DIMS + 1];
    int ndim = 0;
    char descr[32];
    if (!accept(&p, '{'))
        return tsl_error(NULL, TSL_ERR_FORMAT, "npy: header is not a dict");
    while (!accept(&p, '}')) {
        char key[32];
        if (!parse_string(&p, key, sizeof key) || !accept(&p, ':'))
            return tsl_error(NULL, TSL_ERR_FORMAT, "npy: malformed header dict");
        if (strcmp(key, "descr") == 0 && !have_descr) {
            if (!parse_string(&p, descr, sizeof descr))
                return tsl_error(NULL, TSL_ERR_UNSUPPORTED,
                                 "npy: 'descr' is not a simple dtype string (structured arrays "
                                 "are not supported)");
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (parse_word(&p, "True"))
                fortran = 1;
            else if (!parse_word(&p, "False"))
                return tsl_error(NULL, TSL_ERR_FORMAT, "npy: 'fortran_order' is not a boolean");
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (!accept(&p, '('))
                return tsl_error(NULL, TSL_ERR_FORMAT, "npy: 'shape' is not a tuple");
            while (!accept(&p, ')')) {
                int64_t v;
                if (ndim > TSL_MAX_DIMS)
                    return tsl_error(NULL, TSL_ERR_UNSUPPORTED, "npy: more than %d dimensions",
                                     TSL_MAX_DIMS);
                if (!parse_int(&p, &v))
                    return tsl_error(NULL, TSL_ERR_FORMAT,
                                     "npy: 'shape' holds something other than sizes");
                dims[ndim++] = v;
                if (!accept(&p, ',')) {
                    if (!accept(&p, ')'))
                        return tsl_error(NULL, TSL_ERR_FORMAT, "npy: malformed 'shape'");
                    break;
                }
            }
            have_shape = 1;
        } else {
            return tsl_error(NULL, TSL_ERR_FORMAT, "npy: unexpected or repeated key '%s'", key);
        }
        if (!accept(&p, ',')) {
            if (!accept(&p, '}'))
                return tsl_error(NULL, TSL_ERR_FORMAT, "npy: malformed header dict");
            break;
        }
    }
    skip_space(&p);
    if (p.pos != p.len)
        return tsl_error(NULL, TSL_ERR_FORMAT, "npy: trailing characters after the header dict");
    if (!have_descr || !have_order || !have_shape)
        return tsl_error(NULL, TSL_ERR_FORMAT,
                         "npy: header lacks 'descr', 'fortran_order' or 'shape'");
    if (fortran)
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED,
                         "npy: Fortran-ordered arrays are not supported (save in C order)");
    tsl_status st = parse_descr(descr, &h->dtype);
    if (st)
        return st;
    if (ndim == 0)
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED, "npy: 0-d arrays are not supported");
    if (ndim > TSL_MAX_DIMS)
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED, "npy: %d dimensions (at most %d)", ndim,
                         TSL_MAX_DIMS);
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (dims[d] == 0)
            return tsl_error(NULL, TSL_ERR_UNSUPPORTED, "npy: empty arrays are not supported");
        if (numel > INT64_MAX / 8 / dims[d])
            return tsl_error(NULL, TSL_ERR_FORMAT, "npy: shape is impossibly large");
        numel *= dims[d];
    }
    memset(&h->shape, 0, sizeof h->shape);
    h->shape.ndim = ndim;
    for (int d = 0; d < TSL_MAX_DIMS; d++)
        h->shape.dims[d] = d < ndim ? dims[d] : 1;
    h->data_bytes = numel * (int64_t)tsl_dtype_size(h->dtype);
    return TSL_OK;
}

tsl_status tsl_npy_parse_header(const void *bytes, size_t size, tsl_npy_header *header)
{
    if (!bytes || !header)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_npy_parse_header: NULL argument");
    const unsigned char *b = bytes;
    if (size < 10 || memcmp(b, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return tsl_error(NULL, TSL_ERR_FORMAT, "npy: not a .npy file (bad magic)");
    tsl_npy_header h;
    memset(&h, 0, sizeof h);
    h.version_major = b[6];
    h.version_minor = b[7];
    size_t prefix, header_len;
    if (h.version_major == 1) {
        prefix = 10;
        header_len = (size_t)b[8] | ((size_t)b[9] << 8);
    } else if (h.version_major == 2 || h.version_major == 3) {
        if (size < 12)
            return tsl_error(NULL, TSL_ERR_FORMAT, "npy: truncated header");
        prefix = 12;
        header_len =
            (size_t)b[8] | ((size_t)b[9] << 8) | ((size_t)b[10] << 16) | ((size_t)b[11] << 24);
    } else {
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED, "npy: format version %d.%d not supported",
                         h.version_major, h.version_minor);
    }
    if (h.version_minor != 0)
        return tsl_error(NULL, TSL_ERR_UNSUPPORTED, "npy: format version %d.%d not supported",
                         h.version_major, h.version_minor);
    if (header_len > NPY_MAX_HEADER)
        return tsl_error(NULL, TSL_ERR_FORMAT, "npy: header length %zu is implausible", header_len);
    if (size < prefix + header_len)
        return tsl_error(NULL, TSL_ERR_FORMAT, "npy: truncated header (%zu of %zu bytes)",
                         size - prefix, header_len);
    tsl_status st = parse_dict((const char *)b + prefix, header_len, &h);
    if (st)
        return st;
    h.data_offset = (int64_t)(prefix + header_len);
    *header = h;
    return TSL_OK;
}

tsl_status tsl_npy_read(const char *path, tsl_npy_header *header, void **data)
{
    if (!path || !header || !data)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_npy_read: NULL argument");
    *data = NULL;
    const char *why;
    FILE *f = tsl_fopen_regular(path, &why);
    if (!f)
        return tsl_error(NULL, TSL_ERR_IO, "npy: cannot open '%s': %s", path, why);
    tsl_status st = TSL_OK;
    unsigned char *head = NULL;
    void *payload = NULL;
    if (fseeko(f, 0, SEEK_END) != 0) {
        st = tsl_error(NULL, TSL_ERR_IO, "npy: cannot seek in '%s'", path);
        goto done;
    }
    off_t file_size = ftello(f);
    rewind(f);
    unsigned char prefix[12];
    size_t got = fread(prefix, 1, sizeof prefix, f);
    if (got < 10 || memcmp(prefix, NPY_MAGIC, NPY_MAGIC_LEN) != 0) {
        st = tsl_error(NULL, TSL_ERR_FORMAT, "npy: '%s' is not a .npy file (bad magic)", path);
        goto done;
    }
    if (prefix[6] < 1 || prefix[6] > 3 || prefix[7] != 0) {
        st = tsl_error(NULL, TSL_ERR_UNSUPPORTED,
                       "npy: '%s' has format version %d.%d (want 1.0, "
                       "2.0 or 3.0)",
                       path, prefix[6], prefix[7]);
        goto done;
    }
    size_t header_len = prefix[6] == 1 ? ((size_t)prefix[8] | ((size_t)prefix[9] << 8))
                        : got < 12     ? 0
                                       : ((size_t)prefix[8] | ((size_t)prefix[9] << 8) |
                                      ((size_t)prefix[10] << 16) | ((size_t)prefix[11] << 24));
    size_t want = (prefix[6] == 1 ? 10 : 12) + header_len;
    if (header_len > NPY_MAX_HEADER || (off_t)want > file_size) {
        st = tsl_error(NULL, TSL_ERR_FORMAT, "npy: '%s' has a truncated or implausible header",
                       path);
        goto done;
    }
    head = malloc(want);
    if (!head) {
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "npy: out of memory");
        goto done;
    }
    rewind(f);
    if (fread(head, 1, want, f) != want) {
        st = tsl_error(NULL, TSL_ERR_IO, "npy: cannot read the header of '%s'", path);
        goto done;
    }
    tsl_npy_header h;
    if ((st = tsl_npy_parse_header(head, want, &h))) {
        tsl_error(NULL, st, "%s (in '%s')", tsl_last_error(), path);
        goto done;
    }
    int64_t available = (int64_t)file_size - h.data_offset;
    if (available < h.data_bytes) {
        st = tsl_error(NULL, TSL_ERR_FORMAT,
                       "npy: '%s' is truncated: its header promises %lld data bytes, the file "
                       "has %lld",
                       path, (long long)h.data_bytes, (long long)available);
        goto done;
    }
    if (available > h.data_bytes) {
        st = tsl_error(NULL, TSL_ERR_FORMAT,
                       "npy: '%s' has %lld bytes after the data its header describes", path,
                       (long long)(available - h.data_bytes));
        goto done;
    }
    payload = malloc((size_t)h.data_bytes);
    if (!payload) {
        st = tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "npy: cannot allocate %lld bytes for '%s'",
                       (long long)h.data_bytes, path);
        goto done;
    }
    if (fread(payload, 1, (size_t)h.data_bytes, f) != (size_t)h.data_bytes) {
        st = tsl_error(NULL, TSL_ERR_IO, "npy: cannot read the data of '%s'", path);
        goto done;
    }
    *header = h;
    *data = payload;
    payload = NULL;
done:
    free(payload);
    free(head);
    fclose(f);
    return st;
}

static const char *descr_of(tsl_dtype dtype)
{
    switch (dtype) {
    case TSL_F32:
        return "<f4";
    case TSL_F64:
        return "<f8";
    case TSL_I32:
        return "<i4";
    case TSL_I64:
        return "<i8";
    case TSL_U8:
        return "|u1";
    }
    return NULL;
}

/* The header of an array of `dtype` and `shape` (checked), padded so that the data starts on a
 * 64-byte boundary: `*total` bytes of `head`. */
static tsl_status npy_header(tsl_dtype dtype, const tsl_shape *shape, const char *fn,
                             unsigned char head[640], size_t *total)
{
    const char *descr = descr_of(dtype);
    if (!descr)
        return tsl_error(NULL, TSL_ERR_DTYPE, "%s: unknown dtype %d", fn, (int)dtype);
    tsl_status st = tsl_shape_check(shape);
    if (st)
        return st;
    char dict[512];
    int n =
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < shape->ndim; d++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld,%s", (long long)shape->dims[d],
                      d + 1 < shape->ndim ? " " : "");
    if (shape->ndim > 1)
        n--; /* numpy writes (3,) for one dimension and (3, 4) for more */
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* Pad with spaces and end with a newline so that data starts on a 64-byte boundary. */
    size_t header_len = (size_t)n + 1;
    size_t prefix = 10;
    *total = (prefix + header_len + 63) / 64 * 64;
    memcpy(head, NPY_MAGIC, NPY_MAGIC_LEN);
    head[6] = 1;
    head[7] = 0;
    size_t padded = *total - prefix;
    head[8] = (unsigned char)(padded & 0xff);
    head[9] = (unsigned char)(padded >> 8);
    memcpy(head + prefix, dict, (size_t)n);
    memset(head + prefix + n, ' ', padded - (size_t)n - 1);
    head[*total - 1] = '\n';
    return TSL_OK;
}

struct tsl_npy_writer {
    char *path, *tmp;
    FILE *f;
    size_t elem_size;
    int64_t remaining; /* elements still to append */
    int failed;        /* an append failed: closing discards the file */
};

static void writer_discard(tsl_npy_writer_t w)
{
    if (w->f)
        fclose(w->f);
    unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    free(w);
}

tsl_status tsl_npy_writer_open(tsl_npy_writer_t *writer, const char *path, tsl_dtype dtype,
                               const tsl_shape *shape)
{
    if (!writer || !path || !shape)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_npy_writer_open: NULL argument");
    *writer = NULL;
    unsigned char head[640];
    size_t total = 0;
    tsl_status st = npy_header(dtype, shape, "tsl_npy_writer_open", head, &total);
    if (st)
        return st;
    tsl_npy_writer_t w = calloc(1, sizeof *w);
    size_t tmp_len = strlen(path) + 32;
    if (w) {
        w->path = strdup(path);
        w->tmp = malloc(tmp_len);
    }
    if (!w || !w->path || !w->tmp) {
        if (w) {
            free(w->path);
            free(w->tmp);
        }
        free(w);
        return tsl_error(NULL, TSL_ERR_OUT_OF_MEMORY, "npy: out of memory");
    }
    snprintf(w->tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
    w->elem_size = tsl_dtype_size(dtype);
    w->remaining = tsl_shape_numel(shape);
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        st = tsl_error(NULL, TSL_ERR_IO, "npy: cannot create '%s': %s", w->tmp, strerror(errno));
        free(w->path);
        free(w->tmp);
        free(w);
        return st;
    }
    if (fwrite(head, 1, total, w->f) != total) {
        st = tsl_error(NULL, TSL_ERR_IO, "npy: cannot write '%s': %s", w->tmp, strerror(errno));
        writer_discard(w);
        return st;
    }
    *writer = w;
    return TSL_OK;
}

tsl_status tsl_npy_writer_append(tsl_npy_writer_t w, const void *data, int64_t count)
{
    if (!w || (!data && count > 0) || count < 0)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_npy_writer_append: %s",
                         !w          ? "NULL writer"
                         : count < 0 ? "negative count"
                                     : "NULL data");
    if (w->failed)
        return tsl_error(NULL, TSL_ERR_IO, "npy: '%s': an earlier write failed", w->path);
    if (count > w->remaining) {
        w->failed = 1;
        return tsl_error(NULL, TSL_ERR_INVALID_ARG,
                         "npy: '%s': %lld elements appended where %lld remain in the shape",
                         w->path, (long long)count, (long long)w->remaining);
    }
    size_t bytes = (size_t)count * w->elem_size;
    if (fwrite(data, 1, bytes, w->f) != bytes) {
        w->failed = 1;
        return tsl_error(NULL, TSL_ERR_IO, "npy: cannot write '%s': %s", w->tmp, strerror(errno));
    }
    w->remaining -= count;
    return TSL_OK;
}

tsl_status tsl_npy_writer_close(tsl_npy_writer_t w)
{
    if (!w)
        return TSL_OK;
    tsl_status st = TSL_OK;
    if (w->failed)
        st = tsl_error(NULL, TSL_ERR_IO, "npy: '%s' not written: an earlier write failed", w->path);
    else if (w->remaining)
        st = tsl_error(NULL, TSL_ERR_INVALID_ARG,
                       "npy: '%s' not written: %lld elements of its shape were never appended",
                       w->path, (long long)w->remaining);
    else {
        int ok = fflush(w->f) == 0;
        ok = fsync(fileno(w->f)) == 0 && ok;
        ok = fclose(w->f) == 0 && ok;
        w->f = NULL;
        if (!ok || rename(w->tmp, w->path) != 0)
            st =
                tsl_error(NULL, TSL_ERR_IO, "npy: cannot write '%s': %s", w->path, strerror(errno));
    }
    writer_discard(w); /* after a rename the temporary name is gone: unlink does nothing */
    return st;
}

void tsl_npy_writer_discard(tsl_npy_writer_t w)
{
    if (w)
        writer_discard(w);
}

tsl_status tsl_npy_write(const char *path, tsl_dtype dtype, const tsl_shape *shape,
                         const void *data)
{
    if (!path || !shape || !data)
        return tsl_error(NULL, TSL_ERR_INVALID_ARG, "tsl_npy_write: NULL argument");
    tsl_npy_writer_t w;
    tsl_status st = tsl_npy_writer_open(&w, path, dtype, shape);
    if (st)
        return st;
    if ((st = tsl_npy_writer_append(w, data, tsl_shape_numel(shape)))) {
        tsl_npy_writer_discard(w);
        return st;
    }
    return tsl_npy_writer_close(w);
}
