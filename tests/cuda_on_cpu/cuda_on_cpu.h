// Just enough CUDA to run spectest/gpu/cuda/chain.cu's kernel on a CPU, for the harness's own tests.
//
// Every CUDA thread of a block is a std::thread; __syncthreads is a barrier over the block, each warp's
// shuffles and ballots exchange values through per-warp slots between two barriers over its 32 lanes, and
// __shared__ variables are function statics (the blocks of a grid run one after another, all of a block's
// threads at once). So the kernel's own control flow, indexing, reductions and scans run as written: a
// __syncthreads or a shuffle that not every thread reaches deadlocks here (the tests time out), an index past
// an input is caught by AddressSanitizer (the driver is built with it), and a shared-memory race without a
// barrier between its two sides by ThreadSanitizer (the race build). What this cannot show is what only a
// GPU does: its memory model beyond these barriers, its scheduling, its alignment faults, its speed.
#pragma once

#include <array>
#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(threads)
#define __shared__ static
#define __restrict__ __restrict

struct dim3 {
    unsigned int x = 0, y = 0, z = 0;
};
struct uint4 {
    unsigned int x, y, z, w;
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;

namespace cuda_on_cpu {

constexpr unsigned int FULL_MASK = 0xffffffffu;

struct Block {
    explicit Block(unsigned int threads) : barrier(threads), lanes(threads / 32) {
        if (threads % 32 != 0) std::abort();
        for (unsigned int w = 0; w < threads / 32; ++w) warps.emplace_back(std::make_unique<std::barrier<>>(32));
    }
    std::barrier<> barrier;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<std::array<std::uint64_t, 32>> lanes;  // one 8-byte slot per lane, per warp
};

inline Block* block = nullptr;  // the block running now (one at a time)

inline void require_full_mask(unsigned int mask) {
    if (mask != FULL_MASK) std::abort();  // the kernel only ever exchanges across whole warps
}

// Every lane of the calling warp publishes ``value``; each gets the value of lane ``source``.
template <typename V>
V exchange(V value, unsigned int source) {
    static_assert(sizeof(V) <= 8, "one slot per lane");
    const unsigned int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    std::uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(V));
    block->lanes[warp][lane] = bits;
    block->warps[warp]->arrive_and_wait();
    const std::uint64_t theirs = block->lanes[warp][source];
    block->warps[warp]->arrive_and_wait();  // nobody overwrites a slot before every lane has read it
    V out;
    std::memcpy(&out, &theirs, sizeof(V));
    return out;
}

// ``kernel(args...)`` over ``grid`` blocks of ``threads`` threads (blocks in order, a block's threads at once).
template <typename Kernel, typename... Args>
void launch(unsigned int grid, unsigned int threads, Kernel kernel, Args... args) {
    Block running(threads);
    block = &running;
    std::vector<std::thread> pool;
    for (unsigned int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            threadIdx.x = t;
            for (unsigned int b = 0; b < grid; ++b) {
                blockIdx.x = b;
                kernel(args...);
                running.barrier.arrive_and_wait();  // the next block's statics start after this one is done
            }
        });
    }
    for (std::thread& thread : pool) thread.join();
    block = nullptr;
}

}  // namespace cuda_on_cpu

inline void __syncthreads() { cuda_on_cpu::block->barrier.arrive_and_wait(); }

template <typename V>
V __shfl_xor_sync(unsigned int mask, V value, int lane_mask) {
    cuda_on_cpu::require_full_mask(mask);
    return cuda_on_cpu::exchange(value, (threadIdx.x % 32) ^ static_cast<unsigned int>(lane_mask));
}

template <typename V>
V __shfl_up_sync(unsigned int mask, V value, unsigned int delta) {
    cuda_on_cpu::require_full_mask(mask);
    const unsigned int lane = threadIdx.x % 32;
    return cuda_on_cpu::exchange(value, lane >= delta ? lane - delta : lane);  // lanes below delta keep theirs
}

inline unsigned int __ballot_sync(unsigned int mask, bool predicate) {
    cuda_on_cpu::require_full_mask(mask);
    unsigned int bits = 0;
    for (unsigned int lane = 0; lane < 32; ++lane) {
        if (cuda_on_cpu::exchange<unsigned int>(predicate ? 1u : 0u, lane)) bits |= 1u << lane;
    }
    return bits;
}

inline int __ffs(unsigned int x) { return __builtin_ffs(static_cast<int>(x)); }

inline uint4 __ldg(const uint4* at) { return *at; }

inline float __uint_as_float(unsigned int bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

inline unsigned int __float_as_uint(float f) {
    unsigned int bits;
    std::memcpy(&bits, &f, 4);
    return bits;
}

// Built with -ffp-contract=off: a product and a difference round on their own, as the intrinsics promise.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dsub_rn(double a, double b) { return a - b; }

inline int atomicMin(int* at, int value) {
    std::atomic_ref<int> cell(*at);
    int seen = cell.load();
    while (value < seen && !cell.compare_exchange_weak(seen, value)) {
    }
    return seen;
}

inline long long atomicMax(long long* at, long long value) {
    std::atomic_ref<long long> cell(*at);
    long long seen = cell.load();
    while (value > seen && !cell.compare_exchange_weak(seen, value)) {
    }
    return seen;
}
