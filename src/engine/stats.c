#include "stats.h"
#include "common.h"
#include "worker.h"

#include <stdio.h>
#include <string.h>

void pto_worker_stats_get(pto_worker *w, pto_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!w) return;
    pto_orch *o = &w->orch;
    st->tasks_submitted = o->submitted_total;
    st->tasks_completed = atomic_load(&w->sched.completed_total);
    st->tasks_failed = atomic_load(&w->sched.failed_total);
    st->allocs = o->allocs_total;
    st->runs = w->runs;
    st->tasks_live_hwm = o->live_hwm;
    st->tasks_live = o->pool.live;
    st->ready_hwm = atomic_load(&w->sched.ready_hwm);
    st->tensormap_hwm = o->tm.hwm;
    st->tensormap_live = o->tm.live;
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        const pto_heap_ring *ring = &w->rings[r];
        st->rings[r] = (pto_ring_stats){ring->stalls, ring->stall_ns, ring->hwm, ring->size, ring->used,
                                        ring->count};
    }
}

typedef struct out {
    char *buf;
    size_t cap, len;
} out;

__attribute__((format(printf, 2, 3))) static void put(out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
}

static double pct(double a, double b) { return b > 0 ? 100.0 * a / b : 0.0; }

int pto_worker_format_stats(pto_worker *w, char *buf, size_t cap)
{
    pto_stats st;
    pto_worker_stats_get(w, &st);
    return pto_format_stats(&st, w ? w->cfg.level : 0, buf, cap);
}

int pto_format_stats(const pto_stats *s, int32_t level, char *buf, size_t cap)
{
    const pto_stats st = *s;
    out o = {buf, cap, 0};
    if (cap) buf[0] = 0;
    const char *rule = "================================================================================";
    put(&o, "[PTO Flow Control Statistics] level %d\n%s\n\n", level, rule);
    put(&o, "Tasks: %lld submitted, %lld completed, %lld failed; %lld allocs; %lld runs\n\n",
        (long long)st.tasks_submitted, (long long)st.tasks_completed, (long long)st.tasks_failed,
        (long long)st.allocs, (long long)st.runs);
    put(&o, "Stall Counts (times orchestration was blocked):\n");
    int64_t total_ns = 0;
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++)
        put(&o, "  Heap Ring %d:%28lld\n", r, (long long)st.rings[r].stalls);
    put(&o, "\nStall Times (nanoseconds):\n");
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        put(&o, "  Heap Ring %d:%28lld ns  (%.2f ms)\n", r, (long long)st.rings[r].stall_ns,
            st.rings[r].stall_ns / 1e6);
        total_ns += st.rings[r].stall_ns;
    }
    put(&o, "\nTotal Stall Time:%24lld ns  (%.2f ms)\n\n", (long long)total_ns, total_ns / 1e6);
    put(&o, "High Water Marks (peak usage):\n");
    put(&o, "  Live task slots:   %lld (grows as needed; bounded by the heap rings and scopes)\n",
        (long long)st.tasks_live_hwm);
    put(&o, "  TensorMap entries: %lld\n", (long long)st.tensormap_hwm);
    put(&o, "  Ready queue:       %lld\n", (long long)st.ready_hwm);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++)
        put(&o, "  Heap Ring %d:  %llu / %llu bytes  (%.1f%%)\n", r, (unsigned long long)st.rings[r].hwm_bytes,
            (unsigned long long)st.rings[r].capacity_bytes,
            pct((double)st.rings[r].hwm_bytes, (double)st.rings[r].capacity_bytes));
    put(&o, "\nSizing Recommendations:\n");
    int advice = 0;
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        const pto_ring_stats *rs = &st.rings[r];
        double p = pct((double)rs->hwm_bytes, (double)rs->capacity_bytes);
        if (rs->stalls > 0) {
            put(&o, "  [!] Heap Ring %d was exhausted %lld times (%.2f ms waiting).\n"
                    "      Consider increasing heap_ring_size (current: %llu MB per ring), or scopes that end "
                    "sooner at depth %d.\n",
                r, (long long)rs->stalls, rs->stall_ns / 1e6, (unsigned long long)(rs->capacity_bytes >> 20), r);
            advice++;
        }
        if (p >= 90.0) {
            put(&o, "  [WARN] Heap Ring %d usage reached %.1f%% - consider increasing heap_ring_size\n", r, p);
            advice++;
        }
    }
    if (!advice) put(&o, "  none: no resource stalled or came near its limit.\n");
    put(&o, "\n%s\n", rule);
    return (int)o.len;
}
