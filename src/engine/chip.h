/* The engine's view of the chip-kernel table beyond pto.h: what a chip
 * process needs to resolve a callable on its own. */
#ifndef PTO_CHIP_H
#define PTO_CHIP_H

#include <stdint.h>
#include "pto.h"

/* Number of registered kernels; their ids are 0 .. n-1. */
uint32_t pto_kernel_count(void);

/* The library path (as dlopened: absolute when it named a file) and symbol
 * behind callable id, so a forked child can dlopen/dlsym it itself. The
 * strings live as long as the process. 0, or -1 if id is not registered. */
int pto_kernel_describe(uint64_t id, const char **lib, const char **symbol);

#endif
