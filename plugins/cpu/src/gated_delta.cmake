# Gated delta rule kernels (src/gated_delta*.cpp), included from CMakeLists.txt: the driver and bindings, and the
# per-head kernel once per ISA with its own flags (entered only after the run-time CPU check, see isa.cpp).
# src/gated_delta_phases.cpp is not built: a standalone per-phase profiler of the chunked form (build line inside).
list(APPEND HETERO_CPU_SOURCES src/gated_delta.cpp src/gated_delta_generic.cpp)
if(HETERO_ARCH MATCHES "^(x86_64|amd64|x64)$" AND NOT MSVC)
  list(APPEND HETERO_CPU_SOURCES src/gated_delta_avx2.cpp src/gated_delta_avx512.cpp)
  set_source_files_properties(src/gated_delta.cpp PROPERTIES COMPILE_DEFINITIONS HETERO_GD_X86=1)
  set_source_files_properties(src/gated_delta_avx2.cpp PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma")
  set_source_files_properties(src/gated_delta_avx512.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512dq;-mavx512vl;-mfma")
endif()
