/* Convolution and transposed convolution on CUDA with cuDNN (legacy cudnnConvolution* API), on
 * the worker's cuDNN handle (bound to its stream); the bias and its gradient with own kernels.
 *
 * cuDNN's view. Every problem is one cuDNN convolution from a tensor "cx" of C channels to a
 * tensor "cy" of K channels with a filter (K, C / groups, k...): for a convolution cx is x and cy
 * is y, for a transposed one cx is y and cy is x, so PyTorch's weights, (O, I / groups, k...) and
 * (I, O / groups, k...), are that filter as they are. A transposed forward is then cuDNN's
 * backward data, its backward data cuDNN's forward, and its weight gradient cuDNN's filter
 * gradient with x and dy exchanged. cuDNN wants 4-D or 5-D descriptors: a 1-D problem is a 2-D
 * one with a unit height.
 *
 * Layouts. The tiles stay as the CPU keeps them, plain N C (D) (H) W or channels-last
 * N (D) (H) W C, described to cuDNN by their strides. The weights are plain; with plain tiles
 * cuDNN reads them as an NCHW filter in place. With channels-last tiles they are transposed into
 * an NHWC filter (K, k..., C / groups) in the workspace (the weight gradient computed there and
 * transposed back): cuDNN's fast channels-last kernels want the filter in the tensors' layout,
 * and the weights are small beside the tiles. A run of the weights' input channels (w_in_channels)
 * is gathered into the workspace likewise (and its gradient scattered back, the rest of dw left
 * as it is, as on the CPU); a transposed convolution's run is a block of its filters, read in
 * place.
 *
 * Algorithms. Per worker and per problem, cuDNN's heuristics (cudnnGet*Algorithm_v7) rank the
 * algorithms; the first that is supported, deterministic (unless tsl_cuda_deterministic() is off;
 * a problem without any deterministic one takes the first of the others) and whose workspace
 * fits in max_workspace is kept in the worker's cache. Math: FMA only when tsl_cuda_tf32() is off,
 * else what the heuristics chose (TF32 tensor cores allowed, as PyTorch allows for convolutions by
 * default).
 *
 * Workspace: the worker's (tsl_cuda_workspace), one request per task holding the filter copy,
 * cuDNN's workspace and the bias gradient's partial sums.
 *
 * Semantics are the CPU kernels' (conv_primitives.c): y = conv(x, w) + b, or y += with
 * `accumulate`; dx overwritten; dw (its run of input channels) and db overwritten. Windowed tasks
 * (spatial tiles with halo slabs) and geometries cuDNN's symmetric padding cannot express run on
 * the CPU only (tsl_conv_cuda_supports, the codelets' can_execute). */
#include <limits.h>
#include <starpu.h>
#include <string.h>

#include <vector>

#include "conv.h"
#include "cuda_check.h"

