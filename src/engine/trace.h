/* Trace recorder (docs/tracing.md): one fixed-capacity event buffer per
 * Worker, filled by the orchestrator, the worker threads (PROCESS mode: the
 * scheduler) and nothing else,
 * written out as Chrome trace-event JSON when the trace stops.
 *
 * Recording never waits: a writer claims a slot with one fetch_add and
 * drops the event (counting it) when the buffer is full. The hooks in the
 * engine are one line each behind pto_trace_on(), a pointer load and a
 * flag load, so a Worker that is not tracing pays two loads per task. */
#ifndef PTO_TRACE_H
#define PTO_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pto_slot;
struct pto_worker_thread;

enum { PTO_TEV_TASK = 0, PTO_TEV_SUBMIT, PTO_TEV_EDGE, PTO_TEV_STALL, PTO_TEV_RUN };
enum { PTO_TEV_OK = 0, PTO_TEV_FAILED = 1 };

typedef struct pto_trace_event {
    uint64_t t0, t1;             /* CLOCK_MONOTONIC ns; t1 == t0 for EDGE */
    int64_t id;                  /* task id (consumer for EDGE) */
    int64_t arg;                 /* EDGE: producer id; SUBMIT: producers; STALL: bytes */
    uint64_t callable;
    int32_t run;
    int16_t index;               /* TASK: worker index */
    int16_t member;              /* TASK: group member */
    uint8_t type;
    int8_t kind;                 /* pto_worker_kind of the task */
    uint8_t status;              /* TASK: PTO_TEV_OK / FAILED */
    int8_t ring;                 /* STALL */
    int32_t submitted_run;       /* TASK, SUBMIT: its submitted run's id (run.h), 0 in a blocking run */
} pto_trace_event;

typedef struct pto_trace {
    _Atomic bool enabled;
    /* Writers inside a record; stop waits for zero before it reads. */
    _Alignas(64) _Atomic int32_t active;
    _Atomic uint64_t next;       /* slots claimed, dropped ones included */
    _Alignas(64) pto_trace_event *buf;
    uint32_t cap;
    _Atomic int32_t run;         /* the Worker's current run number */
    uint64_t run_t0;             /* orchestrator only: start of the open run */
    int64_t recorded, dropped;   /* of the last stop */
    char *json;                  /* pto_trace_format's cached output */
    size_t json_len;
    int32_t json_pid;
    char *json_name;
    char *extra;                 /* events attached from other processes (pto_trace_attach) */
    size_t extra_len;
} pto_trace;

/* The hooks' guard: the trace in *slot if it is recording, else NULL. */
static inline pto_trace *pto_trace_on(pto_trace *_Atomic *slot)
{
    pto_trace *t = atomic_load_explicit(slot, memory_order_acquire);
    return t && atomic_load_explicit(&t->enabled, memory_order_relaxed) ? t : NULL;
}

/* Worker thread (PROCESS mode: the scheduler, for the child): member of s
 * ran on wt from t0 until t1; status != 0 if it failed. */
void pto_trace_task(pto_trace *t, const struct pto_worker_thread *wt, const struct pto_slot *s, int32_t member,
                    uint64_t t0, uint64_t t1, int status);
/* Orchestrator: s was submitted from t0 until now; also records its producer edges. */
void pto_trace_submit(pto_trace *t, const struct pto_slot *s, uint64_t t0);
/* Orchestrator: waited for bytes of heap ring from t0 to t1. */
void pto_trace_stall(pto_trace *t, int32_t ring, uint64_t bytes, uint64_t t0, uint64_t t1);
/* Orchestrator: a run opens / has drained. */
void pto_trace_run_begin(pto_trace *t);
void pto_trace_run_end(pto_trace *t);
/* Free a trace (the Worker is being destroyed; no thread records any more). */
void pto_trace_free(pto_trace *t);

#endif
