# The libFuzzer harnesses (KILN_FUZZ=ON, clang): included by cmake/sanitizers.cmake once the
# top-level CMakeLists.txt has defined libkiln. scripts/fuzz.sh builds and runs them;
# tests/fuzz/README.md says how.
foreach(_name fuzz_onnx_import fuzz_engine_load fuzz_build)
  add_executable(${_name} ${CMAKE_CURRENT_LIST_DIR}/${_name}.cpp)
  target_link_libraries(${_name} PRIVATE kiln_internal)
  target_link_options(${_name} PRIVATE -fsanitize=fuzzer)
  set_target_properties(${_name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/fuzz)
endforeach()
# kiln serve's request decoding (REST and gRPC), over the server core library.
if(TARGET kiln_serve)
  add_executable(fuzz_serve_requests ${CMAKE_CURRENT_LIST_DIR}/fuzz_serve_requests.cpp)
  target_link_libraries(fuzz_serve_requests PRIVATE kiln_serve)
  target_link_options(fuzz_serve_requests PRIVATE -fsanitize=fuzzer)
  set_target_properties(fuzz_serve_requests PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/fuzz)
endif()
