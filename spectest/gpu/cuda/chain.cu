// The fused chain verifier of `reference-cupy` (spectest/gpu/cupy.py), compiled by NVRTC through CuPy.
//
// One thread block per row. The acceptance tests first: accept draft d at position i iff u_i q_i(d) < p_i(d)
// (warp 0 tests 32 positions per ballot); bf16 and fp16 rows define their distributions only once normalised,
// so for them each tested position's rows are summed first and the test is u_i q_i(d) P_i < p_i(d) Q_i, in
// float64. Then the one row pair the extra token needs: the residual max(0, p_j Q_j - q_j P_j) at the first
// rejection j (P = Q = 1 for float32 and float64, where the inputs are used as given), p_j when rounding left
// the residual empty, p_K after K acceptances. Sweep 1 sums its weights; sweep 2 finds the first cell whose
// running sum passes v times that total, tile by tile, and stops there.
//
// Precision: each weight is computed in the rows' working precision (float32 for float32, bf16 and fp16;
// float64 for float64), exactly as the Triton kernel computes it, without fused multiply-adds; every sum is
// accumulated in float64. A float64 sum of up to 2^17 float32 weights is off by at most about 2^-36 of the
// total, far below what the float32 weights themselves carry, so where a cell's interval starts and ends
// moves by less than any test can see, and no cell of weight 0 is ever chosen: a thread only owns the goal
// when its chunk holds positive weight, and within the chunk only a positive cell is picked. Float32
// accumulation would carry 2^-24 per addition, which over 2^17 cells is more than the weights' own rounding.
//
// Reads: 16-byte vector loads (4 float32, 2 float64, 8 bf16/fp16) when both rows are 16-byte aligned,
// element loads otherwise; UNROLL chunks per thread are loaded before any is used, so that enough bytes are
// in flight with few rows. The half types are read as raw 16-bit patterns and widened exactly here (bf16 by a
// shift, fp16 by the hardware's cvt.f32.f16), so the source needs no header (cuda_fp16.h, cuda_bf16.h) and
// compiles the same under every NVRTC; without __CUDA_ARCH__ (tests/cuda_on_cpu) it is plain C++.
//
// The variants (BUG): 0 correct; 1 the residual (and the bonus) from position 0; 2 a cell past V counted as
// if the padded last tile had read p 0.05, q 0 there; 3 the acceptance uniform reused for the extra token.

#ifndef SPECTEST_THREADS
#define SPECTEST_THREADS 256
#endif

#define SPECTEST_WARPS (SPECTEST_THREADS / 32)
#define SPECTEST_UNROLL 4
#define SPECTEST_FULL_MASK 0xffffffffu
#define SPECTEST_RESIDUAL_FROM_POSITION_0 1
#define SPECTEST_ID_PAST_V 2
#define SPECTEST_UNIFORM_REUSED 3
#define SPECTEST_PAST_V_TARGET 0.05

// bf16 and fp16 as the bits they are stored in (name expressions: spectest_chain<spectest_bf16, 0>).
struct spectest_bf16 {
    unsigned short bits;
};
struct spectest_fp16 {
    unsigned short bits;
};

__device__ __forceinline__ float spectest_fp16_to_float(unsigned short h) {
#if defined(__CUDA_ARCH__)
    float f;  // the hardware's conversion: exact (every fp16 value is a float32 value)
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    // The same conversion off the device (tests/cuda_on_cpu runs this file's kernel on the CPU): the exponent
    // and mantissa bits moved into a float's place give the value times 2^-112 (subnormal halves become float
    // subnormals), multiplying by 2^112 is exact, infinities and NaNs keep an all-ones exponent.
    const unsigned int magnitude_bits = (static_cast<unsigned int>(h) & 0x7fffu) << 13;
    float magnitude = __fmul_rn(__uint_as_float(magnitude_bits), 5.192296858534828e33f);  // 2^112
    if ((h & 0x7c00u) == 0x7c00u) magnitude = __uint_as_float(0x7f800000u | magnitude_bits);
    return __uint_as_float(__float_as_uint(magnitude) | ((static_cast<unsigned int>(h) & 0x8000u) << 16));
#endif
}

// Per element type: the working precision, the uniforms' type, whether rows are normalised, how to widen.
template <typename T>
struct SpectestElement;

template <>
struct SpectestElement<float> {
    typedef float work;
    typedef float uniform;
    static const bool half = false;
    static __device__ __forceinline__ float widen(float x) { return x; }
};

template <>
struct SpectestElement<double> {
    typedef double work;
    typedef double uniform;
    static const bool half = false;
    static __device__ __forceinline__ double widen(double x) { return x; }
};