namespace
{

constexpr int threads_per_block = 256;
constexpr int64_t max_blocks = 65535;
/* The most device memory a cuDNN algorithm may take as workspace. */
constexpr size_t max_workspace = (size_t)512 << 20;
constexpr size_t align_bytes = 256;

unsigned blocks_for(int64_t n)
{
    int64_t b = (n + threads_per_block - 1) / threads_per_block;
    return (unsigned)(b < 1 ? 1 : b < max_blocks ? b : max_blocks);
}

size_t aligned(size_t bytes)
{
    return (bytes + align_bytes - 1) / align_bytes * align_bytes;
}

enum cudnn_op { OP_FORWARD = 0, OP_BACKWARD_DATA = 1, OP_BACKWARD_FILTER = 2 };

/* The problem as one cuDNN convolution cx -> cy (see the file comment); nsp = 2 or 3 spatial
 * dimensions (a 1-D problem has a unit first one). */
struct view {
    int nsp;
    int samples, c, k, groups;
    int cx_size[3], cy_size[3], kernel[3], stride[3], pad[3], dil[3];
    int channels_last;
    int64_t cx_count, cy_count, kernel_volume;
};

bool fits_int(int64_t v)
{
    return v >= 1 && v <= INT_MAX;
}

/* The view of `a`; false when cuDNN cannot take the problem (sizes past int, an empty tensor, a
 * geometry whose output size is not the one of symmetric padding). */
bool make_view(const tsl_conv_args *a, view *v)
{
    memset(v, 0, sizeof *v);
    if (a->spatial < 1 || a->spatial > 3 || a->groups < 1 || a->in_channels % a->groups ||
        a->out_channels % a->groups)
        return false;
    int sp = a->spatial, lead = sp == 1 ? 1 : 0;
    v->nsp = sp + lead;
    const int64_t *cx_size = a->transposed ? a->out_size : a->in_size;
    const int64_t *cy_size = a->transposed ? a->in_size : a->out_size;
    int64_t cx_ch = a->transposed ? a->out_channels : a->in_channels;
    int64_t cy_ch = a->transposed ? a->in_channels : a->out_channels;
    if (!fits_int(a->samples) || !fits_int(cx_ch) || !fits_int(cy_ch))
        return false;
    v->samples = (int)a->samples;
    v->c = (int)cx_ch;
    v->k = (int)cy_ch;
    v->groups = (int)a->groups;
    v->channels_last = a->channels_last ? 1 : 0;
    for (int d = 0; d < lead; d++) {
        v->cx_size[d] = v->cy_size[d] = v->kernel[d] = v->stride[d] = v->dil[d] = 1;
        v->pad[d] = 0;
    }
    int64_t cx_count = a->samples * cx_ch, cy_count = a->samples * cy_ch, kv = 1;
    for (int d = 0; d < sp; d++) {
        int64_t span = a->dilation[d] * (a->kernel[d] - 1) + 1;
        if (!fits_int(cx_size[d]) || !fits_int(cy_size[d]) || !fits_int(a->kernel[d]) ||
            !fits_int(a->stride[d]) || !fits_int(a->dilation[d]) || a->padding[d] < 0 ||
            a->padding[d] > INT_MAX)
            return false;
        int64_t padded = cx_size[d] + 2 * a->padding[d];
        if (padded < span || (padded - span) / a->stride[d] + 1 != cy_size[d])
            return false;
        int at = lead + d;
        v->cx_size[at] = (int)cx_size[d];
        v->cy_size[at] = (int)cy_size[d];
        v->kernel[at] = (int)a->kernel[d];
        v->stride[at] = (int)a->stride[d];
        v->pad[at] = (int)a->padding[d];
        v->dil[at] = (int)a->dilation[d];
        cx_count *= cx_size[d];
        cy_count *= cy_size[d];
        kv *= a->kernel[d];
    }
    int64_t filter_count = cy_ch * (cx_ch / a->groups) * kv;
    if (cx_count > INT_MAX || cy_count > INT_MAX || filter_count > INT_MAX)
        return false;
    if (a->w_in_channels > 0 && (a->groups != 1 || a->w_in_offset < 0 ||
                                 a->w_in_offset + a->in_channels > a->w_in_channels))
        return false;
    v->cx_count = cx_count;
    v->cy_count = cy_count;
    v->kernel_volume = kv;
    return true;
}

/* ---- descriptors ---- */

struct descriptors {
    cudnnTensorDescriptor_t cx = nullptr, cy = nullptr;
    cudnnFilterDescriptor_t filter = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    descriptors() = default;
    descriptors(const descriptors &) = delete;
    descriptors &operator=(const descriptors &) = delete;
    ~descriptors()
    {
        if (conv)
            TSL_CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(conv));
        if (filter)
            TSL_CUDNN_CHECK(cudnnDestroyFilterDescriptor(filter));
        if (cy)
            TSL_CUDNN_CHECK(cudnnDestroyTensorDescriptor(cy));
        if (cx)
            TSL_CUDNN_CHECK(cudnnDestroyTensorDescriptor(cx));
    }
};

/* (samples, channels, size...) in the tile layout, by strides. */
void set_tensor(cudnnTensorDescriptor_t t, const view &v, int channels, const int *size)
{
    int nd = v.nsp + 2, dims[5], strides[5];
    dims[0] = v.samples;
    dims[1] = channels;
    int inner = 1; /* spatial elements after dimension d */
    for (int d = v.nsp - 1; d >= 0; d--) {
        dims[2 + d] = size[d];
        strides[2 + d] = v.channels_last ? inner * channels : inner;
        inner *= size[d];
    }
    strides[1] = v.channels_last ? 1 : inner;
    strides[0] = inner * channels;
    TSL_CUDNN_CHECK(cudnnSetTensorNdDescriptor(t, CUDNN_DATA_FLOAT, nd, dims, strides));
}

