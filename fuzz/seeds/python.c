/* Stands for a CPython interpreter in the symbols sysprof reads: `_PyRuntime` (on 3.13 led by
 * `_Py_DebugOffsets`, whose bytes RUNTIME_BYTES gives), `PyCode_Type`, and `Py_Version` where
 * PY_VERSION_HEX is defined. */
#include <stdint.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT unsigned char _PyRuntime[1024] = { RUNTIME_BYTES };
EXPORT unsigned char PyCode_Type[64] = { 1 };
#ifdef PY_VERSION_HEX
EXPORT const uint32_t Py_Version = PY_VERSION_HEX;
#endif
