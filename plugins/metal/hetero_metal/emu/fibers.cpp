// The fiber scheduler and the threadgroup memory race checker of the Metal compute emulator (see fibers.hpp).
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 700  // macOS keeps the (deprecated) ucontext routines behind it
#endif
#include "fibers.hpp"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

// Switching fibers: a few instructions that save the callee-saved registers on the current stack and load the
// other fiber's (x86-64 and arm64), instead of swapcontext, which also saves the signal mask with a system call at
// every switch. Other machines use ucontext.
#if (defined(__x86_64__) || defined(__aarch64__)) && !defined(EMU_USE_UCONTEXT)
#define EMU_OWN_SWITCH 1
#if defined(__APPLE__)
#define EMU_SYMBOL(name) "_" #name
#define EMU_HIDE(name) ".private_extern _" #name "\n"
#else
#define EMU_SYMBOL(name) #name
#define EMU_HIDE(name) ".hidden " #name "\n"
#endif
extern "C" void hetero_emu_switch(void** save_sp, void* load_sp);
#if defined(__x86_64__)
// rdi: where to save this stack pointer, rsi: the stack pointer to load. Saved: rbp rbx r12-r15 (System V).
asm(".text\n.globl " EMU_SYMBOL(hetero_emu_switch) "\n" EMU_HIDE(hetero_emu_switch)
    EMU_SYMBOL(hetero_emu_switch) ":\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n");
#else
// x0: where to save this stack pointer, x1: the stack pointer to load. Saved: x19-x30, d8-d15 (AAPCS64).
asm(".text\n.globl " EMU_SYMBOL(hetero_emu_switch) "\n" EMU_HIDE(hetero_emu_switch) ".p2align 2\n"
    EMU_SYMBOL(hetero_emu_switch) ":\n"
    "  sub sp, sp, #160\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n  stp d14, d15, [sp, #144]\n"
    "  mov x2, sp\n  str x2, [x0]\n  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #160\n  ret\n");
#endif
#endif

namespace emu {
namespace {

constexpr std::size_t kStackBytes = 128 * 1024;
constexpr int32_t kManyReaders = -2;
constexpr int32_t kNobody = -1;

enum class State { Ready, AtBarrier, AtSimdBarrier, AtCollective, Done };

struct Thread {
#if EMU_OWN_SWITCH
    void* sp = nullptr;  // its saved stack pointer while it waits
#else
    ucontext_t context;
#endif
    State state = State::Ready;
    uint32_t index = 0, lane = 0, simd = 0;
    Invocation invocation;
    Combine combine = nullptr;
    LaneCall call;
    std::size_t next_allocation = 0;  // ordinal of this thread's next TG_ARRAY
};

// The last access of one byte of threadgroup memory: by whom, in which barrier interval (epochs are unique across
// the whole dispatch, so records of an earlier group never match), and in which simdgroup_barrier interval.
struct Access {
    int32_t thread = kNobody;
    uint32_t epoch = 0;
    uint32_t simd_epoch = 0;
};

// A stack with a guard page below it: a kernel that overflows its fiber stack faults instead of corrupting memory.
class Stack {
  public:
    Stack() {
        page_ = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
        base_ = mmap(nullptr, kStackBytes + page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base_ == MAP_FAILED) throw std::bad_alloc();
        mprotect(base_, page_, PROT_NONE);
    }
    ~Stack() { munmap(base_, kStackBytes + page_); }
    Stack(const Stack&) = delete;
    Stack& operator=(const Stack&) = delete;
    void* bottom() const { return static_cast<char*>(base_) + page_; }  // the lowest usable address

