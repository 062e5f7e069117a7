# float16 <-> float32 conversion (src/half*.cpp), included from CMakeLists.txt: the scalar rule, dispatch and
# bindings, and the SIMD bodies once per ISA with their own flags (entered only after the run-time check, half.cpp).
list(APPEND HETERO_CPU_SOURCES src/half.cpp)
if(HETERO_ARCH MATCHES "^(x86_64|amd64|x64)$" AND NOT MSVC)
  list(APPEND HETERO_CPU_SOURCES src/half_avx2.cpp src/half_avx512.cpp)
  set_source_files_properties(src/half.cpp PROPERTIES COMPILE_DEFINITIONS HETERO_HALF_X86=1)
  set_source_files_properties(src/half_avx2.cpp PROPERTIES COMPILE_OPTIONS "-mavx2;-mf16c")
  set_source_files_properties(src/half_avx512.cpp PROPERTIES COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512vl")
endif()