template <>
struct SpectestElement<spectest_bf16> {
    typedef float work;
    typedef float uniform;
    static const bool half = true;
    static __device__ __forceinline__ float widen(spectest_bf16 x) {
        return __uint_as_float(static_cast<unsigned int>(x.bits) << 16);
    }
};

template <>
struct SpectestElement<spectest_fp16> {
    typedef float work;
    typedef float uniform;
    static const bool half = true;
    static __device__ __forceinline__ float widen(spectest_fp16 x) { return spectest_fp16_to_float(x.bits); }
};

// Rounded exactly as written (no contraction into a fused multiply-add), like the Triton kernel's launch.
__device__ __forceinline__ float spectest_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double spectest_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float spectest_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double spectest_sub(double a, double b) { return __dsub_rn(a, b); }

// max(0, p * p_scale - q * q_scale): the residual's weight (p_scale = Q, q_scale = P), or p (1, 0).
template <typename W>
__device__ __forceinline__ W spectest_weight(W p, W q, W p_scale, W q_scale) {
    const W w = spectest_sub(spectest_mul(p, p_scale), spectest_mul(q, q_scale));
    return w > W(0) ? w : W(0);
}

struct SpectestShared {
    double warp_totals[SPECTEST_WARPS];
    int accepted;
    int owner;
    long long last_positive;
};

// 16 bytes of a row as stored: VEC = 16 / sizeof(T) cells, widened only when used (fewer registers in flight).
template <typename T>
union SpectestChunk {
    uint4 bits;
    T elements[16 / sizeof(T)];
};

// One row pair read in chunks of VEC cells: thread t's chunk of a tile is cells [t VEC, (t + 1) VEC).
template <typename T, int BUG>
struct SpectestRowPair {
    typedef typename SpectestElement<T>::work work;
    typedef SpectestChunk<T> Chunk;
    static const int VEC = 16 / sizeof(T);

    const T* p;
    const T* q;  // null: not read (the bonus, the fallback, a row sum)
    long long vocab;
    bool vectors;  // both rows 16-byte aligned
    bool past_v;   // count the cell at V (the ID_PAST_V variant's sweeps)

    // Cells [start, start + VEC) of one row: one 16-byte load where the row is aligned and the chunk lies
    // inside it, element loads at the row's edge (zeros past V).
    __device__ __forceinline__ Chunk read(const T* row, long long start) const {
        Chunk chunk;
        if (vectors && start + VEC <= vocab) {
            chunk.bits = __ldg(reinterpret_cast<const uint4*>(row + start));
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) chunk.elements[e] = start + e < vocab ? row[start + e] : T();
        }
        return chunk;
    }

    __device__ __forceinline__ void load(long long start, Chunk& p_chunk, Chunk& q_chunk) const {
        p_chunk = read(p, start);
        if (q != 0) {
            q_chunk = read(q, start);
        } else {
            q_chunk.bits.x = q_chunk.bits.y = q_chunk.bits.z = q_chunk.bits.w = 0u;  // 0.0 in every type
        }
    }

    // The chunk's weights max(0, p p_scale - q q_scale); the ID_PAST_V variant counts cell V as p 0.05, q 0,
    // what its padded last tile reads past the row.
    __device__ __forceinline__ void weights(long long start, const Chunk& p_chunk, const Chunk& q_chunk, work p_scale,
                                            work q_scale, work (&out)[VEC]) const {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            work p_value = SpectestElement<T>::widen(p_chunk.elements[e]);
            if (past_v && start + e == vocab) p_value = work(SPECTEST_PAST_V_TARGET);
            out[e] = spectest_weight(p_value, SpectestElement<T>::widen(q_chunk.elements[e]), p_scale, q_scale);
        }
    }
};

__device__ __forceinline__ bool spectest_aligned(const void* at) {
    return (reinterpret_cast<unsigned long long>(at) & 15ull) == 0ull;
}

// The block's sum of one double per thread; every thread gets the same value (summed in warp order).
__device__ double spectest_block_sum(double x, SpectestShared& shared) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(SPECTEST_FULL_MASK, x, offset);
    __syncthreads();  // earlier readers of warp_totals are done
    if ((threadIdx.x & 31) == 0) shared.warp_totals[threadIdx.x >> 5] = x;
    __syncthreads();
    double total = 0.0;
#pragma unroll
    for (int w = 0; w < SPECTEST_WARPS; ++w) total += shared.warp_totals[w];
    return total;
}

