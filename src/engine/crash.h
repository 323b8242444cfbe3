/* crash.h - last words of a thread-mode task that takes the process down.
 *
 * A thread-mode task shares the process: a kernel that crashes (SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL, SIGABRT) or a sub that calls exit ends it. Before
 * it goes, stderr gets one line naming the task, its callable and its
 * worker, and saying that process mode contains such failures. The exit
 * status is kept: the signal's default action runs after the line, exit's
 * code is untouched. _exit and SIGKILL leave no last words. */
#ifndef PTO_CRASH_H
#define PTO_CRASH_H

#include <stdint.h>

struct pto_worker_thread;
struct pto_slot;

/* Install the signal handlers and the exit hook, once per process (any
 * thread; the first thread-mode Worker's init calls it). */
void pto_crash_install(void);
/* Remember the name of owner's callable of kind, readable from a signal
 * handler (a later name for the same callable wins). */
void pto_crash_name(const void *owner, int32_t kind, uint64_t callable, const char *name);
/* Forget owner's names (its Worker is closed; the address may be reused). */
void pto_crash_forget(const void *owner);
/* The calling thread runs task s on wt (NULL s: it runs nothing). Two
 * thread-local stores; wt->wm is the owner of the names. */
void pto_crash_current(const struct pto_worker_thread *wt, const struct pto_slot *s);

#endif