  private:
    void* base_;
    std::size_t page_;
};

struct Allocation {
    std::size_t offset, bytes;
};

struct Scheduler {
    const char* kernel = "";
    KernelEntry entry = nullptr;
    void* const* buffers = nullptr;
    Dim3 groups, threads, group_id;
    DispatchOptions options;
    uint64_t rng = 0;
#if EMU_OWN_SWITCH
    void* home = nullptr;
#else
    ucontext_t home;
#endif
    std::vector<Thread> pool;
    std::vector<std::unique_ptr<Stack>> stacks;
    Thread* current = nullptr;
    // threadgroup memory of the running group
    alignas(64) unsigned char memory[kThreadgroupMemoryBytes];
    std::size_t used = 0;
    std::vector<Allocation> allocations;
    std::vector<Access> writers, readers;
    std::vector<uint32_t> simd_epochs;
    uint32_t epoch = 0, group_first_epoch = 0;
    std::string error;
    unsigned char oob_sink[64];

    uint64_t next_random() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
    }
    template <class T>
    void shuffle(std::vector<T>& items) {
        for (std::size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[next_random() % i]);
    }
    void fail(const std::string& message) {
        if (!error.empty()) return;
        char where[160];
        std::snprintf(where, sizeof where, "kernel %s, threadgroup (%u, %u, %u): ", kernel, group_id.x, group_id.y,
                      group_id.z);
        error = where + message;
    }
    std::string run();
    void run_group(Dim3 gid);
    bool resolve_simdgroups(std::size_t count);
    bool same_simd_interval(const Access& other, const Thread& t) const {
        return other.epoch == epoch &&
               (static_cast<uint32_t>(other.thread) / kSimdWidth != t.simd || other.simd_epoch == simd_epochs[t.simd]);
    }
};

Scheduler* g_scheduler = nullptr;

void fiber_main() {
    Scheduler& s = *g_scheduler;
    Thread* t = s.current;
    s.entry(t->invocation);
    t->state = State::Done;
#if EMU_OWN_SWITCH
    hetero_emu_switch(&t->sp, s.home);  // never resumed
    __builtin_unreachable();
#endif  // (ucontext: uc_link returns to the scheduler)
}

void yield(State state) {
    Scheduler& s = *g_scheduler;
    Thread* t = s.current;
    t->state = state;
#if EMU_OWN_SWITCH
    hetero_emu_switch(&t->sp, s.home);
#else
    swapcontext(&t->context, &s.home);
#endif
}

// A new fiber's stack: a saved frame whose return address is fiber_main, so the first switch to it starts there.
void start_fiber(Thread& t, void* stack_bottom, void* home) {
#if EMU_OWN_SWITCH
    (void)home;
    auto top = (reinterpret_cast<uintptr_t>(stack_bottom) + kStackBytes) & ~uintptr_t(15);
    auto* slots = reinterpret_cast<void**>(top);
#if defined(__x86_64__)
    slots[-1] = nullptr;                                      // fiber_main's (never used) return address
    slots[-2] = reinterpret_cast<void*>(&fiber_main);          // where `ret` goes
    for (int i = 3; i <= 8; ++i) slots[-i] = nullptr;          // rbp rbx r12-r15
    t.sp = &slots[-8];
#else
    void** frame = slots - 20;                                // 160 bytes: x19-x30, d8-d15
    for (int i = 0; i < 20; ++i) frame[i] = nullptr;
    frame[11] = reinterpret_cast<void*>(&fiber_main);          // x30: where `ret` goes
    t.sp = frame;
#endif
#else
    getcontext(&t.context);
    t.context.uc_stack.ss_sp = stack_bottom;
    t.context.uc_stack.ss_size = kStackBytes;
    t.context.uc_link = static_cast<ucontext_t*>(home);
    makecontext(&t.context, fiber_main, 0);
#endif
}

std::string thread_name(const Scheduler& s, uint32_t index) {
    uint32_t tx = s.threads.x, ty = s.threads.y;
    char text[96];
    std::snprintf(text, sizeof text, "thread %u (%u, %u, %u)", index, index % tx, (index / tx) % ty, index / (tx * ty));
    return text;
}

std::string Scheduler::run() {
    std::vector<Dim3> order;
    for (uint32_t z = 0; z < groups.z; ++z)
        for (uint32_t y = 0; y < groups.y; ++y)
            for (uint32_t x = 0; x < groups.x; ++x) order.push_back({x, y, z});
    shuffle(order);  // groups run in any order on a GPU: a kernel that depends on one must show it
    for (const Dim3& gid : order) {
        run_group(gid);
        if (!error.empty()) break;
    }
    return error;
}

void Scheduler::run_group(Dim3 gid) {
    group_id = gid;
    const std::size_t count = std::size_t(threads.x) * threads.y * threads.z;
    while (stacks.size() < count) stacks.push_back(std::make_unique<Stack>());
    pool.resize(count);
    simd_epochs.assign((count + kSimdWidth - 1) / kSimdWidth, 0);
    used = 0;
    allocations.clear();
    std::memset(memory, 0xFF, sizeof memory);  // NaN in every float and half: unwritten values show
    group_first_epoch = ++epoch;
    for (std::size_t i = 0; i < count; ++i) {
        Thread& t = pool[i];
        t = Thread{};
        t.index = static_cast<uint32_t>(i);
        t.lane = t.index % kSimdWidth;
        t.simd = t.index / kSimdWidth;
        const uint32_t tx = t.index % threads.x, ty = (t.index / threads.x) % threads.y,
                       tz = t.index / (threads.x * threads.y);
        auto set = [&](Builtin b, uint32_t x, uint32_t y, uint32_t z) {
            t.invocation.builtins[b][0] = x;
            t.invocation.builtins[b][1] = y;
            t.invocation.builtins[b][2] = z;
        };
        set(B_thread_position_in_grid, gid.x * threads.x + tx, gid.y * threads.y + ty, gid.z * threads.z + tz);
        set(B_threadgroup_position_in_grid, gid.x, gid.y, gid.z);
        set(B_thread_position_in_threadgroup, tx, ty, tz);
        set(B_thread_index_in_threadgroup, t.index, 0, 0);
        set(B_threads_per_threadgroup, threads.x, threads.y, threads.z);
        set(B_threadgroups_per_grid, groups.x, groups.y, groups.z);
        set(B_threads_per_grid, groups.x * threads.x, groups.y * threads.y, groups.z * threads.z);
        set(B_thread_index_in_simdgroup, t.lane, 0, 0);
        set(B_simdgroup_index_in_threadgroup, t.simd, 0, 0);
        set(B_threads_per_simdgroup, kSimdWidth, 0, 0);
        set(B_simdgroups_per_threadgroup, static_cast<uint32_t>(simd_epochs.size()), 0, 0);
        t.invocation.buffers = buffers;
        start_fiber(t, stacks[i]->bottom(), &home);
    }
    std::vector<uint32_t> order(count);
    for (std::size_t i = 0; i < count; ++i) order[i] = static_cast<uint32_t>(i);
    for (;;) {
        shuffle(order);
        for (uint32_t i : order) {
            Thread& t = pool[i];
            if (t.state != State::Ready) continue;
            current = &t;
#if EMU_OWN_SWITCH
            hetero_emu_switch(&home, t.sp);
#else
            swapcontext(&home, &t.context);
#endif
        }
        current = nullptr;
        std::size_t live = 0, at_barrier = 0;
        for (const Thread& t : pool) {
            live += t.state != State::Done;
            at_barrier += t.state == State::AtBarrier;
        }
        if (live == 0) return;
        if (resolve_simdgroups(count)) continue;
        if (!error.empty()) return;
        if (at_barrier == live) {
            if (live != count) {
                fail("threadgroup_barrier reached by " + std::to_string(live) + " threads while " +
                     std::to_string(count - live) + " threads of the group had returned (a barrier must be reached "
                     "by every thread)");
                return;
            }
            ++epoch;
            for (Thread& t : pool) t.state = State::Ready;
            continue;
        }
        fail("deadlock: threads wait at a threadgroup_barrier while others of their simdgroup wait at a simdgroup "
             "function (divergent control flow)");
        return;  // the waiting fibers are abandoned with their stacks (reused by the next group)
    }
}

// Completes the collectives and simdgroup barriers that every live lane of a simdgroup has reached.
bool Scheduler::resolve_simdgroups(std::size_t count) {
    bool progressed = false;
    for (std::size_t s = 0; s * kSimdWidth < count; ++s) {
        const std::size_t first = s * kSimdWidth, last = std::min(count, first + kSimdWidth);
        std::size_t live = 0, collectives = 0, simd_barriers = 0;
        for (std::size_t i = first; i < last; ++i) {
            State st = pool[i].state;
            live += st != State::Done;
            collectives += st == State::AtCollective;
            simd_barriers += st == State::AtSimdBarrier;
        }
        if (live == 0 || (collectives == 0 && simd_barriers == 0)) continue;
        if (collectives != live && simd_barriers != live) {
            if (collectives + simd_barriers == live) {
                fail("simdgroup " + std::to_string(s) + ": lanes wait at different simdgroup functions");
                return false;
            }
            continue;  // other lanes wait at a threadgroup barrier: a deadlock unless they are released (checked)
        }
        if (simd_barriers == live) {
            ++simd_epochs[s];
        } else {
            LaneCall lanes[kSimdWidth];
            Combine combine = nullptr;
            for (std::size_t i = first; i < last; ++i) {
                const Thread& t = pool[i];
                if (t.state != State::AtCollective) continue;
                if (combine != nullptr && combine != t.combine) {
                    fail("simdgroup " + std::to_string(s) + ": lanes call different simdgroup functions at once "
                         "(divergent control flow)");
                    return false;
                }
                combine = t.combine;
                lanes[t.lane] = t.call;
                lanes[t.lane].active = true;
            }
            if (const char* problem = combine(lanes, kSimdWidth)) {
                fail("simdgroup " + std::to_string(s) + ": " + problem);
                return false;
            }
        }
        for (std::size_t i = first; i < last; ++i)
            if (pool[i].state != State::Done) pool[i].state = State::Ready;
        progressed = true;
    }
    return progressed;
}

}  // namespace

