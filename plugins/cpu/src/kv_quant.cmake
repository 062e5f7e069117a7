# Rotated low-bit KV cache (src/kv_quant*.cpp), included from CMakeLists.txt: the formats, quantizer and portable
# decoder, and the decoder once per ISA with its own flags (entered only after the run-time CPU check, see isa.cpp).
list(APPEND HETERO_CPU_SOURCES src/kv_quant.cpp)
if(HETERO_ARCH MATCHES "^(x86_64|amd64|x64)$" AND NOT MSVC)
  list(APPEND HETERO_CPU_SOURCES src/kv_quant_avx2.cpp src/kv_quant_avx512.cpp)
  set_source_files_properties(src/kv_quant.cpp PROPERTIES COMPILE_DEFINITIONS HETERO_KVQ_X86=1)
  set_source_files_properties(src/kv_quant_avx2.cpp PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma")
  set_source_files_properties(src/kv_quant_avx512.cpp PROPERTIES
    COMPILE_OPTIONS "-mavx512f;-mavx512bw;-mavx512dq;-mavx512vl;-mfma")
endif()
