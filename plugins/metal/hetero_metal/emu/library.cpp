// The emulator library's C interface (loaded with ctypes by hetero_metal.emulator): the compiled kernels by name,
// and one call that dispatches a grid of threadgroups over the given buffers.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fibers.hpp"
#include "registry.hpp"

namespace emu {
namespace {
std::vector<KernelRecord>& registry() {
    static std::vector<KernelRecord> records;
    return records;
}
}  // namespace

Registrar::Registrar(const KernelRecord* records, std::size_t count) {
    registry().insert(registry().end(), records, records + count);
}
}  // namespace emu

extern "C" {

__attribute__((visibility("default"))) int hetero_msl_kernel_count() { return int(emu::registry().size()); }

__attribute__((visibility("default"))) const char* hetero_msl_kernel_name(int i) {
    return i >= 0 && i < int(emu::registry().size()) ? emu::registry()[std::size_t(i)].name : nullptr;
}

// Returns 0 when the dispatch ran clean, 1 with `error` filled when the emulator found a fault, 2 for an unknown
// kernel.
__attribute__((visibility("default"))) int hetero_msl_dispatch(const char* kernel, void* const* buffers,
                                                              const uint32_t* groups, const uint32_t* threads,
                                                              uint64_t seed, int check_races, char* error,
                                                              std::size_t error_bytes) {
    for (const emu::KernelRecord& record : emu::registry()) {
        if (std::strcmp(record.name, kernel) != 0) continue;
        emu::DispatchOptions options;
        options.seed = seed;
        options.check_races = check_races != 0;
        const std::string message = emu::dispatch(record.name, record.entry, buffers, {groups[0], groups[1], groups[2]},
                                                  {threads[0], threads[1], threads[2]}, options);
        if (message.empty()) return 0;
        std::snprintf(error, error_bytes, "%s", message.c_str());
        return 1;
    }
    std::snprintf(error, error_bytes, "no kernel %s in this library", kernel);
    return 2;
}
}