std::string dispatch(const char* kernel_name, KernelEntry entry, void* const* buffers, Dim3 groups, Dim3 threads,
                     const DispatchOptions& options) {
    const uint64_t count = uint64_t(threads.x) * threads.y * threads.z;
    if (count == 0 || count > 1024) return "threadgroup of " + std::to_string(count) + " threads (1 to 1024)";
    if (uint64_t(groups.x) * groups.y * groups.z == 0) return "";
    auto s = std::make_unique<Scheduler>();
    s->kernel = kernel_name;
    s->entry = entry;
    s->groups = groups;
    s->threads = threads;
    s->options = options;
    s->rng = options.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (options.check_races) {
        s->writers.assign(kThreadgroupMemoryBytes, Access{});
        s->readers.assign(kThreadgroupMemoryBytes, Access{});
    }
    s->buffers = buffers;
    Scheduler* outer = g_scheduler;
    g_scheduler = s.get();
    std::string error = s->run();
    g_scheduler = outer;
    return error;
}

void threadgroup_barrier_wait() { yield(State::AtBarrier); }
void simdgroup_barrier_wait() { yield(State::AtSimdBarrier); }

void collective(Combine combine, const void* in, void* out, uint32_t arg) {
    Thread* t = g_scheduler->current;
    t->combine = combine;
    t->call = LaneCall{in, out, arg, false};
    yield(State::AtCollective);
}

