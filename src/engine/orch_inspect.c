/* orch_inspect.c - what a run looks like from outside: task states, edges,
 * arguments, the TensorMap and ring addresses, for the prompt and the
 * tools. Read-only views of the orchestrator's own structures, so they run
 * on the orchestrator's thread like everything in orchestrator.c; kept
 * apart so that file holds the submit path and the run's life only. */
#include "orchestrator.h"
#include "run.h"
#include "common.h"
#include "scheduler.h"

#include <string.h>

int64_t pto_task_count(pto_orch *o) { return o && o->open ? o->pool.next_id : 0; }

int pto_task_info_get(pto_orch *o, int64_t id, pto_task_info *info)
{
    if (!pto_orch_check_open(o)) return -1;
    if (id < 0 || id >= o->pool.next_id) {
        pto_set_error("no task %lld in this run (ids are 0..%lld)", (long long)id,
                      (long long)o->pool.next_id - 1);
        return -1;
    }
    memset(info, 0, sizeof *info);
    info->id = id;
    info->ring = -1;
    info->group_size = 1;
    info->pin = -1;
    pto_slot *s = pto_slot_get(&o->pool, id);
    if (!s) {
        info->state = PTO_TASK_CONSUMED;
        info->reclaimed = 1;
        const pto_gone *g = id < o->gone_hi ? &o->gone[id] : NULL;
        if (g && g->kind) {   /* what it was (orchestrator.h) */
            info->kind = g->kind - 2;
            info->callable = g->callable;
            info->worker = g->worker;
        } else {
            info->kind = -2;  /* unknown: reclaimed past PTO_GONE_CAP */
        }
        return 0;
    }
    info->state = atomic_load_explicit(&s->state, memory_order_acquire);
    info->kind = s->kind;
    info->callable = s->callable;
    info->pin = s->kind >= 0 && s->group_size > 0 ? s->members[0].pin : -1;
    info->run = s->run ? s->run->id : 0;
    int32_t deps = 0;
    for (int32_t i = 0; i < s->nrefs; i++) deps += s->refs[i].dep;
    info->fanin = deps;
    info->fanout = (int32_t)(atomic_load(&s->fanout) >> 32) - (s->scope_held ? 1 : 0);
    info->ring = s->ring;
    info->group_size = s->group_size;
    info->slab_offset = s->slab_off;
    info->slab_bytes = s->slab_bytes;
    info->error = atomic_load_explicit(&s->failed, memory_order_acquire) ? s->error : NULL;
    /* A caught failure (scheduler.c) is not terminal, so consumers keep waiting; it shows as failed. */
    if (PTO_UNLIKELY(atomic_load(&o->sched->caught_task) == id)) {
        info->state = PTO_TASK_FAILED;
        info->error = s->error;
    }
    info->worker = s->kind >= 0 ? atomic_load_explicit(&s->worker, memory_order_relaxed) : -1;
    return 0;
}

int32_t pto_task_tensors(pto_orch *o, int64_t id, int32_t member, pto_tensor *tensors, uint8_t *tags, int32_t cap)
{
    if (!pto_orch_check_open(o)) return -1;
    pto_slot *s = id >= 0 && id < o->pool.next_id ? pto_slot_get(&o->pool, id) : NULL;
    if (!s || member < 0 || member >= s->group_size) return -1;
    const pto_member *m = &s->members[member];
    int32_t n = pto_member_user_tensors(m);
    for (int32_t i = 0; i < n && i < cap; i++) {
        if (tensors) tensors[i] = m->tensors[i];
        if (tags) tags[i] = m->tags[i];
    }
    return n;
}

int32_t pto_ring_locate(pto_orch *o, uint64_t addr, uint64_t *offset)
{
    int32_t r = o ? pto_orch_ring_of(o, addr) : -1;
    if (r >= 0 && offset) *offset = addr - (uint64_t)(uintptr_t)o->rings[r].base;
    return r;
}

typedef struct tm_list {
    pto_tm_item *out;
    int64_t cap, n;
} tm_list;

static void tm_list_add(uint64_t base, const pto_tm_entry *e, void *arg)
{
    tm_list *l = arg;
    if (l->n < l->cap) l->out[l->n] = (pto_tm_item){base, e->start, e->end, e->producer->id};
    l->n++;
}

int64_t pto_tensormap_list(pto_orch *o, pto_tm_item *out, int64_t cap)
{
    if (!pto_orch_check_open(o)) return -1;
    tm_list l = {out, cap, 0};
    pto_tm_each(&o->tm, tm_list_add, &l);
    return l.n;
}

int pto_task_edges(pto_orch *o, int64_t id, int32_t what, int64_t *out, int32_t cap)
{
    if (!pto_orch_check_open(o)) return -1;
    pto_slot *s = pto_slot_get(&o->pool, id);
    if (!s) return 0;
    int32_t n = 0;
    if (what == 0) {
        for (int32_t i = 0; i < s->nrefs; i++)
            if (s->refs[i].dep) {
                if (n < cap) out[n] = s->refs[i].slot->id;
                n++;
            }
        return n;
    }
    /* Consumers are the scheduler's; read them back from the live tasks' producer lists. */
    for (int64_t k = id + 1; k < o->pool.next_id; k++) {
        pto_slot *c = pto_slot_get(&o->pool, k);
        if (!c) continue;
        for (int32_t i = 0; i < c->nrefs; i++)
            if (c->refs[i].dep && c->refs[i].slot == s) {
                if (n < cap) out[n] = k;
                n++;
                break;
            }
    }
    return n;
}
