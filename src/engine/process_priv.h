/* process_priv.h - what process.c (the parent side) and zygote.c (the
 * forkserver, its sentinel and the children it forks) share: the state of
 * one Worker's children and the messages the parent sends its zygote.
 * Not part of the engine's interface: only those two files include it. */
#ifndef PTO_PROCESS_PRIV_H
#define PTO_PROCESS_PRIV_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "process.h"

#define EXIT_GRACE_MS 1000          /* at close, idle children get this long to exit */

enum { Z_SPAWN = 1, Z_KILL, Z_KILL_BUSY, Z_EXIT };

typedef struct zmsg {
    uint32_t op;
    int32_t slot;
    uint32_t reason;
} zmsg;

/* One Worker's children: the parent's view, and after the fork the zygote's
 * (and its sentinel's) private copy. */
struct pto_proc {
    int32_t n;
    pto_child *children;
    pto_mailbox **mbs;
    pto_done_page **done_pages;   /* each child's task-end words (done_words.h), beside its mailbox */
    const pto_leaf **leaves;
    uint32_t start_timeout_ms;
    const _Atomic bool *stopping;
    const pto_ship_table *ships;
    pid_t parent_pid, zygote_pid;
    int sock;                     /* the parent's end; in the zygote, the zygote's */
    sigset_t child_mask;          /* the init thread's signal mask, restored in children */
    _Atomic bool zygote_gone;
    _Atomic int32_t replacing;    /* replacements under way */
    pto_event settle_ev;          /* pto_proc_settle sleeps here */
    pto_event *bell;              /* private copy: a child may scribble over its mailbox's pointer */
    bool nested;                  /* this process is itself a child hosting a Worker (an L3 under an L4) */
    /* One shared word for the parent, the zygote and its sentinel: set by
     * pto_proc_stop, so the sentinel tells a close from a lost zygote. */
    _Atomic uint32_t *closing;
    /* The zygote's own (its copy of this struct is private after the fork). */
    pid_t *zpids;                 /* live child per slot, 0 if none; the sentinel's copy is its own table */
    int sfd;
    pid_t sentinel_pid;
    int32_t spawns;               /* forks so far: the sentinel comes after the first n */
    int sentinel_fd;              /* the zygote's end of the socket that tells the sentinel each child */
};

/* Wake the parent side of slot through the private bell, never through the
 * pointer in the mailbox, which its child can overwrite. */
static inline void pto_proc_wake_parent(pto_proc *p, int32_t slot)
{
    pto_event_notify(&p->mbs[slot]->to_parent);
    if (p->bell) pto_event_notify(p->bell);
}

/* zygote.c. The mailbox this process serves when it is itself a child, or
 * NULL: the sentinel of a Worker hosted here says through it why it killed
 * its host. */
extern pto_mailbox *pto_zyg_own_mailbox;
/* In a child that hosts a Worker of its own: when its parent stops waiting
 * for it to start (0: not such a child). */
extern uint64_t pto_zyg_inherited_deadline_ns;
/* State letter and parent of pid from /proc; false if it is gone. */
bool pto_zyg_read_stat(pid_t pid, char *state, int *ppid);
/* The zygote's loop, in the process fork_zygote made; sock is its end of the parent's socket. */
_Noreturn void pto_zyg_main(pto_proc *p, int sock);

#endif
