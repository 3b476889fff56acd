# Sanitizer and fuzzing builds (tests/fuzz/README.md; scripts/fuzz.sh makes both in one tree).
#   KILN_SANITIZE=ON: every target (libkiln, the CLI, the unit tests) with AddressSanitizer and
#                     UndefinedBehaviorSanitizer; any report aborts the program.
#   KILN_FUZZ=ON:     also the libFuzzer harnesses of tests/fuzz; clang only. Implies
#                     KILN_SANITIZE and adds libFuzzer's coverage instrumentation to everything
#                     (harmless in the other programs: the ASan runtime provides no-op hooks).
# Both are meant for a KILN_CUDA=OFF tree: host code and the CPU backend.
option(KILN_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(KILN_FUZZ "Build the libFuzzer harnesses in tests/fuzz (clang; implies KILN_SANITIZE)" OFF)
if(KILN_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KILN_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++")
  endif()
  set(KILN_SANITIZE ON CACHE BOOL "" FORCE)
  add_compile_options(-fsanitize=fuzzer-no-link)
  # The harnesses link libkiln: defined once the top-level CMakeLists.txt has defined it.
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL include
                 ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzzers.cmake)
endif()
if(KILN_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
  message(STATUS "kiln: AddressSanitizer and UndefinedBehaviorSanitizer on (KILN_FUZZ=${KILN_FUZZ})")
endif()
