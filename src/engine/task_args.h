/* Tensor descriptors and the args blob, the only wire form of a task's
 * arguments: [i32 T][i32 S][pto_tensor x T][u64 x S]. */
#ifndef PTO_TASK_ARGS_H
#define PTO_TASK_ARGS_H

#include <stdbool.h>
#include "pto.h"

/* Checks dtype, ndims and shape of t; on error sets pto_errmsg with who as prefix. */
bool pto_tensor_check(const pto_tensor *t, int index);

#endif
