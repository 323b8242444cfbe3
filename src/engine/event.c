#include "event.h"
#include "common.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t timeout_ns)
{
    struct timespec ts, *tp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000;
        ts.tv_nsec = timeout_ns % 1000000000;
        tp = &ts;
    }
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, val, tp, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void wake_if_sleeping(pto_event *e)
{
    if (atomic_load_explicit(&e->sleeping, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&e->seq, 1, memory_order_seq_cst);
        futex_wake(&e->seq);
    }
}

void pto_event_notify(pto_event *e)
{
    /* Pairs with the fence in pto_event_wait: either the waiter sees our
     * work, or we see it sleeping (Dekker). */
    atomic_thread_fence(memory_order_seq_cst);
    wake_if_sleeping(e);
}

void pto_event_notify_light(pto_event *e)
{
    /* Asymmetric: the waiter's membarrier stands in for our fence (see
     * heavy_barrier); the compiler must still keep the caller's store
     * before our load. */
    if (atomic_load_explicit(&e->asym, memory_order_relaxed)) atomic_signal_fence(memory_order_seq_cst);
    else atomic_thread_fence(memory_order_seq_cst);
    wake_if_sleeping(e);
}

static int membarrier(int cmd) { return (int)syscall(SYS_membarrier, cmd, 0, 0); }

/* Registration is per process (an mm): a forked child that makes an event
 * asymmetric registers again. */
bool pto_event_make_asymmetric(pto_event *e)
{
    int cmds = membarrier(MEMBARRIER_CMD_QUERY);
    if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) ||
        membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0)
        return false;
    atomic_store_explicit(&e->asym, 1, memory_order_seq_cst);
    return true;
}

/* Every running thread of this process executes a full barrier before
 * this returns, so a light notifier's store before its load of `sleeping`
 * is either seen by our re-check or its load sees our sleeping = 1. */
static bool heavy_barrier(void) { return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0; }

/* A light notifier may have missed us when the barrier failed: sleep no
 * longer than this, so it costs a delay, never a hang. */
#define UNFENCED_SLEEP_NS 1000000

void pto_event_notify_pair(pto_event *a, pto_event *b)
{
    atomic_thread_fence(memory_order_seq_cst);
    wake_if_sleeping(a);
    if (b) wake_if_sleeping(b);
}

bool pto_event_wait(pto_event *e, bool (*has_work)(void *), void *arg, int64_t spin_ns, int64_t timeout_ns)
{
    if (has_work(arg)) return true;
    uint64_t t0 = pto_now_ns();
    if (spin_ns > 0) {
        /* A check every few pauses (~100 ns): hand-offs here are sub-
         * microsecond, so a coarser loop would cost more than it saves. */
        for (int i = 0;; i++) {
            for (int k = 0; k < 4; k++) pto_cpu_relax();
            if (has_work(arg)) return true;
            /* With more runnable threads than cores the thread we wait for
             * may need this core: offer it after every check. Every fourth
             * (about 0.4 us of pauses first) kept the core from the worker
             * that shared it: C API floods of no-op tasks ran 1.4-1.7x
             * faster so (pto_bench W1 2.7-3.5 -> 4.2-5.6 Mtasks/s, W2
             * 2.5-3.3 -> 3.8-4.8). On an idle core a yield costs about
             * 0.65 us here, so a peer running elsewhere is seen up to that
             * much later. */
            sched_yield();
            if ((i & 3) == 3 && (int64_t)(pto_now_ns() - t0) >= spin_ns) break;
        }
    }
    uint32_t seq = atomic_load_explicit(&e->seq, memory_order_seq_cst);
    atomic_store_explicit(&e->sleeping, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    bool unfenced = atomic_load_explicit(&e->asym, memory_order_relaxed) && !heavy_barrier();
    bool work = has_work(arg);
    if (!work) {
        int64_t left = -1;
        if (timeout_ns >= 0) {
            left = timeout_ns - (int64_t)(pto_now_ns() - t0);
            if (left < 0) left = 0;
        }
        if (unfenced && (left < 0 || left > UNFENCED_SLEEP_NS)) left = UNFENCED_SLEEP_NS;
        if (left != 0) futex_wait(&e->seq, seq, left);
        work = has_work(arg);
    }
    atomic_store_explicit(&e->sleeping, 0, memory_order_relaxed);
    return work;
}

int64_t pto_hot_spin(int64_t hot_ns, int64_t cold_ns, const _Atomic uint64_t *hot_until_ns)
{
    uint64_t until = atomic_load_explicit(hot_until_ns, memory_order_relaxed);
    if (hot_ns <= cold_ns || until == 0) return cold_ns;
    return until == UINT64_MAX || pto_now_ns() < until ? hot_ns : cold_ns;
}
