/* Parameter files and checkpoints: one .npy per parameter (PyTorch's names and layouts),
 * optimizer state beside them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "executor/executor.h"

/* DIR/NAME.npy */
static tsl_status param_path(struct tsl_model *m, const char *dir, int32_t i, char *path,
                             size_t size)
{
    int n = snprintf(path, size, "%s/%s.npy", dir, m->g->params[i].name);
    if (n < 0 || (size_t)n >= size)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "model: path too long in '%s'", dir);
    return TSL_OK;
}

tsl_status tsl_model_save_params(tsl_model_t m, const char *dir)
{
    if (!m || !dir)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_model_save_params: NULL argument");
    tsl_status st = TSL_OK;
    if (m->ctx->rank == 0 && mkdir(dir, 0777) != 0 && errno != EEXIST)
        st = tsl_error(m->ctx, TSL_ERR_IO, "tsl_model_save_params: cannot create '%s': %s", dir,
                       strerror(errno));
    if ((st = tsl_context_agree(m->ctx, 0, st)))
        return st;
    char path[4096];
    for (int32_t i = 0; i < m->g->nparams && !st; i++) /* (a shared op's copies: not files) */
        if (tsl_graph_param_source(m->g, i) == i &&
            !(st = param_path(m, dir, i, path, sizeof path)))
            st = tsl_tensor_write_npy(m->params[i], path, 0);
    return st;
}

/* The trainable parameters and their names (for the optimizer state). */
static tsl_status trainable(struct tsl_model *m, tsl_tensor_t **params, const char ***names,
                            int32_t *count)
{
    int32_t np = m->g->nparams, n = 0;
    *params = calloc((size_t)np + 1, sizeof **params);
    *names = calloc((size_t)np + 1, sizeof **names);
    if (!*params || !*names) {
        free(*params);
        free(*names);
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "model: out of memory");
    }
    for (int32_t i = 0; i < np; i++)
        if (m->pgrads[i] && tsl_graph_param_source(m->g, i) == i) {
            (*params)[n] = m->params[i];
            (*names)[n++] = m->g->params[i].name;
        }
    *count = n;
    return TSL_OK;
}

static tsl_status optimizer_dir(struct tsl_model *m, const char *dir, char *path, size_t size)
{
    int n = snprintf(path, size, "%s/optimizer", dir);
    if (n < 0 || (size_t)n >= size)
        return tsl_error(m->ctx, TSL_ERR_INVALID_ARG, "model: path too long in '%s'", dir);
    return TSL_OK;
}

/* Read and check every parameter file of DIR into `files` (one tile on rank 0 each),
 * changing nothing. */
static tsl_status read_param_files(struct tsl_model *m, const char *dir, tsl_tensor_t *files)
{
    char path[4096];
    tsl_status st = TSL_OK;
    tsl_owner_map root = tsl_owner_single(0);
    for (int32_t i = 0; i < m->g->nparams && !st; i++) {
        if (tsl_graph_param_source(m->g, i) != i)
            continue; /* a shared op's copy: the next forward fills it */
        if ((st = param_path(m, dir, i, path, sizeof path)) ||
            (st = tsl_tensor_read_npy(&files[i], m->ctx, path, 0, NULL, &root)))
            break;
        const tsl_shape *want = &m->g->params[i].shape;
        tsl_shape got;
        tsl_dtype dt;
        tsl_tensor_shape(files[i], &got);
        tsl_tensor_dtype(files[i], &dt);
        if (dt != TSL_F32 || got.ndim != want->ndim ||
            memcmp(got.dims, want->dims, sizeof(int64_t) * (size_t)want->ndim) != 0)
            st = tsl_error(m->ctx, TSL_ERR_SHAPE,
                           "tsl_model_load_params: '%s' is not an f32 array of the parameter's "
                           "shape",
                           path);
    }
    return st;
}

/* Load DIR's parameters and, with `opt`, the optimizer state of DIR/optimizer: every file
 * is read and checked before anything changes. */
static tsl_status load_files(struct tsl_model *m, tsl_optimizer_t opt, const char *dir)
{
    int32_t np = m->g->nparams;
    tsl_tensor_t *files = calloc((size_t)np + 1, sizeof *files);
    if (!files)
        return tsl_error(m->ctx, TSL_ERR_OUT_OF_MEMORY, "tsl_model_load_params: out of memory");
    tsl_optimizer_pending *pending = NULL;
    tsl_status st = read_param_files(m, dir, files);
    if (!st && opt) {
        char sub[4096];
        tsl_tensor_t *params;
        const char **names;
        int32_t n;
        if (!(st = optimizer_dir(m, dir, sub, sizeof sub)) &&
            !(st = trainable(m, &params, &names, &n))) {
            st = tsl_optimizer_read_state(opt, n, params, names, sub, &pending);
            free(names);
            if (!st)
                st = tsl_optimizer_apply_state(opt, pending);
            free(params);
        }
    }
    for (int32_t i = 0; i < np && !st; i++)
        if (files[i])
            st = tsl_tensor_redistribute(m->params[i], files[i]);
    for (int32_t i = 0; i < np; i++)
        tsl_tensor_destroy(files[i]);
    free(files);
    return st;
}

tsl_status tsl_model_load_params(tsl_model_t m, const char *dir)
{
    if (!m || !dir)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_model_load_params: NULL argument");
    return load_files(m, NULL, dir);
}

tsl_status tsl_model_save_checkpoint(tsl_model_t m, tsl_optimizer_t opt, const char *dir)
{
    if (!m || !opt || !dir)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_model_save_checkpoint: NULL argument");
    char sub[4096];
    tsl_status st = tsl_model_save_params(m, dir);
    if (st || (st = optimizer_dir(m, dir, sub, sizeof sub)))
        return st;
    if (m->ctx->rank == 0 && mkdir(sub, 0777) != 0 && errno != EEXIST)
        st = tsl_error(m->ctx, TSL_ERR_IO, "tsl_model_save_checkpoint: cannot create '%s': %s", sub,
                       strerror(errno));
    if ((st = tsl_context_agree(m->ctx, 0, st)))
        return st;
    tsl_tensor_t *params;
    const char **names;
    int32_t n;
    if ((st = trainable(m, &params, &names, &n)))
        return st;
    st = tsl_optimizer_save_state(opt, n, params, names, sub);
    free(params);
    free(names);
    return st;
}

tsl_status tsl_model_load_checkpoint(tsl_model_t m, tsl_optimizer_t opt, const char *dir)
{
    if (!m || !opt || !dir)
        return tsl_error(m ? m->ctx : NULL, TSL_ERR_INVALID_ARG,
                         "tsl_model_load_checkpoint: NULL argument");
    return load_files(m, opt, dir);
}