uint32_t current_lane() { return g_scheduler->current->lane; }

void* threadgroup_alloc(std::size_t bytes, std::size_t align, std::size_t* capacity_out) {
    Scheduler& s = *g_scheduler;
    Thread& t = *s.current;
    const std::size_t ordinal = t.next_allocation++;
    if (ordinal < s.allocations.size()) {
        const Allocation& a = s.allocations[ordinal];
        if (a.bytes != bytes) s.fail("threads declare threadgroup array " + std::to_string(ordinal) + " with different sizes");
        *capacity_out = a.bytes;
        return s.memory + a.offset;
    }
    if (ordinal > s.allocations.size()) {
        s.fail("threadgroup arrays declared in different orders by different threads");
        *capacity_out = 0;
        return s.oob_sink;
    }
    std::size_t offset = (s.used + align - 1) / align * align;
    if (offset + bytes > kThreadgroupMemoryBytes) {
        s.fail("threadgroup memory exhausted: " + std::to_string(offset + bytes) + " bytes (at most " +
               std::to_string(kThreadgroupMemoryBytes) + ")");
        *capacity_out = 0;
        return s.oob_sink;
    }
    s.allocations.push_back({offset, bytes});
    s.used = offset + bytes;
    *capacity_out = bytes;
    return s.memory + offset;
}

