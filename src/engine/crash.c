/*
 * Last words of a thread-mode task that takes the process down (crash.h).
 *
 * Everything the handler reads was published before the crash: the task
 * the thread runs sits in a thread-local pair the worker thread writes
 * around each call, and callable names sit in a write-once table whose
 * entries are published by a release store of their owner. The handler
 * formats with its own integer printer and one write(2): no malloc, no
 * locks, no stdio. It then puts back the action that was there before
 * (the default, or a sanitizer's) and raises the signal again, so the
 * process dies as it would have, with the same status.
 */
#include "crash.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "slot.h"
#include "worker_manager.h"

#define NAMES_CAP 1024
#define NAME_LEN 48

typedef struct crash_name {
    const void *_Atomic owner; /* NULL: free or forgotten; published last */
    int32_t kind;
    uint64_t callable;
    char name[NAME_LEN];
} crash_name;

static crash_name names[NAMES_CAP];
static _Atomic int32_t names_used;

static _Thread_local const pto_worker_thread *cur_wt;
static _Thread_local const pto_slot *cur_slot;

static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define NSIG_CRASH ((int)(sizeof crash_signals / sizeof *crash_signals))
static struct sigaction old_actions[NSIG_CRASH];

void pto_crash_current(const pto_worker_thread *wt, const pto_slot *s)
{
    cur_wt = s ? wt : NULL;
    cur_slot = s;
}

void pto_crash_name(const void *owner, int32_t kind, uint64_t callable, const char *name)
{
    /* Entries are never reused (a handler may be reading one), so a
     * process names NAMES_CAP callables at most; later ones are shown by
     * number. */
    int32_t i = atomic_load(&names_used);
    do {
        if (i >= NAMES_CAP) return;
    } while (!atomic_compare_exchange_weak(&names_used, &i, i + 1));
    crash_name *e = &names[i];
    e->kind = kind;
    e->callable = callable;
    size_t n = strlen(name);
    if (n >= NAME_LEN) n = NAME_LEN - 1;
    memcpy(e->name, name, n);
    e->name[n] = '\0';
    atomic_store_explicit(&e->owner, owner, memory_order_release);
}

void pto_crash_forget(const void *owner)
{
    int32_t n = atomic_load(&names_used);
    for (int32_t i = 0; i < n; i++)
        if (atomic_load_explicit(&names[i].owner, memory_order_acquire) == owner)
            atomic_store_explicit(&names[i].owner, NULL, memory_order_relaxed);
}

/* ---- async-signal-safe formatting ---- */

typedef struct line {
    char buf[512];
    size_t len;
} line;

static void put(line *l, const char *s)
{
    while (*s && l->len < sizeof l->buf - 1) l->buf[l->len++] = *s++;
}

static void put_u64(line *l, uint64_t v)
{
    char d[24];
    int n = 0;
    do d[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    while (n && l->len < sizeof l->buf - 1) l->buf[l->len++] = d[--n];
}

static const char *latest_name(const void *owner, int32_t kind, uint64_t callable)
{
    const char *found = NULL;
    int32_t n = atomic_load(&names_used);
    for (int32_t i = 0; i < n; i++)
        if (atomic_load_explicit(&names[i].owner, memory_order_acquire) == owner && names[i].kind == kind &&
            names[i].callable == callable)
            found = names[i].name;
    return found;
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "a signal";
    }
}

/* "pto: task 3 (callable 'crash' on chip 0) <how>; ...": the task this
 * thread runs, or nothing when it runs none. */
static void last_words(const char *how, const char *what)
{
    const pto_worker_thread *wt = cur_wt;
    const pto_slot *s = cur_slot;
    if (!wt || !s) return;
    line l = {.len = 0};
    put(&l, "pto: task ");
    put_u64(&l, (uint64_t)s->id);
    const char *name = latest_name(wt->wm, wt->kind, s->callable);
    if (name) {
        put(&l, " (callable '");
        put(&l, name);
        put(&l, "' on ");
    } else {
        put(&l, " (callable ");
        put_u64(&l, s->callable);
        put(&l, " on ");
    }
    put(&l, wt->name);
    put(&l, ") ");
    put(&l, how);
    put(&l, what);
    put(&l, " in thread mode, which ends the whole process; process mode (mode = \"process\") contains such a "
            "failure to the task\n");
    ssize_t r = write(STDERR_FILENO, l.buf, l.len);
    (void)r; /* nothing more to try while dying */
}

static void on_crash(int sig)
{
    int saved_errno = errno; /* in case the signal came in the middle of a call that reads it */
    last_words("crashed with ", signal_name(sig));
    for (int i = 0; i < NSIG_CRASH; i++)
        if (crash_signals[i] == sig) sigaction(sig, &old_actions[i], NULL);
    /* Pending until this handler returns; a faulting instruction would
     * fault again anyway, a raised signal would not. */
    raise(sig);
    errno = saved_errno;
}

static void on_exit_hook(void) { last_words("called exit", ""); }

static void install(void)
{
    /* The handlers and the exit hook point into this object: a pto.so or
     * libpto.so that its host unloads (lua_close, LuaJIT's ffi.load being
     * collected) must stay mapped, or a later signal, or exit itself, would
     * jump into nothing. */
    Dl_info info;
    if (dladdr((void *)install, &info) && info.dli_fname) {
        void *self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
        (void)self; /* kept on purpose: never dlclose'd */
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_crash;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_ONSTACK;
    for (int i = 0; i < NSIG_CRASH; i++) {
        struct sigaction old;
        if (sigaction(crash_signals[i], NULL, &old) != 0) continue;
        /* An ignored signal stays ignored; a handler already there (a
         * sanitizer's, the program's) runs after the line, as before. */
        if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;
        old_actions[i] = old;
        sigaction(crash_signals[i], &sa, NULL);
    }
    atexit(on_exit_hook);
}

void pto_crash_install(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install);
}
