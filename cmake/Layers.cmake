# The library's layers, lowest first. Each folder is an object library of its
# own that declares the layers under it; libasgd.a (asgd_lib) is all of their
# objects together.
#
#   base -> compute -> dataset -> policies -> messaging -> actors -> runtime -> experiments
#
# A layer sees its own folder and, through the layers it links, the folders
# under it, and nothing else: each layer's include path is a folder in the
# build tree holding one link, to its own source folder. So an include that
# runs back up the layers ("runtime/job_internal.hpp" from actors/) is "No
# such file or directory" at compile time. The public headers (include/asgd/)
# are every layer's. tests/layering checks that a back edge fails to compile,
# and that no layer's objects call a function only a layer above defines.

set(ASGD_LAYER_ROOT ${CMAKE_BINARY_DIR}/layers)

# asgd_unity(TARGET BATCH): with ASGD_UNITY_BUILD, TARGET's files are compiled
# BATCH at a time. Most of a file's compile time goes to the code of the
# headers it shares with its neighbours (CAF, CLI11, spdlog), which a batch
# compiles once: a cold `scripts/build asgd` takes about 2/3 of the time.
function(asgd_unity target batch)
  if(ASGD_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${batch})
  endif()
endfunction()

# asgd_layer(NAME [DEPENDS lower layers...]): the target asgd_NAME for the
# folder NAME, whose sources the folder's CMakeLists.txt adds.
function(asgd_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "DEPENDS")
  set(target asgd_${name})
  add_library(${target} OBJECT)
  set(view ${ASGD_LAYER_ROOT}/${name})
  file(MAKE_DIRECTORY ${view})
  file(CREATE_LINK ${CMAKE_SOURCE_DIR}/${name} ${view}/${name} SYMBOLIC)
  target_include_directories(${target} PUBLIC ${view} ${CMAKE_SOURCE_DIR}/include)
  target_include_directories(${target} SYSTEM PUBLIC ${ASGD_CBLAS_INCLUDE_DIR})
  # We never read errno after math calls; without it sqrt vectorises (adagrad
  # and adam shard updates ran 2.5x faster).
  target_compile_options(${target} PRIVATE ${ASGD_WARNINGS} -fno-math-errno)
  asgd_unity(${target} 6)
  list(TRANSFORM arg_DEPENDS PREPEND asgd_ OUTPUT_VARIABLE lower)
  target_link_libraries(${target} PUBLIC ${lower} ${ASGD_LINK_DEPS})
  set_property(GLOBAL APPEND PROPERTY ASGD_LAYERS ${name})
  # libasgd.a holds every layer's objects.
  target_sources(asgd_lib PRIVATE $<TARGET_OBJECTS:${target}>)
endfunction()
