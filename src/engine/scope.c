#include "scope.h"
#include "slot.h"
#include "common.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

void pto_scope_init(pto_scope *s) { memset(s, 0, sizeof *s); }

void pto_scope_destroy(pto_scope *s)
{
    for (int i = 0; i <= PTO_MAX_SCOPE_DEPTH; i++) free(s->frames[i].slots);
    memset(s, 0, sizeof *s);
}

int pto_scope_push(pto_scope *s)
{
    if (s->top > PTO_MAX_SCOPE_DEPTH) return -1;
    pto_scope_frame *f = &s->frames[s->top++];
    f->count = 0;
    f->label[0] = 0;
    f->seq = s->top == 1 ? 0 : ++s->opened;
    return 0;
}

int32_t pto_scope_holder(const pto_scope *s, const struct pto_slot *slot)
{
    for (int32_t d = s->top - 1; d >= 0; d--)
        for (int32_t i = 0; i < s->frames[d].count; i++)
            if (s->frames[d].slots[i] == slot) return d;
    return -1;
}

void pto_scope_register(pto_scope *s, struct pto_slot *slot)
{
    assert(s->top > 0);
    pto_scope_frame *f = &s->frames[s->top - 1];
    pto_grow((void **)&f->slots, &f->cap, f->count + 1, sizeof *f->slots);
    f->slots[f->count++] = slot;
    slot->scope_seq = f->seq;
}

pto_scope_frame *pto_scope_innermost(pto_scope *s) { return s->top ? &s->frames[s->top - 1] : NULL; }

void pto_scope_pop(pto_scope *s)
{
    if (s->top) s->frames[--s->top].count = 0;
}

int64_t pto_scope_held(const pto_scope *s)
{
    int64_t n = 0;
    for (int32_t d = 0; d < s->top; d++) n += s->frames[d].count;
    return n;
}

void pto_scope_drop(pto_scope *s)
{
    while (s->top) pto_scope_pop(s);
}