void make_descriptors(const view &v, descriptors *d)
{
    TSL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d->cx));
    TSL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d->cy));
    TSL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d->filter));
    TSL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d->conv));
    set_tensor(d->cx, v, v.c, v.cx_size);
    set_tensor(d->cy, v, v.k, v.cy_size);
    int fdims[5] = {v.k, v.c / v.groups};
    for (int i = 0; i < v.nsp; i++)
        fdims[2 + i] = v.kernel[i];
    TSL_CUDNN_CHECK(cudnnSetFilterNdDescriptor(
        d->filter, CUDNN_DATA_FLOAT, v.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
        v.nsp + 2, fdims));
    TSL_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(d->conv, v.nsp, v.pad, v.stride, v.dil,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    TSL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d->conv, v.groups));
}

/* ---- the algorithm cache: per worker, per problem ---- */

struct algo_entry {
    tsl_conv_args key;
    int op, tf32;
    int algo;
    cudnnMathType_t math;
    size_t workspace;
    algo_entry *next;
};

/* Each worker's list, touched only by that worker's thread. Entries live as long as the process
 * (tens of bytes a problem): the choice depends on the device and the problem only. */
algo_entry *algo_cache[STARPU_NMAXWORKERS];

/* The workspace of `algo` for `op` with the descriptors' current math type; false when cuDNN
 * does not support it. */
bool workspace_of(cudnnHandle_t h, int op, const descriptors &d, int algo, size_t *bytes)
{
    cudnnStatus_t st;
    if (op == OP_FORWARD)
        st = cudnnGetConvolutionForwardWorkspaceSize(h, d.cx, d.filter, d.conv, d.cy,
                                                     (cudnnConvolutionFwdAlgo_t)algo, bytes);
    else if (op == OP_BACKWARD_DATA)
        st = cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, d.filter, d.cy, d.conv, d.cx, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    else
        st = cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, d.cx, d.cy, d.conv, d.filter, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
    if (st == CUDNN_STATUS_NOT_SUPPORTED)
        return false;
    TSL_CUDNN_CHECK(st);
    return true;
}

/* One ranked candidate of the heuristics. */
struct candidate {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnMathType_t math;
    bool deterministic;
};

std::vector<candidate> heuristics(cudnnHandle_t h, int op, const descriptors &d)
{
    int max = 0, got = 0;
    std::vector<candidate> out;
    if (op == OP_FORWARD) {
        TSL_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
        std::vector<cudnnConvolutionFwdAlgoPerf_t> p((size_t)max);
        TSL_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.cx, d.filter, d.conv, d.cy, max,
                                                               &got, p.data()));
        for (int i = 0; i < got; i++)
            out.push_back({(int)p[i].algo, p[i].status, p[i].memory, p[i].mathType,
                           p[i].determinism == CUDNN_DETERMINISTIC});
    } else if (op == OP_BACKWARD_DATA) {
        TSL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
        std::vector<cudnnConvolutionBwdDataAlgoPerf_t> p((size_t)max);
        TSL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.filter, d.cy, d.conv, d.cx,
                                                                    max, &got, p.data()));
        for (int i = 0; i < got; i++)
            out.push_back({(int)p[i].algo, p[i].status, p[i].memory, p[i].mathType,
                           p[i].determinism == CUDNN_DETERMINISTIC});
    } else {
        TSL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
        std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> p((size_t)max);
        TSL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            h, d.cx, d.cy, d.conv, d.filter, max, &got, p.data()));
        for (int i = 0; i < got; i++)
            out.push_back({(int)p[i].algo, p[i].status, p[i].memory, p[i].mathType,
                           p[i].determinism == CUDNN_DETERMINISTIC});
    }
    return out;
}

/* The worker's algorithm for the problem and op, chosen on first use; sets the descriptors'
 * math type to it. */
