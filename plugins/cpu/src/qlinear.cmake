# int8 kernels of the quantized ONNX ops (src/qlinear*.cpp), included from CMakeLists.txt: the drivers and bindings,
# and the kernels once per ISA with its own flags (entered only after the run-time CPU check, see qlinear.cpp).
# No contraction: the float output stages multiply, then add, as the unfused ops do.
list(APPEND HETERO_CPU_SOURCES src/qlinear.cpp src/qlinear_generic.cpp src/qlinear_amx.cpp)
set_source_files_properties(src/qlinear.cpp src/qlinear_generic.cpp PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
if(HETERO_ARCH MATCHES "^(x86_64|amd64|x64)$" AND NOT MSVC)
  list(APPEND HETERO_CPU_SOURCES src/qlinear_avx2.cpp src/qlinear_avx512vnni.cpp)
  set_source_files_properties(src/qlinear.cpp PROPERTIES COMPILE_DEFINITIONS HETERO_QLIN_X86=1)
  set_source_files_properties(src/qlinear_avx2.cpp PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-ffp-contract=off")
  set_source_files_properties(src/qlinear_avx512vnni.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512dq;-mavx512vl;-mavx512vnni;-mfma;-ffp-contract=off")
  # AMX-INT8 (GCC 11+ / Clang 12+, Linux: the tile state is granted per process by arch_prctl)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag("-mamx-tile -mamx-int8" HETERO_HAS_AMX_FLAGS)
  if(HETERO_HAS_AMX_FLAGS AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
    set_source_files_properties(src/qlinear_amx.cpp PROPERTIES COMPILE_OPTIONS "-mamx-tile;-mamx-int8"
      COMPILE_DEFINITIONS HETERO_QLIN_AMX=1)
  endif()
endif()
