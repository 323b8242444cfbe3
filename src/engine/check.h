/* Check mode (docs/check.md): run each task under checks that compare what
 * it does with how its arguments are tagged, and find OUTPUTs that a later
 * OUTPUT overwrites with no ordering between them.
 *
 * Two halves, each called through one hook at a shared site:
 *   - pto_check_call, where a task executes (serve() in the child in
 *     PROCESS mode, the worker thread's call in THREAD mode): the double
 *     run with two fill patterns and the INPUT snapshot;
 *   - pto_check_submit / pto_check_record, in the orchestrator's submit,
 *     only while the run has check mode on (o->check != NULL). */
#ifndef PTO_CHECK_H
#define PTO_CHECK_H

#include <stdbool.h>
#include <stdint.h>
#include "pto.h"

struct pto_orch;
struct pto_slot;
struct pto_mailbox;
struct pto_worker_manager;

/* Tags travel to the child beside the args blob: a task with more tensors
 * than this runs unchecked (no mailbox can carry that many anyway). */
#define PTO_CHECK_MAX_TAGS 8192

/* Run fn like a leaf, under the checks for args tagged tags. Returns the
 * leaf's result, or non-zero with a "check: ..." reason in err when the task
 * read an OUTPUT, wrote an INPUT or (mb != NULL: PROCESS mode, in the child
 * serving mb) wrote a page of shared tensor memory or of a heap ring that
 * holds none of its writable arguments. On success err may hold warnings
 * (incomplete OUTPUT, non-determinism): "" when there are none. */
int pto_check_call(pto_leaf_fn fn, void *ctx, uint64_t callable, const pto_args_view *args, const uint8_t *tags,
                   const pto_call_config *cfg, char *err, size_t errlen, const struct pto_mailbox *mb, bool warn);
/* warn (check = "warn"): a finding that fails the task (a read OUTPUT, a written INPUT, a write
 * outside the arguments) is returned as a "check: warning: ..." on success instead, after the task
 * ran once more from its real inputs (so it leaves what an unchecked run would). */

/* pto_check_call as a leaf of its own, so that another wrapper (diag.c's) can go around it:
 * ctx is a pto_check_leaf. */
typedef struct pto_check_leaf {
    pto_leaf_fn fn;
    void *ctx;
    const uint8_t *tags;
    const struct pto_mailbox *mb;
    bool warn;
} pto_check_leaf;
int pto_check_leaf_run(void *ctx, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg, char *err,
                       size_t errlen);

/* The tags to check slot s's member by, or NULL (run unchecked): a group's members may share an
 * OUTPUT, each writing its part while another's double run would fill all of it. */
const uint8_t *pto_check_tags_of(const struct pto_slot *s);

/* At run begin: check mode (0, PTO_CHECK_ON or PTO_CHECK_WARN) for the run about to open. */
void pto_check_run_begin(struct pto_orch *o, struct pto_worker_manager *wm, int32_t mode);

/* PROCESS mode, parent, before a post: mark mb's next task as checked (if wm's run is) with its n
 * tags and the heap rings, or not. */
void pto_check_stage(struct pto_mailbox *mb, const struct pto_worker_manager *wm, const uint8_t *tags, int32_t n);
/* PROCESS mode, child: the staged tags if they match args (else NULL: the task runs unchecked). */
const uint8_t *pto_check_tags(const struct pto_mailbox *mb, const pto_args_view *args);

/* The per-run log behind pto_check_submit (opaque): the run's accesses and its DAG by task id. */
typedef struct pto_check_log pto_check_log;
pto_check_log *pto_check_log_new(void);
void pto_check_log_free(pto_check_log *lg);
/* Forget every access and task (a run begins). */
void pto_check_log_clear(pto_check_log *lg);

/* Before the submit takes its references: false, with pto_errmsg naming both tasks, if one of the
 * n members' OUTPUT / OUTPUT_EXISTING tensors overlaps bytes an earlier task of the run reads or
 * writes and that task is not among the new task's producers (as its tags imply them), directly or
 * through theirs, whether or not it has finished. Collects those producers for pto_check_record. */
bool pto_check_submit(struct pto_orch *o, int32_t kind, uint64_t callable, const pto_task_args *args, int32_t n,
                      int64_t id);
/* After the submit built slot s: remember its accesses and producers for later submits. */
void pto_check_record(struct pto_orch *o, struct pto_slot *s);
/* Heap-ring bytes [lo, lo + bytes) were just allocated: what earlier tasks did there is over. */
void pto_check_fresh(struct pto_orch *o, uint64_t lo, uint64_t bytes);
/* The orchestration saw its finished tasks finish (a drain): they are ordered before what follows. */
void pto_check_observed_orch(struct pto_orch *o);

#endif
