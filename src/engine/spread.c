/* spread.c - PROCESS mode: where the children run. The kernel places them;
 * the turn's holder (sched_turns.c) only corrects one placement the kernel
 * keeps for good, below, by moving a child once (pto_proc_nudge: the
 * child's own CPU mask is given back at once). */
#include "worker_manager.h"
#include "common.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

bool pto_wm_spread_from_env(pto_worker_manager *wm)
{
    const char *env = getenv("PTO_SPREAD");
    wm->spread = !env || !*env || strcmp(env, "1") == 0;
    if (wm->spread || strcmp(env, "0") == 0) return true;
    /* As PTO_EARLY_POSTS: a typo must not quietly leave it on. */
    pto_set_error("PTO_SPREAD must be 0 (children never moved) or 1 (moved when two share a core, the default) "
                  "(got '%s')", env);
    return false;
}

/* Three busy parties on two cores (two children and the parent thread
 * that waits for them) sit two to a core either way the kernel places
 * them, and its balancer moves none of them: each placement is as even as
 * the other. With the children on separate cores, the waiter's yields
 * hand its core to the child sharing it; with both children on one core
 * and the waiter alone on the other, they run by turns while it spins. A
 * 2 us stencil fell into the second placement in about half its runs
 * (33-37% efficient, the waiter ~95% of a core, each child 46% of one,
 * against 46-52%); moving a child next to the waiter when it sees that
 * made the median of 16 runs 40-43% instead of 33-40% (7 alternating
 * batches). Only where no core is spare: with one free, the kernel places
 * a crowded child there itself. */
void pto_wm_spread(pto_worker_manager *wm)
{
    enum { MAXCPU = 64 };
    if (wm->mode != PTO_MODE_PROCESS || !wm->spread) return;
    int me = sched_getcpu();
    if (me < 0 || me >= MAXCPU) return;
    int32_t on[MAXCPU] = {0}, busy = 0;
    pto_child *crowded = NULL;
    for (int32_t kind = 0; kind < PTO_KINDS; kind++)
        for (int32_t i = 0; i < wm->count[kind]; i++) {
            pto_child *c = wm->threads[kind][i]->child;
            int32_t cpu = c ? pto_proc_busy_cpu(c) : -1;
            if (cpu < 0 || cpu >= MAXCPU) continue;
            busy++;
            if (++on[cpu] == 2) crowded = c;
        }
    if (!crowded || on[me]) return;
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0 || CPU_COUNT(&mine) > busy + 1) return;
    pto_proc_nudge(crowded, me);
}