const algo_entry *choose(cudnnHandle_t h, const tsl_conv_args *a, int op, descriptors &d)
{
    int id = starpu_worker_get_id_check(), tf32 = tsl_cuda_tf32();
    for (const algo_entry *e = algo_cache[id]; e; e = e->next)
        if (e->op == op && e->tf32 == tf32 && memcmp(&e->key, a, sizeof *a) == 0) {
            TSL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, e->math));
            return e;
        }
    TSL_CUDNN_CHECK(
        cudnnSetConvolutionMathType(d.conv, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
    std::vector<candidate> ranked = heuristics(h, op, d);
    /* deterministic algorithms first (when asked), then, where none serves, any */
    const bool want_deterministic = tsl_cuda_deterministic();
    for (int pass = want_deterministic ? 0 : 1; pass < 2; pass++)
        for (const candidate &c : ranked) {
            if (c.status != CUDNN_STATUS_SUCCESS || c.memory > max_workspace ||
                (pass == 0 && !c.deterministic))
                continue;
            cudnnMathType_t math = tf32 ? c.math : CUDNN_FMA_MATH;
            TSL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, math));
            size_t bytes = 0;
            if (!workspace_of(h, op, d, c.algo, &bytes) || bytes > max_workspace)
                continue;
            algo_entry *e = new algo_entry;
            e->key = *a;
            e->op = op;
            e->tf32 = tf32;
            e->algo = c.algo;
            e->math = math;
            e->workspace = bytes;
            e->next = algo_cache[id];
            algo_cache[id] = e;
            return e;
        }
    TSL_CODELET_FAIL("conv (CUDA): no cuDNN algorithm for the problem",
                     "none supported within the workspace limit");
    return nullptr;
}

/* ---- own kernels ---- */

/* Plain weights (K, Cg, V), rows `row` apart, to an NHWC filter (K, V, Cg) (to_nhwc), or back. */
__global__ void filter_layout(int64_t k, int64_t cg, int64_t vol, int64_t row, int to_nhwc,
                              const float *src, float *dst)
{
    int64_t n = k * cg * vol, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t o = i / (cg * vol), c = i / vol % cg, v = i % vol;
        int64_t plain = o * row + c * vol + v, nhwc = (o * vol + v) * cg + c;
        dst[to_nhwc ? nhwc : plain] = src[to_nhwc ? plain : nhwc];
    }
}

/* y += b per channel, y (samples, channels, vol) in either layout. */
__global__ void add_bias(int64_t count, int64_t channels, int64_t vol, int channels_last,
                         const float *b, float *y)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride)
        y[i] += b[channels_last ? i % channels : i / vol % channels];
}

/* The bias gradient in two passes, the same sums in the same order on every run: partial[c][p]
 * = the sum of channel c over the p-th of `parts` runs of positions (samples x vol), in double;
 * then db[c] = the sum of its parts in order. */
constexpr int bias_lanes = 32, bias_rows = 8;

/* Channels-last: a block is 32 channels by 8 threads walking positions (coalesced by channel).
 * grid (channel groups, parts). */
__global__ void bias_partials_cl(int64_t positions, int64_t channels, int64_t per_part,
                                 const float *dy, double *partial)
{
    __shared__ double sums[bias_rows][bias_lanes];
    int64_t c = (int64_t)blockIdx.x * bias_lanes + threadIdx.x, part = blockIdx.y;
    int64_t lo = part * per_part, hi = lo + per_part < positions ? lo + per_part : positions;
    double s = 0;
    if (c < channels)
        for (int64_t p = lo + threadIdx.y; p < hi; p += bias_rows)
            s += dy[p * channels + c];
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
        double t = 0;
        for (int r = 0; r < bias_rows; r++)
            t += sums[r][threadIdx.x];
        partial[c * gridDim.y + part] = t;
    }
}

/* Plain: a block of 256 threads walks one channel's positions of one part (coalesced along
 * each sample's plane). grid (channels, parts). */