// The block's sum of a row's weights: p alone (q null), the residual, or a row to normalise by.
template <typename T, int BUG>
__device__ __noinline__ double spectest_row_total(const SpectestRowPair<T, BUG>& pair, typename SpectestElement<T>::work p_scale,
                                     typename SpectestElement<T>::work q_scale, SpectestShared& shared) {
    typedef typename SpectestElement<T>::work work;
    const int VEC = SpectestRowPair<T, BUG>::VEC;
    const long long tile = static_cast<long long>(SPECTEST_THREADS) * VEC;
    const long long cells = pair.vocab + (pair.past_v ? 1 : 0);
    double part = 0.0;
    for (long long start = 0; start < cells; start += SPECTEST_UNROLL * tile) {
        typename SpectestRowPair<T, BUG>::Chunk p[SPECTEST_UNROLL], q[SPECTEST_UNROLL];
#pragma unroll
        for (int c = 0; c < SPECTEST_UNROLL; ++c) pair.load(start + c * tile + threadIdx.x * VEC, p[c], q[c]);
#pragma unroll
        for (int c = 0; c < SPECTEST_UNROLL; ++c) {
            work w[VEC];
            pair.weights(start + c * tile + threadIdx.x * VEC, p[c], q[c], p_scale, q_scale, w);
#pragma unroll
            for (int e = 0; e < VEC; ++e) part += static_cast<double>(w[e]);
        }
    }
    return spectest_block_sum(part, shared);
}

