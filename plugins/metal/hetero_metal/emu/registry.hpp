// The kernels compiled into one emulator library, by name: each family's generated bindings register theirs.
#pragma once

#include <cstddef>

#include "fibers.hpp"

namespace emu {

struct KernelRecord {
    const char* name;
    KernelEntry entry;
};

struct Registrar {
    Registrar(const KernelRecord* records, std::size_t count);
};

}  // namespace emu
