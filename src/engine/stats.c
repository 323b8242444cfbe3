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
    st->tasks_early = atomic_load(&w->sched.early_total);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        const pto_heap_ring *ring = &w->rings[r];
        st->rings[r] = (pto_ring_stats){ring->stalls, ring->stall_ns, ring->hwm, ring->size, ring->used,
                                        ring->count, ring->need, ""};
        memcpy(st->rings[r].stall_scope, ring->stall_scope, sizeof ring->stall_scope);
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
    return pto_format_stats_ex(s, level, 0, buf, cap);
}

/* One unit for a whole column of byte counts: the largest binary unit the
 * column's biggest value reaches, so that rows compare at a glance. */
typedef struct unit {
    const char *name;
    double div;
} unit;

static unit column_unit(uint64_t max)
{
    static const unit units[] = {{"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}, {"B", 1.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0] - 1; i++)
        if ((double)max >= units[i].div) return units[i];
    return units[3];
}

/* A byte count in unit u: whole numbers without decimals. */
static void put_bytes(out *o, uint64_t v, unit u, int width)
{
    double x = (double)v / u.div;
    if (x == (double)(uint64_t)x) put(o, "%*llu", width, (unsigned long long)x);
    else put(o, "%*.1f", width, x);
}

static bool ring_used(const pto_ring_stats *rs) { return rs->stalls > 0 || rs->hwm_bytes > 0 || rs->used_bytes > 0; }

/* The rows of the ring table: each ring that was used (every ring when full). */
static void put_rings(out *o, const pto_stats *st, bool full)
{
    uint64_t maxcap = 0, maxhwm = 0;
    int shown = 0;
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        const pto_ring_stats *rs = &st->rings[r];
        if (!full && !ring_used(rs)) continue;
        if (rs->capacity_bytes > maxcap) maxcap = rs->capacity_bytes;
        if (rs->hwm_bytes > maxhwm) maxhwm = rs->hwm_bytes;
        shown++;
    }
    if (!shown) {
        put(o, "Heap Rings: none was used\n");
        return;
    }
    put(o, "Heap Rings%s:\n", full ? "" : " (rings never used are left out; the full report lists them)");
    unit cu = column_unit(maxcap), hu = column_unit(maxhwm);
    put(o, "  ring  capacity %-3s  high-water %-3s  peak    stalls  stall time ms\n", cu.name, hu.name);
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        const pto_ring_stats *rs = &st->rings[r];
        if (!full && !ring_used(rs)) continue;
        put(o, "  %-4d  ", r);
        put_bytes(o, rs->capacity_bytes, cu, 12);
        put(o, "  ");
        put_bytes(o, rs->hwm_bytes, hu, 14);
        put(o, "  %5.1f%%  %6lld  %13.2f\n", pct((double)rs->hwm_bytes, (double)rs->capacity_bytes),
            (long long)rs->stalls, rs->stall_ns / 1e6);
    }
}

/* One piece of advice per ring that stalled or came near its capacity. */
static int put_advice(out *o, const pto_stats *st)
{
    int advice = 0;
    put(o, "\nSizing Recommendations:\n");
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) {
        const pto_ring_stats *rs = &st->rings[r];
        double p = pct((double)rs->hwm_bytes, (double)rs->capacity_bytes);
        if (rs->stalls == 0 && p < 90.0) continue;
        unit u = column_unit(rs->capacity_bytes);
        if (rs->stalls > 0)
            put(o, "  [!] Heap Ring %d was full %lld time%s (%.2f ms waiting for tasks to finish)", r,
                (long long)rs->stalls, rs->stalls == 1 ? "" : "s", rs->stall_ns / 1e6);
        else
            put(o, "  [!] Heap Ring %d reached %.1f%% of its capacity", r, p);
        put(o, ".\n      Increase heap_ring_size (now ");
        put_bytes(o, rs->capacity_bytes, u, 0);
        put(o, " %s per ring)", u.name);
        /* A size from what the waits freed (ring.h): rounded up to a power
         * of two, as the rings' wrap-around wastes up to a slab. */
        uint64_t advised = 0;
        if (rs->stalls > 0 && rs->need_bytes > rs->capacity_bytes) {
            advised = 1;
            while (advised < rs->need_bytes && advised < (UINT64_C(1) << 62)) advised <<= 1;
            unit au = column_unit(advised);
            put(o, " to ");
            put_bytes(o, advised, au, 0);
            put(o, " %s", au.name);
        }
        char at[sizeof rs->stall_scope];
        memcpy(at, rs->stall_scope, sizeof at);
        at[sizeof at - 1] = 0;   /* a child's record: trust no terminator */
        if (rs->stalls > 0 && at[0])
            put(o, ", or end the scope opened at %s (depth %d) sooner.\n", at, r);
        else
            put(o, ", or end the scopes at depth %d sooner.\n", r);
        if (advised) {
            unit wu = column_unit(rs->need_bytes - rs->capacity_bytes);
            put(o, "      Why: the ");
            put_bytes(o, rs->capacity_bytes, u, 0);
            put(o, " %s it had plus the ", u.name);
            put_bytes(o, rs->need_bytes - rs->capacity_bytes, wu, 0);
            put(o, " %s the orchestrator waited to be freed (worst run), rounded up to a power of two: with that "
                   "room it would not have waited.\n", wu.name);
        }
        advice++;
    }
    if (!advice) put(o, "  none: no resource stalled or came near its limit.\n");
    return advice;
}

int pto_format_stats_ex(const pto_stats *s, int32_t level, int32_t flags, char *buf, size_t cap)
{
    const pto_stats st = *s;
    const bool full = (flags & PTO_STATS_FULL) != 0;
    out o = {buf, cap, 0};
    if (cap) buf[0] = 0;
    const char *rule = "================================================================================";
    put(&o, "[PTO Flow Control Statistics] level %d\n%s\n", level, rule);
    put(&o, "Tasks: %lld submitted, %lld completed, %lld failed; %lld alloc%s; %lld run%s\n",
        (long long)st.tasks_submitted, (long long)st.tasks_completed, (long long)st.tasks_failed,
        (long long)st.allocs, st.allocs == 1 ? "" : "s", (long long)st.runs, st.runs == 1 ? "" : "s");
    put(&o, "Peaks: %lld live task slots, %lld TensorMap entries, %lld in the ready queue\n\n",
        (long long)st.tasks_live_hwm, (long long)st.tensormap_hwm, (long long)st.ready_hwm);
    put_rings(&o, &st, full);
    int64_t total_ns = 0;
    for (int r = 0; r < PTO_MAX_RING_DEPTH; r++) total_ns += st.rings[r].stall_ns;
    if (total_ns > 0 || full) put(&o, "  total stall time: %.2f ms\n", total_ns / 1e6);
    put_advice(&o, &st);
    put(&o, "%s\n", rule);
    return (int)o.len;
}