template <typename T, int BUG>
__global__ void __launch_bounds__(SPECTEST_THREADS)
    spectest_chain(const long long* __restrict__ drafts, long long d_row, long long d_pos, const T* __restrict__ q,
                   long long q_row, long long q_pos, const T* __restrict__ p, long long p_row, long long p_pos,
                   const typename SpectestElement<T>::uniform* __restrict__ u, const double* __restrict__ v,
                   long long* __restrict__ out, int k, long long vocab) {
    typedef typename SpectestElement<T>::work work;
    typedef SpectestRowPair<T, BUG> Pair;
    const int VEC = Pair::VEC;
    __shared__ SpectestShared shared;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const long long row = blockIdx.x;
    const long long* row_drafts = drafts + row * d_row;
    const T* p_base = p + row * p_row;
    const T* q_base = q + row * q_row;
    const typename SpectestElement<T>::uniform* row_u = u + row * k;

    // 1. The acceptance tests: the first rejected position, or k.
    int accepted = k;
    double p_sum_at = 1.0, q_sum_at = 1.0;  // row sums where the residual is taken (half precision only)
    if (SpectestElement<T>::half) {
        for (int i = 0; i < k; ++i) {  // block-uniform: every thread computes the same test
            const Pair p_row_i = {p_base + i * p_pos, 0, vocab, spectest_aligned(p_base + i * p_pos), false};
            const Pair q_row_i = {q_base + i * q_pos, 0, vocab, spectest_aligned(q_base + i * q_pos), false};
            const double p_sum = spectest_row_total(p_row_i, work(1), work(0), shared);
            const double q_sum = spectest_row_total(q_row_i, work(1), work(0), shared);
            const long long d = row_drafts[i * d_pos];
            const bool valid = d >= 0 && d < vocab;  // an id outside [0, V) is rejected, never read
            const double p_d = valid ? static_cast<double>(SpectestElement<T>::widen(p_base[i * p_pos + d])) : 0.0;
            const double q_d = valid ? static_cast<double>(SpectestElement<T>::widen(q_base[i * q_pos + d])) : 0.0;
            const double u_i = static_cast<double>(row_u[i]);
            const bool accept = valid && __dmul_rn(__dmul_rn(u_i, q_d), p_sum) < __dmul_rn(p_d, q_sum);
            if (BUG == SPECTEST_RESIDUAL_FROM_POSITION_0 ? i == 0 : !accept) {
                p_sum_at = p_sum;
                q_sum_at = q_sum;
            }
            if (!accept) {
                accepted = i;
                break;
            }
        }
    } else {
        if (warp == 0) {
            int first_rejected = k;
            for (int start = 0; start < k; start += 32) {  // warp-uniform: one ballot per 32 positions
                const int i = start + lane;
                bool accept = true;
                if (i < k) {
                    const long long d = row_drafts[i * d_pos];
                    const bool valid = d >= 0 && d < vocab;
                    const work p_d = valid ? SpectestElement<T>::widen(p_base[i * p_pos + d]) : work(0);
                    const work q_d = valid ? SpectestElement<T>::widen(q_base[i * q_pos + d]) : work(0);
                    accept = valid && spectest_mul(static_cast<work>(row_u[i]), q_d) < p_d;
                }
                const unsigned int rejections = __ballot_sync(SPECTEST_FULL_MASK, !accept);
                if (rejections != 0u) {
                    first_rejected = start + __ffs(rejections) - 1;
                    break;
                }
            }
            if (lane == 0) shared.accepted = first_rejected;
        }
        __syncthreads();
        accepted = shared.accepted;
    }
    for (int i = tid; i <= k; i += SPECTEST_THREADS) {
        if (i != accepted) out[row * (k + 1) + i] = i < accepted ? row_drafts[i * d_pos] : -1;
    }

    // 2. The row pair the extra token comes from, and its weights' total (sweep 1).
    const bool rejected = accepted < k;
    const int position = BUG == SPECTEST_RESIDUAL_FROM_POSITION_0 ? 0 : accepted;
    const T* p_next = p_base + position * p_pos;
    const T* q_next = rejected ? q_base + (position < k - 1 ? position : k - 1) * q_pos : 0;
    const bool past_v = BUG == SPECTEST_ID_PAST_V;
    Pair pair = {p_next, q_next, vocab, spectest_aligned(p_next) && (q_next == 0 || spectest_aligned(q_next)), past_v};
    work p_scale = work(1), q_scale = work(0);
    if (rejected) {
        p_scale = static_cast<work>(q_sum_at);
        q_scale = static_cast<work>(p_sum_at);
    }
    double total = spectest_row_total(pair, p_scale, q_scale, shared);
    if (!(total > 0.0)) {  // rounding emptied the residual (or it was taken after K acceptances): p itself
        pair.q = 0;
        p_scale = work(1);
        q_scale = work(0);
        total = spectest_row_total(pair, p_scale, q_scale, shared);
    }
    const double uniform = BUG == SPECTEST_UNIFORM_REUSED && k > 0 ? static_cast<double>(row_u[accepted < k - 1 ? accepted : k - 1])
                                                                  : v[row];
    const double goal = uniform * total;

    // 3. Sweep 2: the first cell whose running sum passes the goal; tile by tile, each thread's chunk summed,
    // the chunks scanned across the block, and the first thread with positive mass whose end passes the goal
    // searches its own chunk. Past the last tile (a float64 sum's last bit), the row's last positive cell.
    const long long tile = static_cast<long long>(SPECTEST_THREADS) * VEC;
    const long long cells = vocab + (past_v ? 1 : 0);
    double base = 0.0;
    long long last_positive = -1;
    bool found = false;
    if (tid == 0) shared.last_positive = -1;
    for (long long start = 0; start < cells && !found; start += SPECTEST_UNROLL * tile) {
        typename Pair::Chunk p_chunk[SPECTEST_UNROLL], q_chunk[SPECTEST_UNROLL];
#pragma unroll
        for (int c = 0; c < SPECTEST_UNROLL; ++c) pair.load(start + c * tile + tid * VEC, p_chunk[c], q_chunk[c]);
#pragma unroll
        for (int c = 0; c < SPECTEST_UNROLL; ++c) {  // unrolled: the chunks stay in registers
            if (found) continue;  // block-uniform
            const long long first = start + c * tile + static_cast<long long>(tid) * VEC;
            work w[VEC];
            pair.weights(first, p_chunk[c], q_chunk[c], p_scale, q_scale, w);
            double local = 0.0;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                local += static_cast<double>(w[e]);
                if (w[e] > work(0)) last_positive = first + e;
            }
            double inclusive = local;  // the warp's inclusive scan of the chunk sums
#pragma unroll
            for (int offset = 1; offset < 32; offset <<= 1) {
                const double before = __shfl_up_sync(SPECTEST_FULL_MASK, inclusive, offset);
                if (lane >= offset) inclusive += before;
            }
            double exclusive = __shfl_up_sync(SPECTEST_FULL_MASK, inclusive, 1);
            if (lane == 0) exclusive = 0.0;
            __syncthreads();  // the previous tile's readers of warp_totals and owner are done
            if (lane == 31) shared.warp_totals[warp] = inclusive;
            if (tid == 0) shared.owner = SPECTEST_THREADS;
            __syncthreads();
            double offset_of_warp = 0.0, tile_total = 0.0;
#pragma unroll
            for (int other = 0; other < SPECTEST_WARPS; ++other) {
                if (other == warp) offset_of_warp = tile_total;
                tile_total += shared.warp_totals[other];
            }
            if (local > 0.0 && base + (offset_of_warp + inclusive) > goal) atomicMin(&shared.owner, tid);
            __syncthreads();
            const int owner = shared.owner;
            if (owner < SPECTEST_THREADS) {
                found = true;
                if (tid == owner) {
                    const double before = base + (offset_of_warp + exclusive);
                    double running = 0.0;
                    long long pick = -1;
                    bool crossed = false;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        running += static_cast<double>(w[e]);
                        if (!crossed && w[e] > work(0)) {
                            pick = first + e;
                            crossed = before + running > goal;
                        }
                    }
                    out[row * (k + 1) + accepted] = pick;  // the crossing, or the chunk's last positive cell
                }
            }
            base += tile_total;
        }
    }
    if (!found) {
        if (last_positive >= 0) atomicMax(&shared.last_positive, last_positive);
        __syncthreads();
        if (tid == 0) out[row * (k + 1) + accepted] = shared.last_positive;
    }
}
