// Run-time ISA selection: the best table the CPU supports, overridable with set_isa() (tests, benchmarks) or
// the HETERO_CPU_ISA environment variable.
#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.hpp"

namespace hetero {
namespace {

bool cpu_has_avx2() {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// Best first.
std::vector<const Kernels*> detect() {
  std::vector<const Kernels*> v;
  if (kernels_avx512() && cpu_has_avx512()) v.push_back(kernels_avx512());
  if (kernels_avx2() && cpu_has_avx2()) v.push_back(kernels_avx2());
  if (kernels_neon()) v.push_back(kernels_neon());  // baseline on aarch64
  v.push_back(kernels_generic());
  return v;
}

const std::vector<const Kernels*>& supported() {
  static const std::vector<const Kernels*> v = detect();
  return v;
}

std::atomic<const Kernels*>& current() {
  static std::atomic<const Kernels*> cur{[] {
    const Kernels* k = supported().front();
    if (const char* env = std::getenv("HETERO_CPU_ISA")) {
      for (const Kernels* c : supported())
        if (std::string(env) == c->name) k = c;
    }
    return k;
  }()};
  return cur;
}

}  // namespace

const Kernels& active() { return *current().load(std::memory_order_acquire); }
std::string isa_name() { return active().name; }

std::vector<std::string> available_isas() {
  std::vector<std::string> names;
  for (const Kernels* k : supported()) names.emplace_back(k->name);
  return names;
}

const Kernels* kernels_by_name(const std::string& name) {
  for (const Kernels* k : supported())
    if (name == k->name) return k;
  return nullptr;
}

void set_isa(const std::string& name) {
  const Kernels* k = kernels_by_name(name);
  if (!k) {
    std::string msg = "set_isa: '" + name + "' is not available on this CPU; available:";
    for (const auto& n : available_isas()) msg += " " + n;
    throw std::invalid_argument(msg);
  }
  current().store(k, std::memory_order_release);
}

}  // namespace hetero
