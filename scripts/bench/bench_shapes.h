/* bench_shapes.h - the submit loops of pto_bench's four DAG shapes on the
 * no-op chip kernel, shared by pto_bench_lua_c (its own Worker, one process
 * per mode) and the pto_bench_c Lua module (the same loops inside a Lua
 * run's orchestration function: scripts/bench_lua.lua's C rows). Each
 * submits one run's tasks into an open orchestrator and returns their
 * count, or -1 with pto_errmsg() set. */
#ifndef PTO_BENCH_SHAPES_H
#define PTO_BENCH_SHAPES_H

#include <stddef.h>
#include <stdint.h>

#include "bench.h"   /* BENCH_SLOT_ELEMS, BENCH_FAN: pto_bench's sizes */
#include "pto.h"

/* Slot i of a shapes table is a tensor of its own: BENCH_SLOT_ELEMS f32 at
 * slots + i * BENCH_SLOT_ELEMS (the engine's TensorMap keeps the writers of
 * one base in one list, so views of one base would time that list's scans
 * instead of the submit path). */
typedef struct bench_shapes {
    float *slots;
    uint64_t noop;   /* the kernel every task runs */
} bench_shapes;

/* W1: n independent tasks, each writing a slot of its own. */
long bench_w1(pto_orch *o, const bench_shapes *b, int n);
/* W2: a chain of n tasks on one slot (INOUT). */
long bench_w2(pto_orch *o, const bench_shapes *b, int n);
/* W3: fans 1 -> BENCH_FAN -> 1 until n tasks. */
long bench_w3(pto_orch *o, const bench_shapes *b, int n);
/* W4: one run of BGEMM d^4, a scope per C tile; per k a gemm (A, B in,
 * an automatic P out) and an add of P into C. */
long bench_w4(pto_orch *o, const bench_shapes *b, int d);

#endif