__global__ void bias_partials_plain(int64_t positions, int64_t channels, int64_t vol,
                                    int64_t per_part, const float *dy, double *partial)
{
    __shared__ double sums[threads_per_block];
    int64_t c = blockIdx.x, part = blockIdx.y;
    int64_t lo = part * per_part, hi = lo + per_part < positions ? lo + per_part : positions;
    double s = 0;
    for (int64_t p = lo + threadIdx.x; p < hi; p += blockDim.x)
        s += dy[(p / vol * channels + c) * vol + p % vol];
    sums[threadIdx.x] = s;
    __syncthreads();
    for (int half = threads_per_block / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half)
            sums[threadIdx.x] += sums[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        partial[c * gridDim.y + part] = sums[0];
}

__global__ void bias_finish(int64_t channels, int64_t parts, const double *partial, float *db)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < channels; c += stride) {
        double s = 0;
        for (int64_t p = 0; p < parts; p++)
            s += partial[c * parts + p];
        db[c] = (float)s;
    }
}

/* Parts of the positions for the bias gradient: enough blocks to fill the device, each part at
 * least a few thousand positions. */
int64_t bias_parts(int64_t positions)
{
    int64_t parts = (positions + 4095) / 4096;
    return parts < 1 ? 1 : parts > 1024 ? 1024 : parts;
}

/* db (out_channels) from dy (samples, out_channels, out volume). */
void bias_gradient(const tsl_conv_args *a, const float *dy, float *db, double *partial,
                   cudaStream_t stream)
{
    int64_t vol = 1;
    for (int d = 0; d < a->spatial; d++)
        vol *= a->out_size[d];
    int64_t positions = a->samples * vol, channels = a->out_channels;
    int64_t parts = bias_parts(positions), per_part = (positions + parts - 1) / parts;
    if (a->channels_last) {
        dim3 grid((unsigned)((channels + bias_lanes - 1) / bias_lanes), (unsigned)parts);
        bias_partials_cl<<<grid, dim3(bias_lanes, bias_rows), 0, stream>>>(positions, channels,
                                                                           per_part, dy, partial);
    } else {
        dim3 grid((unsigned)channels, (unsigned)parts);
        bias_partials_plain<<<grid, threads_per_block, 0, stream>>>(positions, channels, vol,
                                                                    per_part, dy, partial);
    }
    TSL_CUDA_CHECK_LAUNCH();
    bias_finish<<<blocks_for(channels), threads_per_block, 0, stream>>>(channels, parts, partial,
                                                                        db);
    TSL_CUDA_CHECK_LAUNCH();
}

/* ---- the weights in cuDNN's filter layout ---- */

/* Whether the weights need a copy in the workspace (channels-last tiles, or a run of input
 * channels), and the rows of the plain weights (K rows of Cg * V, `row` apart). */
struct weights_plan {
    bool copy;
    int64_t k, cg, vol, row;
    size_t offset; /* floats before the problem's weights */
    size_t bytes;  /* of the filter */
};

weights_plan plan_weights(const tsl_conv_args *a, const view &v)
{
    weights_plan p;
    p.k = v.k;
    p.cg = v.c / v.groups;
    p.vol = v.kernel_volume;
    /* a run of a transposed convolution's (I, O, k...) weights is a block of its filters (the
     * view's K rows): read in place from its first row */
    bool strided = a->w_in_channels > 0 && !a->transposed;
    p.row = strided ? a->w_in_channels * p.vol : p.cg * p.vol;
    p.offset = a->w_in_channels > 0 ? (size_t)(a->w_in_offset * (strided ? p.vol : p.row)) : 0;
    p.copy = v.channels_last || strided;
    p.bytes = (size_t)(p.k * p.cg * p.vol) * sizeof(float);
    return p;
}

/* The weights (w, at the plan's offset, rows p.row apart) to the filter copy (into_filter), or the
 * filter gradient back into them: transposed for an NHWC filter, else a strided copy. */
void convert_filter(const weights_plan &p, bool nhwc, bool into_filter, float *weights,
                    float *filter, cudaStream_t stream)
{
    weights += p.offset;
    if (nhwc) {
        filter_layout<<<blocks_for(p.k * p.cg * p.vol), threads_per_block, 0, stream>>>(
            p.k, p.cg, p.vol, p.row, into_filter, into_filter ? weights : filter,
            into_filter ? filter : weights);
        TSL_CUDA_CHECK_LAUNCH();
        return;
    }
    size_t width = (size_t)(p.cg * p.vol) * sizeof(float), pitch = (size_t)p.row * sizeof(float);
    if (into_filter)
        TSL_CUDA_CHECK(cudaMemcpy2DAsync(filter, width, weights, pitch, width, (size_t)p.k,
                                         cudaMemcpyDeviceToDevice, stream));
    else
        TSL_CUDA_CHECK(cudaMemcpy2DAsync(weights, pitch, filter, width, width, (size_t)p.k,
                                         cudaMemcpyDeviceToDevice, stream));
}

