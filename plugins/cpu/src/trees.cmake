# ai.onnx.ml tree ensembles (src/trees*.cpp), included from CMakeLists.txt: the forest and its scalar walks, and the
# AVX-512 gather walk with its own flags (entered only after the run-time CPU check, see isa.cpp).
list(APPEND HETERO_CPU_SOURCES src/trees.cpp)
if(HETERO_ARCH MATCHES "^(x86_64|amd64|x64)$" AND NOT MSVC)
  list(APPEND HETERO_CPU_SOURCES src/trees_avx512.cpp)
  set_source_files_properties(src/trees.cpp PROPERTIES COMPILE_DEFINITIONS HETERO_TREES_X86=1)
  set_source_files_properties(src/trees_avx512.cpp PROPERTIES COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512dq;-mavx512vl")
endif()
