/* Scope: a stack of frames, each listing the slots that hold
 * a scope reference in it. Frame 0 is the run's outer scope; up to
 * PTO_MAX_SCOPE_DEPTH nested frames sit on top. The nesting depth also picks
 * the heap ring: min(depth, PTO_MAX_RING_DEPTH - 1). */
#ifndef PTO_SCOPE_H
#define PTO_SCOPE_H

#include <stdint.h>
#include "pto.h"

struct pto_slot;

typedef struct pto_scope_frame {
    struct pto_slot **slots;
    int32_t count, cap;
    char label[64];                  /* pto_scope_label: where it was opened, "" if unknown */
    uint32_t seq;                    /* which nested scope of the run: 1, 2, ... in opening order; 0 the outer */
} pto_scope_frame;

typedef struct pto_scope {
    pto_scope_frame frames[PTO_MAX_SCOPE_DEPTH + 1];
    int32_t top;                     /* frames in use; 0 = no run open */
    uint32_t opened;                 /* nested scopes opened in this run (frame seq); the run's begin resets it, not
                                      * each outer frame: a session of submitted runs renews its outer frame per
                                      * run, but is one run to the profile, whose scope numbers must differ */
} pto_scope;

void pto_scope_init(pto_scope *s);
void pto_scope_destroy(pto_scope *s);
/* Open a frame; -1 when the nesting limit is reached. */
int pto_scope_push(pto_scope *s);
/* Record slot in the innermost frame. */
void pto_scope_register(pto_scope *s, struct pto_slot *slot);
/* Nested depth: 0 in the run's outer scope. */
static inline int32_t pto_scope_nested(const pto_scope *s) { return s->top - 1; }
static inline int32_t pto_scope_ring(const pto_scope *s)
{
    int32_t d = pto_scope_nested(s);
    return d < PTO_MAX_RING_DEPTH - 1 ? d : PTO_MAX_RING_DEPTH - 1;
}
/* The depth of the frame that holds slot (0: the run's outer scope), or -1. */
int32_t pto_scope_holder(const pto_scope *s, const struct pto_slot *slot);
/* The innermost frame, for its owner to release and then pop. */
pto_scope_frame *pto_scope_innermost(pto_scope *s);
void pto_scope_pop(pto_scope *s);
/* Slots held by every open frame together. */
int64_t pto_scope_held(const pto_scope *s);
/* Pop every frame, releasing nothing: the owner frees their slots at once. */
void pto_scope_drop(pto_scope *s);

#endif
