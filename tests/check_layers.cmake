# Fails when a layer depends on a layer above it (docs/architecture.md), in either of two ways:
#  1. its objects use an lfce symbol that only a higher layer defines: functions, data, and the
#     compiler-made symbols a plain link can leave unnoticed — vtables (_ZTV), typeinfo (_ZTI) and
#     its name (_ZTS), function-local statics (_ZZ) and their guards (_ZGV), thread-locals (_ZTH,
#     _ZTW);
#  2. one of its sources includes a header of a higher layer ("autotune/..." from runtime/), which
#     may use nothing that leaves a symbol (a type, an inline function, a constant) yet is a
#     dependency all the same; the public C header "lfce/lfce.h" counts as the api layer's, so the
#     layers below api speak their own types, never the C ABI.
# Usage: cmake -DNM=nm -DLAYERS="<archive of the lowest layer>;...;<archive of the highest>"
#              -DLAYER_DIRS="<source folder of the lowest layer>;...;<of the highest>" -P check_layers.cmake
# Static libraries alone do not catch (1): the linker resolves a back-edge silently whenever the
# higher layer's object is pulled in anyway.

# Any mangled lfce symbol: _Z, an optional special-name prefix (TV, TI, TS, GV, Z, TH, TW, ...),
# then the nested name lfce::... (N, optional cv-qualifier K) or a plain lfce:: name.
set(lfce_symbol "_Z[A-Z]*N?K?4lfce[^ \n]*")

set(defined "")
foreach(archive IN LISTS LAYERS)
  execute_process(COMMAND ${NM} -g --defined-only --format=posix ${archive} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${archive}")
  endif()
  # Weak and local-linkage symbols (vtables, typeinfo, guards of inline functions) are defined in
  # every object that emits them: count what any object of this layer defines, global or not.
  execute_process(COMMAND ${NM} --defined-only --format=posix ${archive} OUTPUT_VARIABLE all_defined)
  string(REGEX MATCHALL "(^|\n)${lfce_symbol}" syms "${out}\n${all_defined}")
  foreach(s IN LISTS syms)
    string(STRIP "${s}" s)
    list(APPEND defined "${s}")
  endforeach()
  execute_process(COMMAND ${NM} -u --format=posix ${archive} OUTPUT_VARIABLE out)
  string(REGEX MATCHALL "(^|\n)${lfce_symbol}" used "${out}")
  list(REMOVE_DUPLICATES defined)
  foreach(s IN LISTS used)
    string(STRIP "${s}" s)
    list(FIND defined "${s}" at)
    if(at EQUAL -1)
      get_filename_component(name ${archive} NAME)
      message(SEND_ERROR "${name} uses ${s}, which no layer at or below it defines (a back-edge)")
      set(failed TRUE)
    endif()
  endforeach()
endforeach()

# (2) The includes: each layer's sources may include their own layer's headers and those of the
# layers listed before it, never a later one's.
set(later "")
foreach(dir IN LISTS LAYER_DIRS)
  get_filename_component(layer ${dir} NAME)
  list(APPEND later ${layer})
endforeach()
foreach(dir IN LISTS LAYER_DIRS)
  get_filename_component(layer ${dir} NAME)
  list(REMOVE_ITEM later ${layer})
  file(GLOB sources ${dir}/*.h ${dir}/*.cpp ${dir}/*.def ${dir}/*.inc)
  foreach(source IN LISTS sources)
    file(STRINGS ${source} includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"/]*)/.*" "\\1" top "${line}")
      if(top STREQUAL "lfce")  # the public C header (include/lfce/) is the api layer's
        set(top api)
      endif()
      list(FIND later "${top}" at)
      if(NOT at EQUAL -1)
        get_filename_component(name ${source} NAME)
        string(STRIP "${line}" line)
        message(SEND_ERROR "${layer}/${name} includes a header of the higher layer ${top} (${line}): a back-edge")
        set(failed TRUE)
      endif()
    endforeach()
  endforeach()
endforeach()

if(failed)
  message(FATAL_ERROR "layering violated (docs/architecture.md)")
endif()
message(STATUS "layers ok: no symbol used below the layer that defines it, no header included from above")