void threadgroup_read(const void* address, std::size_t bytes) {
    Scheduler& s = *g_scheduler;
    if (!s.options.check_races || !s.error.empty()) return;
    const Thread& t = *s.current;
    const std::size_t offset = static_cast<const unsigned char*>(address) - s.memory;
    if (offset >= kThreadgroupMemoryBytes) return;
    for (std::size_t b = offset; b < offset + bytes; ++b) {
        const Access& w = s.writers[b];
        if (w.thread == kNobody || w.epoch < s.group_first_epoch) {
            s.fail(thread_name(s, t.index) + " reads threadgroup memory byte " + std::to_string(b) +
                   " that no thread of the group has written");
            return;
        }
        if (w.thread != int32_t(t.index) && s.same_simd_interval(w, t)) {
            s.fail("race in threadgroup memory: " + thread_name(s, t.index) + " reads byte " + std::to_string(b) +
                   " written by " + thread_name(s, uint32_t(w.thread)) + " since the last barrier");
            return;
        }
        Access& r = s.readers[b];
        if (r.epoch == s.epoch && r.thread != int32_t(t.index) && r.thread != kNobody)
            r.thread = kManyReaders;
        else if (r.thread != kManyReaders || r.epoch != s.epoch)
            r = Access{int32_t(t.index), s.epoch, s.simd_epochs[t.simd]};
    }
}

void threadgroup_write(const void* address, std::size_t bytes) {
    Scheduler& s = *g_scheduler;
    if (!s.options.check_races || !s.error.empty()) return;
    const Thread& t = *s.current;
    const std::size_t offset = static_cast<const unsigned char*>(address) - s.memory;
    if (offset >= kThreadgroupMemoryBytes) return;
    for (std::size_t b = offset; b < offset + bytes; ++b) {
        Access& w = s.writers[b];
        if (w.thread != kNobody && w.thread != int32_t(t.index) && s.same_simd_interval(w, t)) {
            s.fail("race in threadgroup memory: " + thread_name(s, t.index) + " and " +
                   thread_name(s, uint32_t(w.thread)) + " both write byte " + std::to_string(b) +
                   " between two barriers");
            return;
        }
        const Access& r = s.readers[b];
        if (r.epoch == s.epoch &&
            (r.thread == kManyReaders || (r.thread != int32_t(t.index) && r.thread != kNobody &&
                                          s.same_simd_interval(r, t)))) {
            s.fail("race in threadgroup memory: " + thread_name(s, t.index) + " writes byte " + std::to_string(b) +
                   " that " + (r.thread == kManyReaders ? std::string("other threads") : thread_name(s, uint32_t(r.thread))) +
                   " read since the last barrier");
            return;
        }
        w = Access{int32_t(t.index), s.epoch, s.simd_epochs[t.simd]};
    }
}

void* report_out_of_bounds(const char* what, long index, std::size_t count) {
    Scheduler& s = *g_scheduler;
    s.fail(thread_name(s, s.current->index) + " indexes " + what + " at " + std::to_string(index) + " (it holds " +
           std::to_string(count) + " elements)");
    return s.oob_sink;
}

}  // namespace emu