/* ---- the codelets ---- */

float *fbuf(void *buffers[], int i)
{
    return (float *)STARPU_VECTOR_GET_PTR(buffers[i]);
}

int64_t nx(void *buffers[], int i)
{
    return (int64_t)STARPU_VECTOR_GET_NX(buffers[i]);
}

enum task_kind { TASK_FORWARD, TASK_BACKWARD_DATA, TASK_BACKWARD_WEIGHTS };

/* The task's arguments and view, its tiles' sizes checked: x (in_channels, in_size),
 * y or dy (out_channels, out_size), the weights, the bias (or its gradient). Aborts on what
 * tsl_conv_cuda_supports() keeps off CUDA workers. */
void unpack(void *buffers[], void *cl_arg, task_kind kind, tsl_conv_task_args *t, view *v)
{
    starpu_codelet_unpack_args(cl_arg, t);
    TSL_CODELET_CHECK(!t->windowed && make_view(&t->conv, v),
                      "conv (CUDA): a problem the CUDA path does not take (see "
                      "tsl_conv_cuda_supports)");
    const tsl_conv_args *a = &t->conv;
    int bias = a->has_bias ? 1 : 0;
    /* Buffers of x, y (dy), the weights (weight gradient) and the bias (its gradient). */
    int at[3][4] = {{0, 2 + bias, 1, 2}, {2, 0, 1, -1}, {0, 1, 2, 3}};
    const int *b = at[kind];
    int64_t xs = a->transposed ? v->cy_count : v->cx_count;
    int64_t ys = a->transposed ? v->cx_count : v->cy_count;
    /* the weights: K x C / groups filters, or with a run of the input channels w_in_channels
     * of them (transposed: of K) */
    int64_t wcount = (int64_t)v->k * (v->c / v->groups);
    if (a->w_in_channels > 0)
        wcount = a->w_in_channels * (a->transposed ? v->c / v->groups : v->k);
    TSL_CODELET_CHECK(nx(buffers, b[0]) == xs && nx(buffers, b[1]) == ys &&
                          nx(buffers, b[2]) >= wcount * v->kernel_volume,
                      "conv (CUDA): tile sizes");
    TSL_CODELET_CHECK(!bias || b[3] < 0 || nx(buffers, b[3]) == a->out_channels,
                      "conv (CUDA): bias size");
}

/* cuDNN's forward (in = cx, out = cy) or backward data (in = cy, out = cx) of the view with the
 * weights w: out = the result + beta out. */
void data_pass(const tsl_conv_args *a, const view &v, int op, const float *in, const float *w,
               float *out, float beta)
{
    cudaStream_t stream = starpu_cuda_get_local_stream();
    cudnnHandle_t h = tsl_cuda_cudnn();
    descriptors d;
    make_descriptors(v, &d);
    const algo_entry *e = choose(h, a, op, d);
    weights_plan p = plan_weights(a, v);
    size_t filter_bytes = p.copy ? aligned(p.bytes) : 0;
    char *space = (char *)tsl_cuda_workspace(filter_bytes + e->workspace);
    const float *filter = w + p.offset; /* read in place, or copied into the workspace */
    if (p.copy) {
        convert_filter(p, v.channels_last, true, (float *)w, (float *)space, stream);
        filter = (const float *)space;
    }
    void *work = e->workspace ? space + filter_bytes : nullptr;
    const float one = 1.0f;
    if (op == OP_FORWARD)
        TSL_CUDNN_CHECK(cudnnConvolutionForward(h, &one, d.cx, in, d.filter, filter, d.conv,
                                                (cudnnConvolutionFwdAlgo_t)e->algo, work,
                                                e->workspace, &beta, d.cy, out));
    else
        TSL_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, d.filter, filter, d.cy, in, d.conv,
                                                     (cudnnConvolutionBwdDataAlgo_t)e->algo, work,
                                                     e->workspace, &beta, d.cx, out));
}

} // namespace

