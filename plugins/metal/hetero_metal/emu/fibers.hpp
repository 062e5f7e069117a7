// The emulator's execution model: one dispatch runs its threadgroups one after another; inside a threadgroup every
// thread is a fiber (its own stack, ucontext) that runs until it reaches a synchronisation point — a
// threadgroup_barrier, a simdgroup_barrier or a simdgroup collective (simd_sum, simd_shuffle, simdgroup_load...) —
// and yields to the scheduler. The scheduler resumes the threads in a seeded random order, completes a collective
// once every live lane of its simdgroup has reached it (the 32 lanes meet in lockstep there), and releases a barrier
// once every thread of the group has reached it. Threadgroup memory is allocated per group, filled with NaN bytes,
// and every access to it is checked for races against the accesses of other threads since the last barrier.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace emu {

constexpr int kSimdWidth = 32;
constexpr std::size_t kThreadgroupMemoryBytes = 32 * 1024;  // Apple GPUs' threadgroup memory per group

struct Dim3 {
    uint32_t x = 1, y = 1, z = 1;
};

// The values of the built-in kernel arguments ([[thread_position_in_grid]] ...) of one thread, as uint3.
enum Builtin : int {
    B_thread_position_in_grid,
    B_threadgroup_position_in_grid,
    B_thread_position_in_threadgroup,
    B_thread_index_in_threadgroup,
    B_threads_per_threadgroup,
    B_threadgroups_per_grid,
    B_threads_per_grid,
    B_thread_index_in_simdgroup,
    B_simdgroup_index_in_threadgroup,
    B_threads_per_simdgroup,
    B_simdgroups_per_threadgroup,
    B_count
};

// One lane's part in a simdgroup collective: where its input and output live (on its fiber stack, valid while it
// waits) and its own argument (a shuffle's source lane, a delta).
struct LaneCall {
    const void* in = nullptr;
    void* out = nullptr;
    uint32_t arg = 0;
    bool active = false;
};
// Completes one collective for a whole simdgroup: lanes[kSimdWidth], inactive ones flagged. Returns an error text
// (arguments that must be uniform were not) or nullptr.
using Combine = const char* (*)(LaneCall* lanes, int width);

struct Invocation;
using KernelEntry = void (*)(const Invocation&);

// The arguments one dispatch binds: buffer index -> address (device and constant buffers alike).
constexpr int kMaxBuffers = 31;  // Metal's buffer argument table
struct Invocation {
    void* const* buffers = nullptr;
    uint32_t builtins[B_count][3] = {};
};

struct DispatchOptions {
    uint64_t seed = 0;         // scheduling order of threads within a group (and order of groups)
    bool check_races = true;   // threadgroup memory race checker
};

// Runs `entry` over `groups` threadgroups of `threads` threads. Returns "" or the first error found (a race, a
// divergent barrier or collective, a deadlock, threadgroup memory exhausted or indexed out of bounds).
std::string dispatch(const char* kernel_name, KernelEntry entry, void* const* buffers, Dim3 groups, Dim3 threads,
                     const DispatchOptions& options);

// -- called from kernel code (through the MSL shim) ----------------------------------------------------------------
void threadgroup_barrier_wait();
void simdgroup_barrier_wait();
// Waits until every live lane of the simdgroup calls a collective, then runs `combine` once for all of them.
void collective(Combine combine, const void* in, void* out, uint32_t arg);
// The threadgroup array this thread's `ordinal`-th TG_ARRAY declaration names (allocated by the first thread).
void* threadgroup_alloc(std::size_t bytes, std::size_t align, std::size_t* capacity_out);
// Race bookkeeping for `bytes` bytes at `address` inside threadgroup memory.
void threadgroup_read(const void* address, std::size_t bytes);
void threadgroup_write(const void* address, std::size_t bytes);
// Reports an error found by kernel-side checks (an index past a threadgroup array) and returns a safe scratch slot.
void* report_out_of_bounds(const char* what, long index, std::size_t count);
// This thread's lane and whether the lane `lane` of its simdgroup is live (for the simdgroup_matrix distribution).
uint32_t current_lane();

}  // namespace emu
