# Extract the part of pto.h between "/* ffi-begin */" and "/* ffi-end */"
# into a header LuaJIT's ffi.cdef reads verbatim.
file(READ ${IN} text)
string(FIND "${text}" "/* ffi-begin */" b)
string(FIND "${text}" "/* ffi-end */" e)
if(b LESS 0 OR e LESS 0)
  message(FATAL_ERROR "pto.h lacks the ffi-begin/ffi-end markers")
endif()
math(EXPR b "${b} + 15")
math(EXPR n "${e} - ${b}")
string(SUBSTRING "${text}" ${b} ${n} body)
file(WRITE ${OUT} "/* pto_ffi.h - generated from pto.h for LuaJIT's ffi.cdef: plain declarations only. */\n${body}")