extern "C" int tsl_conv_cuda_supports(const tsl_conv_task_args *t)
{
    view v;
    return !t->windowed && make_view(&t->conv, &v);
}

extern "C" void tsl_conv_forward_cuda(void *buffers[], void *cl_arg)
{
    tsl_conv_task_args t;
    view v;
    unpack(buffers, cl_arg, TASK_FORWARD, &t, &v);
    const tsl_conv_args *a = &t.conv;
    int bias = a->has_bias ? 1 : 0;
    float *y = fbuf(buffers, 2 + bias);
    /* A transposed forward is the backward data of cuDNN's view (x is its cy, y its cx). */
    data_pass(a, v, a->transposed ? OP_BACKWARD_DATA : OP_FORWARD, fbuf(buffers, 0),
              fbuf(buffers, 1), y, a->accumulate ? 1.0f : 0.0f);
    if (bias) {
        int64_t count = a->transposed ? v.cx_count : v.cy_count,
                vol = count / a->samples / a->out_channels;
        add_bias<<<blocks_for(count), threads_per_block, 0, starpu_cuda_get_local_stream()>>>(
            count, a->out_channels, vol, v.channels_last, fbuf(buffers, 2), y);
        TSL_CUDA_CHECK_LAUNCH();
    }
}

extern "C" void tsl_conv_backward_data_cuda(void *buffers[], void *cl_arg)
{
    tsl_conv_task_args t;
    view v;
    unpack(buffers, cl_arg, TASK_BACKWARD_DATA, &t, &v);
    const tsl_conv_args *a = &t.conv;
    /* A transposed backward data is the forward of cuDNN's view (dy is its cx, dx its cy). */
    data_pass(a, v, a->transposed ? OP_FORWARD : OP_BACKWARD_DATA, fbuf(buffers, 0),
              fbuf(buffers, 1), fbuf(buffers, 2), 0.0f);
}

extern "C" void tsl_conv_backward_weights_cuda(void *buffers[], void *cl_arg)
{
    tsl_conv_task_args t;
    view v;
    unpack(buffers, cl_arg, TASK_BACKWARD_WEIGHTS, &t, &v);
    const tsl_conv_args *a = &t.conv;
    const float *x = fbuf(buffers, 0), *dy = fbuf(buffers, 1);
    float *dw = fbuf(buffers, 2);
    cudaStream_t stream = starpu_cuda_get_local_stream();
    cudnnHandle_t h = tsl_cuda_cudnn();
    descriptors d;
    make_descriptors(v, &d);
    const algo_entry *e = choose(h, a, OP_BACKWARD_FILTER, d);
    weights_plan p = plan_weights(a, v);
    size_t filter_bytes = p.copy ? aligned(p.bytes) : 0, partial_bytes = 0;
    if (a->has_bias) {
        int64_t positions = (a->transposed ? v.cx_count : v.cy_count) / a->out_channels;
        partial_bytes = aligned((size_t)(bias_parts(positions) * a->out_channels) * sizeof(double));
    }
    char *space = (char *)tsl_cuda_workspace(filter_bytes + partial_bytes + e->workspace);
    float *grad = p.copy ? (float *)space : dw + p.offset;
    void *work = e->workspace ? space + filter_bytes + partial_bytes : nullptr;
    /* cuDNN's cx and cy: x and dy for a convolution, dy and x for a transposed one. */
    const float *cx = a->transposed ? dy : x, *cy = a->transposed ? x : dy;
    const float one = 1.0f, zero = 0.0f;
    TSL_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, d.cx, cx, d.cy, cy, d.conv,
                                                   (cudnnConvolutionBwdFilterAlgo_t)e->algo, work,
                                                   e->workspace, &zero, d.filter, grad));
    if (p.copy)
        convert_filter(p, v.channels_last, false, dw, grad, stream);
    if (a->has_bias)
        bias_gradient(a, dy, fbuf(buffers, 3), (double *)(space + filter_bytes), stream);
}
