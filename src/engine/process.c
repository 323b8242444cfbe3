#include "process.h"
#include "shm.h"
#include "common.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILD_SPIN_MAX_NS 20000u    /* a child waiting for its next task */
#define COLD_SPIN_NS 2000           /* while the orchestrator submits (pto_hot_spin) */
#define TICK_NS PTO_PROC_TICK_NS   /* a blocked wait's look at the zygote: a timed futex wait */
#define EXIT_GRACE_MS 1000          /* at close, idle children get this long to exit */
/* At close the parent waits this much longer than the zygote's own grace
 * for the zygote to exit, then SIGKILLs it: a stopped zygote cannot strand close. */
#define STOP_BOUND_MS (EXIT_GRACE_MS + 1000)
/* A message the zygote does not take within this long (its queue is full:
 * it is stopped or stuck) counts as a lost forkserver. */
#define SEND_BOUND_MS 2000
/* Orphans the zygote adopted (subreaper) get this long to be reaped at its exit. */
#define ORPHAN_REAP_MS 200
/* Sent to the zygote when the thread that forked it exits (PR_SET_PDEATHSIG
 * counts threads): it then checks whether the whole parent is gone. */
#define ZYGOTE_PDEATH_SIG SIGUSR2

enum { Z_SPAWN = 1, Z_KILL, Z_KILL_BUSY, Z_EXIT };

typedef struct zmsg {
    uint32_t op;
    int32_t slot;
    uint32_t reason;
} zmsg;

/* Outcomes of a parent-side wait besides a mailbox state. */
enum { W_ABORTED = PTO_MB_NSTATES, W_TIMEOUT, W_ZYGOTE_GONE };

struct pto_proc {
    int32_t n;
    pto_child *children;
    pto_mailbox **mbs;
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

/* The mailbox this process serves when it is itself a child, or NULL: the
 * sentinel of a Worker hosted here says through it why it killed its host. */
static pto_mailbox *own_mailbox;

/* In a child that hosts a Worker of its own: when its parent stops waiting
 * for it to start (0: not such a child). Its own children must be up
 * before then, with a margin for the report to travel back, so a failure
 * deep in the tree is reported with its cause, not as a timeout above. */
static uint64_t inherited_deadline_ns;

/* Held from socketpair to closing the zygote's end in the parent, so no
 * other Worker's fork in between inherits that end (the parent would then
 * not see the zygote's death as a hang-up). */
static pthread_mutex_t fork_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- shipped callables ---- */

void pto_ship_init(pto_ship_table *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
}

void pto_ship_destroy(pto_ship_table *t)
{
    uint32_t n = atomic_load(&t->count);
    for (uint32_t i = 0; i < n; i++) pto_shm_free(t->entries[i].blob);
    free(t->entries);
    pthread_mutex_destroy(&t->mu);
}

int pto_ship_add(pto_ship_table *t, int32_t kind, uint64_t callable, const void *blob, uint64_t len)
{
    if (pto_shm_init(0) != 0) return -1;
    void *copy = pto_shm_alloc(len);
    if (!copy) {
        char why[PTO_ERRLEN];
        snprintf(why, sizeof why, "%s", pto_errmsg());
        pto_set_error("cannot copy the callable (%llu bytes) into shared memory: %s", (unsigned long long)len, why);
        return -1;
    }
    memcpy(copy, blob, len);
    pthread_mutex_lock(&t->mu);
    uint32_t n = atomic_load_explicit(&t->count, memory_order_relaxed);
    if (n == PTO_MAX_SHIPPED) {
        pthread_mutex_unlock(&t->mu);
        pto_shm_free(copy);
        pto_set_error("at most %d callables can be shipped to a Worker's children; register them before the Worker is initialised",
                      PTO_MAX_SHIPPED);
        return -1;
    }
    if (!t->entries) t->entries = pto_xcalloc(PTO_MAX_SHIPPED, sizeof *t->entries);
    t->entries[n] = (pto_shipped){kind, callable, copy, len};
    atomic_store_explicit(&t->count, n + 1, memory_order_release);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static int32_t ship_find(const pto_ship_table *t, int32_t kind, uint64_t callable)
{
    uint32_t n = atomic_load_explicit(&t->count, memory_order_acquire);
    for (uint32_t i = n; i-- > 0;)
        if (t->entries[i].callable == callable && t->entries[i].kind == kind) return (int32_t)i;
    return -1;
}

/* Wake the parent side of slot through the private bell, never through the
 * pointer in the mailbox, which its child can overwrite. */
static void wake_parent(pto_proc *p, int32_t slot)
{
    pto_event_notify(&p->mbs[slot]->to_parent);
    if (p->bell) pto_event_notify(p->bell);
}

/* ---- the zygote (single-threaded: no locks, no allocation) ----
 * Besides forking, it contains what its children start: every child leads
 * a process group of its own (what a task starts stays in it), the zygote is
 * a subreaper (what leaves the group is adopted by it once orphaned), and a
 * group is killed whenever its child is killed or reaped. A sentinel process
 * covers the cases the zygote cannot act in (it is stopped or killed, or the
 * parent dies while it is stopped): see sentinel_main. */

static void zygote_mark_dead(pto_proc *p, int32_t slot, int status)
{
    pto_mailbox *mb = p->mbs[slot];
    atomic_store_explicit(&mb->wait_status, status, memory_order_relaxed);
    /* died_in must match the state this CAS replaces: the parent may move
     * IDLE -> SHUTDOWN (or similar) at any moment. */
    uint32_t prev = atomic_load_explicit(&mb->state, memory_order_relaxed);
    do {
        atomic_store_explicit(&mb->died_in, prev, memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(&mb->state, &prev, PTO_MB_DEAD, memory_order_release,
                                                    memory_order_relaxed));
    wake_parent(p, slot);
}

static int32_t zygote_live(const pto_proc *p)
{
    int32_t n = 0;
    for (int32_t i = 0; i < p->n; i++) n += p->zpids[i] > 0;
    return n;
}

/* State letter and parent of pid from /proc; false if it is gone. */
static bool read_stat(pid_t pid, char *state, int *ppid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');   /* the command name may hold anything */
    return rp && sscanf(rp + 1, " %c %d", state, ppid) == 2;
}

/* Tell the sentinel slot's child (0: none). Never blocks nor raises
 * SIGPIPE: a stopped or dead sentinel must not stop the zygote. */
static void tell_sentinel(pto_proc *p, int32_t slot, pid_t pid)
{
    int32_t m[2] = {slot, (int32_t)pid};
    if (p->sentinel_fd >= 0) (void)send(p->sentinel_fd, m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Reap what has ended; returns false once no child is left (ECHILD). */
static bool zygote_reap(pto_proc *p, int flags)
{
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, flags)) > 0) {
        if (pid == p->sentinel_pid) p->sentinel_pid = 0;
        for (int32_t i = 0; i < p->n; i++) {
            if (p->zpids[i] != pid) continue;
            p->zpids[i] = 0;
            /* What the child started dies with it; the group id is not reused while members live. */
            kill(-pid, SIGKILL);
            /* Its pid may be reused from now on: the sentinel must not kill by it. */
            tell_sentinel(p, i, 0);
            zygote_mark_dead(p, i, st);
            break;
        }
    }
    return !(pid < 0 && errno == ECHILD);
}

/* SIGKILL every process the zygote adopted or forked that is still its
 * child (what escaped its group by setsid and was orphaned). */
static void kill_own_children(void)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    for (char *s = buf, *end; *s; s = end) {
        long pid = strtol(s, &end, 10);
        if (end == s) break;
        if (pid > 0) kill((pid_t)pid, SIGKILL);
    }
}

/* Read every pending signal; true if one was the parent-death signal. */
static bool zygote_drain_signals(pto_proc *p)
{
    bool pdeath = false;
    struct signalfd_siginfo si;
    while (read(p->sfd, &si, sizeof si) == (ssize_t)sizeof si)
        if (si.ssi_signo == ZYGOTE_PDEATH_SIG) pdeath = true;
    return pdeath;
}

static void zygote_kill(pto_proc *p, int32_t slot, uint32_t reason)
{
    if (p->zpids[slot] <= 0) return;   /* already reaped: its pid may belong to someone else now */
    atomic_store_explicit(&p->mbs[slot]->kill_reason, reason, memory_order_relaxed);
    kill(-p->zpids[slot], SIGKILL);    /* the child and what it started */
    kill(p->zpids[slot], SIGKILL);     /* in case its group was never set */
}

/* The parent is gone (or lost us), or the Worker closes: take every child
 * and everything they started down now, within a bound. The sentinel goes
 * first, so that it does not take our exit for a lost zygote. */
static _Noreturn void zygote_die(pto_proc *p)
{
    if (p->sentinel_pid > 0) kill(p->sentinel_pid, SIGKILL);
    for (int32_t i = 0; i < p->n; i++)
        if (p->zpids[i] > 0) zygote_kill(p, i, atomic_load(&p->mbs[i]->kill_reason));   /* keeps its reason */
    kill_own_children();
    uint64_t deadline = pto_now_ns() + ORPHAN_REAP_MS * 1000000ull;
    while (zygote_reap(p, WNOHANG)) {
        uint64_t now = pto_now_ns();
        if (now >= deadline) break;
        kill_own_children();   /* orphans of what just died */
        struct pollfd f = {p->sfd, POLLIN, 0};   /* SIGCHLD: wakes at each death */
        poll(&f, 1, (int)((deadline - now) / 1000000 + 1));
        zygote_drain_signals(p);
    }
    _exit(0);
}

/* pto_proc_stop: children told SHUTDOWN exit by themselves; any other
 * (running a task, starting) is killed; stragglers after EXIT_GRACE_MS too. */
static _Noreturn void zygote_exit(pto_proc *p)
{
    for (int32_t i = 0; i < p->n; i++)
        if (p->zpids[i] > 0 && atomic_load(&p->mbs[i]->state) != PTO_MB_SHUTDOWN)
            zygote_kill(p, i, PTO_KILL_SHUTDOWN);
    uint64_t deadline = pto_now_ns() + EXIT_GRACE_MS * 1000000ull;
    zygote_reap(p, WNOHANG);
    while (zygote_live(p)) {
        uint64_t now = pto_now_ns();
        if (now >= deadline) break;
        struct pollfd f = {p->sfd, POLLIN, 0};
        poll(&f, 1, (int)((deadline - now) / 1000000 + 1));
        zygote_drain_signals(p);
        zygote_reap(p, WNOHANG);
    }
    zygote_die(p);
}

static _Noreturn void child_main(pto_proc *p, int32_t slot)
{
    /* Die with the zygote; it may already be gone by the time we ask. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != p->zygote_pid) _exit(1);
    setpgid(0, 0);   /* the zygote does it too: whoever runs first */
    close(p->sock);
    close(p->sfd);
    close(p->sentinel_fd);
    signal(ZYGOTE_PDEATH_SIG, SIG_DFL);
    sigprocmask(SIG_SETMASK, &p->child_mask, NULL);   /* SIGINT stays ignored */
    /* A child sees only its own mailbox: whatever it scribbles on cannot
     * reach the other workers or the sentinel's flag. */
    for (int32_t i = 0; i < p->n; i++)
        if (i != slot) pto_mb_unmap(p->mbs[i]);
    munmap(p->closing, sizeof *p->closing);
    /* Nor the mailbox of the process hosting this Worker, one level up. */
    if (own_mailbox) pto_mb_unmap(own_mailbox);
    pto_mailbox *mb = p->mbs[slot];
    own_mailbox = mb;
    atomic_store(&mb->pid, (int32_t)getpid());
    inherited_deadline_ns = mb->start_deadline_ns;
    const pto_leaf *leaf = p->leaves[slot];
    if (pto_mb_child_start(mb, leaf) != 0) _exit(1);   /* the zygote's DEAD tells the parent */
    inherited_deadline_ns = 0;   /* replacements later get their own full timeout */
    pto_mb_child_loop(mb, leaf, CHILD_SPIN_MAX_NS, COLD_SPIN_NS);
    if (leaf->stop) leaf->stop(leaf->ctx);
    _exit(0);
}

static void zygote_spawn(pto_proc *p, int32_t slot)
{
    if (p->zpids[slot] > 0) return;   /* the parent asks only for dead slots */
    pto_mailbox *mb = p->mbs[slot];
    pid_t pid = fork();
    if (pid == 0) child_main(p, slot);
    p->spawns++;
    if (pid > 0) {
        setpgid(pid, pid);
        tell_sentinel(p, slot, pid);
    }
    if (pid < 0) {
        snprintf(mb->err, PTO_MB_ERR_CAP, "the forkserver could not fork it (%s)", strerror(errno));
        mb->rc = -1;
        atomic_store(&mb->pid, -1);
        zygote_mark_dead(p, slot, 0);
        return;
    }
    p->zpids[slot] = pid;
    atomic_store(&mb->pid, (int32_t)pid);
}

static void zygote_handle(pto_proc *p, const zmsg *m)
{
    bool one = m->slot >= 0 && m->slot < p->n;
    switch (m->op) {
    case Z_SPAWN:
        if (one) zygote_spawn(p, m->slot);
        break;
    case Z_KILL:
        if (one) zygote_kill(p, m->slot, m->reason);
        break;
    case Z_KILL_BUSY:
        for (int32_t i = 0; i < p->n; i++)
            if (atomic_load(&p->mbs[i]->posted) != atomic_load(&p->mbs[i]->done)) zygote_kill(p, i, m->reason);
        break;
    case Z_EXIT:
        zygote_exit(p);
    default:
        break;
    }
}

/* Take the zygote's news; false once its end is closed (it exited or died). */
static bool sentinel_read(pto_proc *p, int rfd)
{
    int32_t m[2];
    ssize_t r;
    while ((r = recv(rfd, m, sizeof m, MSG_DONTWAIT)) == (ssize_t)sizeof m)
        if (m[0] >= 0 && m[0] < p->n) p->zpids[m[0]] = m[1];
    return r != 0;
}

/* The sentinel: forked by the zygote once its first spawns are done, in a
 * process group of its own, it learns each child's pid from the zygote (a socket) and waits
 * for the parent to exit (a pidfd) or the zygote to go (the socket's end).
 * Either way it SIGKILLs every child's group and the zygote: SIGKILL is the
 * one signal a stopped zygote still obeys (its parent-death signal stays
 * pending). A zygote lost while its Worker lives in a child of another
 * Worker (an L3 host under an L4) takes that host down too, so that the
 * level above replaces it like any dead host. The zygote kills the
 * sentinel before it exits on its own. */
static _Noreturn void sentinel_main(pto_proc *p, int rfd, int pidfd)
{
    setpgid(0, 0);   /* not killed with the group of a host that is being replaced */
    signal(ZYGOTE_PDEATH_SIG, SIG_DFL);
    close(p->sock);
    close(p->sfd);
    pid_t zygote = getppid();
    bool zygote_lives = zygote == p->zygote_pid, parent_lives = true;
    while (zygote_lives && parent_lives) {
        struct pollfd f[2] = {{rfd, POLLIN, 0}, {pidfd, POLLIN, 0}};
        if (poll(f, pidfd >= 0 ? 2 : 1, -1) < 0) continue;
        parent_lives = !(f[1].revents & POLLIN);
        zygote_lives = sentinel_read(p, rfd);
    }
    /* The parent went: a zygote that is not stopped cleans up better (it
     * also kills the orphans it adopted), so it gets a moment first. */
    char zst = 0;
    int zpp;
    if (!read_stat(zygote, &zst, &zpp) || zst == 'T' || zst == 't') zst = 0;
    for (uint64_t t = pto_now_ns() + ORPHAN_REAP_MS * 1000000ull; zst && zygote_lives && pto_now_ns() < t;) {
        poll(&(struct pollfd){rfd, POLLIN, 0}, 1, 10);
        zygote_lives = sentinel_read(p, rfd);
    }
    if (getppid() == zygote) kill(zygote, SIGKILL);   /* still ours: its pid cannot be reused yet */
    for (int32_t i = 0; i < p->n; i++)
        if (p->zpids[i] > 0) kill(-p->zpids[i], SIGKILL);
    parent_lives = parent_lives && pidfd >= 0 && poll(&(struct pollfd){pidfd, POLLIN, 0}, 1, 0) == 0;
    if (parent_lives && p->nested && !atomic_load(p->closing) && own_mailbox) {
        atomic_store(&own_mailbox->kill_reason, PTO_KILL_SUBTREE);
        syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);   /* the pidfd cannot name a reused pid */
    }
    _exit(0);
}

/* Fork the sentinel; the zygote keeps its end of their socket (children
 * close it). A zygote without one still works, with the weaker guarantees
 * of before (docs/failures.md). */
static void zygote_start_sentinel(pto_proc *p)
{
    p->sentinel_fd = -1;
    int pfd[2];
    /* Not a pipe: a send to a dead reader must not raise SIGPIPE in the zygote. */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pfd) != 0) return;
    int pidfd = (int)syscall(SYS_pidfd_open, p->parent_pid, 0);
    if (getppid() != p->parent_pid) _exit(0);   /* the pidfd may name a reused pid */
    pid_t s = fork();
    if (s == 0) {
        close(pfd[1]);
        sentinel_main(p, pfd[0], pidfd);
    }
    close(pfd[0]);
    if (pidfd >= 0) close(pidfd);
    if (s < 0) {
        close(pfd[1]);
        return;
    }
    p->sentinel_pid = s;
    p->sentinel_fd = pfd[1];
}

static _Noreturn void zygote_main(pto_proc *p, int sock)
{
    p->sock = sock;
    p->zygote_pid = getpid();
    signal(SIGINT, SIG_IGN);     /* inherited by the children */
    signal(SIGCHLD, SIG_DFL);    /* SIG_IGN would auto-reap and lose exit statuses */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, ZYGOTE_PDEATH_SIG);
    sigprocmask(SIG_BLOCK, &set, NULL);
    if (prctl(PR_SET_PDEATHSIG, ZYGOTE_PDEATH_SIG) != 0 || getppid() != p->parent_pid) _exit(0);
    p->sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (p->sfd < 0) _exit(127);   /* the parent sees the hang-up and fails init */
    /* Orphans of what the children start come to us, to be killed and reaped. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    bool sentinel_started = false;
    for (;;) {
        struct pollfd f[2] = {{sock, POLLIN, 0}, {p->sfd, POLLIN, 0}};
        bool start_sentinel = !sentinel_started && p->spawns >= p->n;
        int ready = poll(f, 2, start_sentinel ? 0 : -1);
        if (ready == 0 && start_sentinel) {
            /* Once the first burst of spawns is done: its fork must not
             * delay the children's start (the tree shares one deadline). */
            zygote_start_sentinel(p);
            sentinel_started = true;
            continue;
        }
        if (ready < 0) continue;
        if (f[1].revents) {
            /* The forking thread may have exited while the process lives on:
             * only a changed parent means the parent is gone. */
            if (zygote_drain_signals(p) && getppid() != p->parent_pid) zygote_die(p);
            zygote_reap(p, WNOHANG);
        }
        if (f[0].revents) {
            zmsg m;
            ssize_t r = recv(sock, &m, sizeof m, MSG_DONTWAIT);
            if (r == 0) zygote_die(p);   /* the parent closed its end without EXIT */
            if (r < 0 && errno != EAGAIN && errno != EINTR) zygote_die(p);
            if (r == (ssize_t)sizeof m) zygote_handle(p, &m);
        }
    }
}

/* ---- the parent side ---- */

/* Within SEND_BOUND_MS: a zygote that takes nothing (stopped, its queue full) is as good as gone. */
static bool send_msg(pto_proc *p, uint32_t op, int32_t slot, uint32_t reason)
{
    zmsg m = {op, slot, reason};
    uint64_t deadline = 0;
    for (;;) {
        ssize_t r = send(p->sock, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r == (ssize_t)sizeof m) return true;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            uint64_t now = pto_now_ns();
            if (!deadline) deadline = now + SEND_BOUND_MS * 1000000ull;
            if (now < deadline) {
                struct pollfd f = {p->sock, POLLOUT, 0};
                poll(&f, 1, (int)((deadline - now) / 1000000 + 1));
                continue;
            }
        }
        atomic_store(&p->zygote_gone, true);
        return false;
    }
}

static bool is_stopping(void *arg)
{
    pto_proc *p = arg;
    return atomic_load_explicit(p->stopping, memory_order_acquire);
}

/* The zygote never writes to the socket: readable or hung up means gone. */
static bool zygote_alive(pto_proc *p)
{
    if (atomic_load_explicit(&p->zygote_gone, memory_order_relaxed)) return false;
    struct pollfd f = {p->sock, POLLIN, 0};
    if (poll(&f, 1, 0) > 0 && (f.revents & (POLLIN | POLLHUP | POLLERR))) {
        atomic_store(&p->zygote_gone, true);
        return false;
    }
    return true;
}

/* Wait while c's state is in mask. Returns the state, or W_ABORTED (the
 * Worker stops; only if abortable), W_TIMEOUT (deadline_ns, 0 = none) or
 * W_ZYGOTE_GONE. */
static uint32_t await(pto_child *c, uint32_t mask, uint64_t deadline_ns, int64_t spin_ns, bool abortable)
{
    pto_proc *p = c->proc;
    for (;;) {
        int64_t tick = TICK_NS;
        if (deadline_ns) {
            uint64_t now = pto_now_ns();
            tick = now >= deadline_ns ? 0 : (int64_t)(deadline_ns - now) < tick ? (int64_t)(deadline_ns - now) : tick;
        }
        uint32_t st = pto_mb_wait(c->mb, mask, abortable ? is_stopping : NULL, p, spin_ns, tick);
        if (!pto_mb_in(st, mask)) return st;
        if (abortable && is_stopping(p)) return W_ABORTED;
        if (!zygote_alive(p)) return W_ZYGOTE_GONE;
        if (deadline_ns && pto_now_ns() >= deadline_ns) return W_TIMEOUT;
        spin_ns = 0;
    }
}

/* "chip 1 (pid 42)" */
static void label(char *buf, size_t cap, const pto_child *c)
{
    int pid = atomic_load(&c->mb->pid);
    if (pid > 0) snprintf(buf, cap, "%s (pid %d)", c->name, pid);
    else snprintf(buf, cap, "%s", c->name);
}

/* How a child ended: "exited with status 3", "was killed by signal 11 (Segmentation fault)". */
static void describe_end(char *buf, size_t cap, const pto_mailbox *mb)
{
    int st = atomic_load(&mb->wait_status);
    switch (atomic_load(&mb->kill_reason)) {
    case PTO_KILL_INTERRUPT:
        snprintf(buf, cap, "was killed (SIGKILL) because the run was interrupted again");
        return;
    case PTO_KILL_SHUTDOWN:
        snprintf(buf, cap, "was killed (SIGKILL) because the Worker was shut down");
        return;
    case PTO_KILL_CORRUPT:
        snprintf(buf, cap, "was killed (SIGKILL) because its mailbox was in an impossible state (state %u: "
                 "memory of the child was overwritten); it is replaced", (unsigned)atomic_load(&mb->died_in));
        return;
    case PTO_KILL_SUBTREE:
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
            snprintf(buf, cap, "was killed (SIGKILL) because the forkserver of the Worker it hosts died; it is "
                     "replaced with a whole new subtree");
            return;
        }
        break;
    default:
        break;
    }
    if (WIFEXITED(st)) {
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
        const char *d = sigdescr_np(WTERMSIG(st));
        snprintf(buf, cap, "was killed by signal %d (%s)%s", WTERMSIG(st), d ? d : "unknown signal",
                 WCOREDUMP(st) ? ", core dumped" : "");
    } else {
        snprintf(buf, cap, "ended with wait status %#x", (unsigned)st);
    }
}

static void zygote_gone_msg(char *buf, size_t cap, const pto_child *c)
{
    /* A hosted Worker cannot be closed by its user: its sentinel has the
     * host killed, and the level above replaces the whole subtree. */
    if (c->proc->nested)
        snprintf(buf, cap, "the Worker's forkserver process (pid %d) is gone, and %s with it; the process hosting "
                 "this Worker is killed and replaced by the Worker above", (int)c->proc->zygote_pid, c->name);
    else
        snprintf(buf, cap, "the Worker's forkserver process (pid %d) is gone, and %s with it; close this Worker and "
                 "create a new one (a Worker added to a thread-mode Worker of the level above: close that one)",
                 (int)c->proc->zygote_pid, c->name);
}

/* When a child asked for now must have started: start_timeout_ms from now,
 * or earlier if this process is itself a child that must be up by then. */
static uint64_t start_deadline(const pto_proc *p, bool *cut)
{
    *cut = false;
    uint64_t now = pto_now_ns(), d = now + (uint64_t)p->start_timeout_ms * 1000000ull;
    if (inherited_deadline_ns) {
        uint64_t left = inherited_deadline_ns > now ? inherited_deadline_ns - now : 0;
        uint64_t margin = left / 8 > 25000000ull ? left / 8 : 25000000ull;
        uint64_t mine = left > margin ? now + (left - margin) : now;
        if (mine < d) {
            d = mine;
            *cut = true;
        }
    }
    return d;
}

/* Ask the zygote for a new child in c's slot (its mailbox EMPTY or DEAD). */
static bool request_spawn(pto_child *c)
{
    pto_mailbox *mb = c->mb;
    uint32_t st = pto_mb_state(mb);
    if (st != PTO_MB_EMPTY && st != PTO_MB_DEAD) return false;
    mb->rc = 0;
    mb->err[0] = 0;
    atomic_store(&mb->pid, 0);
    atomic_store(&mb->kill_reason, PTO_KILL_NONE);
    atomic_store(&mb->wait_status, 0);
    mb->start_deadline_ns = start_deadline(c->proc, &c->deadline_cut);
    memset(c->loaded, 0, sizeof c->loaded);
    /* A fresh ring: the new child starts at cell 0, and the cells the dead
     * one never began are posted again by the dispatcher. */
    atomic_store(&mb->posted, 0);
    atomic_store(&mb->started, 0);
    atomic_store(&mb->done, 0);
    c->posted = c->collected = 0;
    if (!pto_mb_cas(mb, st, PTO_MB_STARTING, NULL)) return false;
    return send_msg(c->proc, Z_SPAWN, c->slot, 0);
}

/* Why a requested child did not start, from the state it ended in:
 * "chip 1 (pid 42) failed to start: ...". timed_out: it was killed for
 * missing its start deadline. */
static void start_failure(pto_child *c, uint32_t st, bool timed_out, char *why, size_t cap)
{
    pto_proc *p = c->proc;
    char who[96], how[256];
    label(who, sizeof who, c);
    if (timed_out) {
        if (c->deadline_cut)
            snprintf(why, cap, "%s did not report ready before the deadline this Worker's own parent set (start_timeout_ms "
                     "of the Worker at the top applies to the whole tree; raise it there) (it was killed)", who);
        else
            snprintf(why, cap, "%s did not report ready within %u ms; raise start_timeout_ms if its start hook needs "
                     "longer (it was killed)", who, p->start_timeout_ms);
    } else if (st == PTO_MB_DEAD) {
        const pto_mailbox *mb = c->mb;
        if (atomic_load(&mb->died_in) == PTO_MB_STARTING && mb->rc != 0) {
            snprintf(why, cap, "%s failed to start: %.*s", who, (int)strnlen(mb->err, PTO_MB_ERR_CAP), mb->err);
        } else {
            describe_end(how, sizeof how, mb);
            snprintf(why, cap, "%s %s while starting", who, how);
        }
    } else if (st == W_ZYGOTE_GONE) {
        zygote_gone_msg(why, cap, c);
    } else if (st == W_ABORTED) {
        snprintf(why, cap, "the Worker was shut down while %s was starting", who);
    } else {
        snprintf(why, cap, "%s: unexpected mailbox state %u while starting", who, st);
    }
}

/* Wait for a requested child to report started; false with the reason in
 * why ("chip 1 (pid 42) failed to start: ..."). */
static bool await_start(pto_child *c, bool abortable, char *why, size_t cap)
{
    pto_proc *p = c->proc;
    uint64_t deadline = c->mb->start_deadline_ns;
    uint32_t st = await(c, 1u << PTO_MB_STARTING, deadline, 0, abortable);
    if (st == PTO_MB_IDLE) return true;
    if (st == W_TIMEOUT) {
        send_msg(p, Z_KILL, c->slot, PTO_KILL_START_TIMEOUT);
        /* Reaped within milliseconds; then the slot is free for a retry. */
        await(c, ((1u << PTO_MB_NSTATES) - 1) & ~(1u << PTO_MB_DEAD), 0, 0, false);
    }
    start_failure(c, st, st == W_TIMEOUT, why, cap);
    return false;
}

/* ---- the dispatcher's side: never blocks ----
 * The scheduler thread drives every child itself: it posts a task when the
 * child is idle, polls for the result, and moves a replacement along, all
 * between its other work, so a task crosses no thread of its own. A child
 * being (re)started keeps its claimed task until it is up or failed. */

/* Move a requested start along: true once it ended (up, or failed with the
 * reason in why when why is not NULL). Sends the start-timeout kill once. */
static bool start_progress(pto_child *c, char *why, size_t cap, bool *up)
{
    uint32_t st = pto_mb_state(c->mb);
    *up = st == PTO_MB_IDLE;
    if (st == PTO_MB_IDLE) return true;
    if (st == PTO_MB_STARTING) {
        if (atomic_load_explicit(&c->proc->zygote_gone, memory_order_relaxed)) {
            if (why) start_failure(c, W_ZYGOTE_GONE, false, why, cap);
            return true;
        }
        if (!c->kill_sent && pto_now_ns() >= c->mb->start_deadline_ns) {
            c->kill_sent = true;
            send_msg(c->proc, Z_KILL, c->slot, PTO_KILL_START_TIMEOUT);
        }
        return false;
    }
    if (why) start_failure(c, st, c->kill_sent, why, cap);
    return true;
}

static void replaced(pto_child *c)
{
    c->replacing = false;
    pto_proc *p = c->proc;
    if (atomic_fetch_sub(&p->replacing, 1) == 1) pto_event_notify(&p->settle_ev);
}

bool pto_proc_tick(pto_child *c)
{
    if (!c->replacing) return false;
    bool up;
    /* A failed replacement is retried, and reported, by the next task. */
    if (!start_progress(c, NULL, 0, &up)) return false;
    c->awaiting = false;
    replaced(c);
    return true;
}

bool pto_proc_actionable(const pto_child *c)
{
    uint32_t st = pto_mb_state(c->mb);
    if (PTO_UNLIKELY(c->corrupt)) return st == PTO_MB_DEAD;
    return st != PTO_MB_STARTING || (!c->kill_sent && pto_now_ns() >= c->mb->start_deadline_ns);
}

/* c's mailbox is in a state no step of the protocol leads to (its child
 * wrote over it): kill that child; its DEAD, written by the zygote from
 * whatever state, frees the slot for a replacement. */
static void kill_corrupt(pto_child *c)
{
    c->corrupt = true;
    c->timed_out_ms = 0;
    send_msg(c->proc, Z_KILL, c->slot, PTO_KILL_CORRUPT);
}

int pto_proc_try_post(pto_child *c, uint64_t callable, const pto_args_view *args, const pto_call_config *cfg,
                      bool after_prev, char *err, size_t errlen)
{
    assert(c->posted - c->collected < PTO_MB_CELLS);
    pto_proc *p = c->proc;
    pto_mailbox *mb = c->mb;
    char why[PTO_MB_ERR_CAP];
    /* With cells in flight the child's end is pto_proc_poll's to report
     * (it fails the task begun and takes the rest back); a spawn from here
     * would reset the ring under them. */
    if (c->posted != c->collected && pto_mb_state(mb) != PTO_MB_IDLE) return 1;
    for (int attempt = 0; attempt < 2; attempt++) {
        uint32_t st = pto_mb_state(mb);
        if (atomic_load_explicit(&p->zygote_gone, memory_order_relaxed) || (st != PTO_MB_IDLE && !zygote_alive(p))) {
            zygote_gone_msg(why, sizeof why, c);
            snprintf(err, errlen, "%s has no live child process to run the task: %s", c->name, why);
            return -1;
        }
        if (c->replacing && !pto_proc_tick(c)) return 1;
        st = pto_mb_state(mb);
        if (PTO_UNLIKELY(c->corrupt)) {
            if (st != PTO_MB_DEAD) return 1;   /* the bell rings when it is reaped */
            c->corrupt = false;
            c->awaiting = false;
        }
        if (st == PTO_MB_STARTING || (c->awaiting && st == PTO_MB_DEAD)) {
            bool up;
            if (!start_progress(c, why, sizeof why, &up)) return 1;
            c->awaiting = false;
            if (!up) {
                snprintf(err, errlen, "%s has no live child process to run the task: %s", c->name, why);
                return -1;
            }
            st = PTO_MB_IDLE;
        }
        if (st == PTO_MB_DEAD || st == PTO_MB_EMPTY) {
            /* Died while idle: the task waits for its replacement. */
            if (request_spawn(c)) {
                c->awaiting = true;
                c->kill_sent = false;
                return 1;
            }
            snprintf(err, errlen, "%s has no live child process to run the task: ", c->name);
            size_t n = strlen(err);
            zygote_gone_msg(err + n, errlen - n, c);
            return -1;
        }
        if (st != PTO_MB_IDLE) {
            kill_corrupt(c);
            return 1;
        }
        /* Up: a start it waited for may have ended without this function
         * seeing STARTING; left set, the child's next death would be taken
         * for a failed start and fail the task instead of replacing it. */
        c->awaiting = false;
        int32_t e = ship_find(p->ships, c->kind, callable);
        const pto_shipped *sh = e >= 0 && !(c->loaded[e / 8] & (1u << (e % 8))) ? &p->ships->entries[e] : NULL;
        /* Installed once per child: a cell already carrying it installs it
         * first; its result (the bell) says whether this one needs it. */
        for (uint32_t k = c->collected; sh && k != c->posted; k++)
            if (c->ship[k & (PTO_MB_CELLS - 1)] == e) return 1;
        int r = pto_mb_post(mb, c->posted, callable, args, cfg, sh ? sh->blob : NULL, sh ? sh->len : 0, after_prev);
        if (r == 0) {
            c->ship[c->posted & (PTO_MB_CELLS - 1)] = sh ? e : -1;
            c->posted++;
            return 0;
        }
        if (r < 0) {
            snprintf(err, errlen, "%s", pto_errmsg());
            return -1;
        }
        /* r is the state found: the child died since. Once more, unless
         * cells are in flight (see above). */
        if (c->posted != c->collected) return 1;
    }
    snprintf(err, errlen, "%s has no live child process to run the task (mailbox state %u)", c->name, pto_mb_state(mb));
    return -1;
}

void pto_proc_timeout(pto_child *c, uint32_t ms)
{
    c->timed_out_ms = ms;
    send_msg(c->proc, Z_KILL, c->slot, PTO_KILL_TASK_TIMEOUT);   /* a failed send marks the zygote gone */
}

uint64_t pto_proc_head_started(const pto_child *c)
{
    pto_mailbox *mb = c->mb;
    if ((int32_t)(atomic_load_explicit(&mb->started, memory_order_acquire) - c->collected) <= 0) return 0;
    return pto_mb_cell_of(mb, c->collected)->start_ns;
}

bool pto_proc_revoke(pto_child *c, uint32_t k)
{
    assert(k < c->posted - c->collected);
    return pto_mb_revoke(c->mb, c->collected + k);
}

/* The child is gone (or must be): fail the oldest cell if it had begun,
 * take the others back, and have it replaced. */
static int lost(pto_child *c, uint32_t st, pto_proc_result *r, char *err, size_t errlen)
{
    pto_mailbox *mb = c->mb;
    char who[96], how[256];
    label(who, sizeof who, c);
    /* The zygote's DEAD is final: after it, the counters no longer move. */
    r->lost = c->timed_out_ms || st != PTO_MB_DEAD ||
              (int32_t)(atomic_load_explicit(&mb->started, memory_order_acquire) - c->collected) > 0;
    r->rc = 1;
    r->skipped = false;
    r->t0 = r->t1 = 0;
    if (st == PTO_MB_DEAD && c->timed_out_ms) {
        snprintf(err, errlen, "%s timed out after %u ms and was killed (SIGKILL)", who, c->timed_out_ms);
        c->timed_out_ms = 0;
    } else if (st == PTO_MB_DEAD) {
        describe_end(how, sizeof how, mb);
        snprintf(err, errlen, "%s %s while running the task", who, how);
    }
    if (st == PTO_MB_DEAD) {
        /* Start the replacement now; the tasks taken back wait for it, and
         * so does the end of the run. Not when the Worker is going away. */
        if (atomic_load(&mb->kill_reason) != PTO_KILL_SHUTDOWN && request_spawn(c)) {
            c->replacing = true;
            c->kill_sent = false;
            atomic_fetch_add(&c->proc->replacing, 1);
        }
    } else {
        snprintf(err, errlen, "%s left its mailbox in an impossible state (%u) while running the task (memory of the "
                 "child was overwritten); it was killed and is replaced", who, st);
        kill_corrupt(c);
    }
    c->posted = c->collected;   /* request_spawn may have reset both to 0 */
    return PTO_PROC_LOST;
}

int pto_proc_poll(pto_child *c, bool check_zygote, pto_proc_result *r, char *err, size_t errlen)
{
    pto_proc *p = c->proc;
    pto_mailbox *mb = c->mb;
    assert(c->posted != c->collected);
    uint32_t st = pto_mb_state(mb);
    /* A result that raced the kill is not taken: the child it came from is
     * about to die, and nothing more must be posted to it. */
    if (PTO_UNLIKELY(c->timed_out_ms)) {
        if (st == PTO_MB_DEAD) return lost(c, st, r, err, errlen);
        check_zygote = check_zygote || atomic_load_explicit(&p->zygote_gone, memory_order_relaxed);
        if (!check_zygote || zygote_alive(p)) return PTO_PROC_RUNNING;
        zygote_gone_msg(err, errlen, c);
        c->timed_out_ms = 0;
        r->rc = 1;
        r->lost = true;
        c->posted = c->collected;
        return PTO_PROC_LOST;
    }
    int32_t fin = pto_mb_done_beyond(mb, c->collected);
    if (fin > 0 && fin <= (int32_t)(c->posted - c->collected)) {
        /* Finished, even if the child died since: its result stands. */
        pto_mb_cell *cell = pto_mb_cell_of(mb, c->collected);
        int32_t e = c->ship[c->collected & (PTO_MB_CELLS - 1)];
        r->rc = cell->rc;
        r->skipped = cell->skipped != 0;
        r->lost = false;
        r->t0 = cell->start_ns;
        r->t1 = cell->done_ns;
        if (e >= 0 && cell->loaded) c->loaded[e / 8] |= (uint8_t)(1u << (e % 8));
        err[0] = 0;
        if (r->rc != 0 && !r->skipped) {
            char who[96];
            label(who, sizeof who, c);
            /* Name the process too: its logs, core or debugger need the pid. */
            if (cell->err[0]) snprintf(err, errlen, "%s: %.*s", who, (int)strnlen(cell->err, PTO_MB_ERR_CAP), cell->err);
            else snprintf(err, errlen, "%s: the leaf returned %d", who, r->rc);
        } else if (PTO_UNLIKELY(mb->check == 1) && cell->err[0] && !r->skipped) {
            snprintf(err, errlen, "%.*s", (int)strnlen(cell->err, PTO_MB_ERR_CAP), cell->err);   /* check mode's warnings */
        }
        c->collected++;
        return PTO_PROC_DONE;
    }
    if (fin != 0) {
        st = PTO_MB_NSTATES + 1;   /* done ran past what was posted: the child wrote over its counters */
        if (pto_mb_state(mb) == PTO_MB_DEAD) st = PTO_MB_DEAD;
    }
    if (st == PTO_MB_IDLE) {
        if (!check_zygote || zygote_alive(p)) return PTO_PROC_RUNNING;
        zygote_gone_msg(err, errlen, c);
        r->rc = 1;
        r->lost = true;
        c->posted = c->collected;
        return PTO_PROC_LOST;
    }
    return lost(c, st, r, err, errlen);
}

static bool settled(void *arg)
{
    pto_proc *p = arg;
    return atomic_load(&p->replacing) == 0 || is_stopping(p);
}

void pto_proc_settle(pto_proc *p)
{
    while (!settled(p)) pto_event_wait(&p->settle_ev, settled, p, 0, TICK_NS);
}

void pto_proc_hot(pto_proc *p, uint64_t until_ns, bool wake)
{
    for (int32_t i = 0; i < p->n; i++) {
        atomic_store_explicit(&p->mbs[i]->hot_until_ns, until_ns, memory_order_relaxed);
        if (wake) pto_event_notify(&p->mbs[i]->to_child);
    }
}

void pto_proc_wake(pto_proc *p)
{
    for (int32_t i = 0; i < p->n; i++) wake_parent(p, i);
    pto_event_notify(&p->settle_ev);
}

void pto_proc_kill_busy(pto_proc *p, uint32_t reason)
{
    /* send() is async-signal-safe; never block or raise SIGPIPE here. */
    int saved = errno;
    zmsg m = {Z_KILL_BUSY, -1, reason};
    (void)send(p->sock, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL);
    errno = saved;
}

int pto_proc_child_pid(pto_proc *p, int32_t slot)
{
    if (!p || slot < 0 || slot >= p->n || !zygote_alive(p)) return -1;   /* children die with the zygote */
    pto_mailbox *mb = p->mbs[slot];
    uint32_t st = pto_mb_state(mb);
    int pid = atomic_load(&mb->pid);
    if (!(st >= PTO_MB_STARTING && st <= PTO_MB_IDLE && pid > 0)) return -1;
    /* The pid is in memory its child can write: report it only if the kernel
     * says it is one of the zygote's, so nobody is told to signal a stranger. */
    char state;
    int ppid = 0;
    if (read_stat(pid, &state, &ppid)) return ppid == p->zygote_pid ? pid : -1;
    /* Gone from the kernel but not yet DEAD here: the zygote reaped it and is
     * about to say so. Report it gone only once the mailbox says so, so that
     * a caller that waits for a killed child to disappear and then posts a
     * task finds the death instead of a dead child's idle mailbox. */
    for (int i = 0; i < 10000 && pto_mb_state(mb) != PTO_MB_DEAD && zygote_alive(p); i++) sched_yield();
    return -1;
}


pto_child *pto_proc_child(pto_proc *p, int32_t slot) { return &p->children[slot]; }

pto_mailbox *pto_proc_own_mailbox(void) { return own_mailbox; }

static void proc_free(pto_proc *p)
{
    for (int32_t i = 0; i < p->n; i++) pto_mb_unmap(p->mbs[i]);
    if (p->closing) munmap(p->closing, sizeof *p->closing);
    free(p->mbs);
    free(p->children);
    free(p->leaves);
    free(p->zpids);
    free(p);
}

void pto_proc_stop(pto_proc *p)
{
    if (!p) return;
    for (int32_t i = 0; i < p->n; i++)
        /* Only an idle child: one still running a task is killed by the zygote. */
        if (atomic_load(&p->mbs[i]->posted) == atomic_load(&p->mbs[i]->done) &&
            pto_mb_cas(p->mbs[i], PTO_MB_IDLE, PTO_MB_SHUTDOWN, NULL))
            pto_event_notify(&p->mbs[i]->to_child);
    if (p->zygote_pid > 0) {
        /* The zygote kills what did not take SHUTDOWN, reaps every child
         * (EXIT_GRACE_MS at most) and exits; without it, the children died
         * with it (PR_SET_PDEATHSIG). One that does not exit in time
         * (stopped, stuck) is killed; its sentinel then kills the children's
         * groups. */
        atomic_store(p->closing, 1);
        zmsg m = {Z_EXIT, 0, 0};
        (void)send(p->sock, &m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT);
        uint64_t deadline = pto_now_ns() + STOP_BOUND_MS * 1000000ull;
        int pidfd = (int)syscall(SYS_pidfd_open, p->zygote_pid, 0);   /* readable when it exits */
        pid_t r;
        while ((r = waitpid(p->zygote_pid, NULL, WNOHANG)) == 0) {
            uint64_t now = pto_now_ns();
            if (now >= deadline) break;
            if (pidfd < 0) usleep(1000);
            else poll(&(struct pollfd){pidfd, POLLIN, 0}, 1, (int)((deadline - now) / 1000000 + 1));
        }
        if (pidfd >= 0) close(pidfd);
        if (r == 0) {
            kill(p->zygote_pid, SIGKILL);
            while (waitpid(p->zygote_pid, NULL, 0) < 0 && errno == EINTR) {
            }
        }
    }
    if (p->sock >= 0) close(p->sock);
    proc_free(p);
}

static pid_t fork_zygote(pto_proc *p)
{
    int sv[2];
    pthread_mutex_lock(&fork_mu);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        pthread_mutex_unlock(&fork_mu);
        pto_set_error("cannot create the forkserver's socket (%s)", strerror(errno));
        return -1;
    }
    /* Buffered output would otherwise be printed again by each child. */
    fflush(NULL);
    pid_t z = fork();
    if (z == 0) {
        /* Its children may host Workers of their own, which fork zygotes too. */
        pthread_mutex_unlock(&fork_mu);
        close(sv[0]);
        zygote_main(p, sv[1]);
    }
    int e = errno;
    close(sv[1]);
    pthread_mutex_unlock(&fork_mu);
    if (z < 0) {
        close(sv[0]);
        pto_set_error("cannot fork the forkserver process (%s)", strerror(e));
        return -1;
    }
    p->sock = sv[0];
    return z;
}

pto_proc *pto_proc_start(const pto_proc_config *cfg)
{
    if (pto_shm_init(0) != 0) {
        char why[PTO_ERRLEN];
        snprintf(why, sizeof why, "%s", pto_errmsg());
        pto_set_error("PROCESS mode needs the shared tensor memory: %s", why);
        return NULL;
    }
    pto_proc *p = pto_xcalloc(1, sizeof *p);
    p->n = cfg->n;
    p->start_timeout_ms = cfg->start_timeout_ms;
    p->stopping = cfg->stopping;
    p->ships = cfg->ships;
    p->sock = -1;
    p->sfd = -1;
    p->parent_pid = getpid();
    p->bell = cfg->bell;
    p->nested = own_mailbox != NULL;
    p->sentinel_fd = -1;
    p->closing = mmap(NULL, sizeof *p->closing, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p->closing == MAP_FAILED) {
        pto_set_error("cannot map the forkserver's control word (mmap: %s)", strerror(errno));
        free(p);
        return NULL;
    }
    p->mbs = pto_xcalloc((size_t)p->n, sizeof *p->mbs);
    p->children = pto_xcalloc((size_t)p->n, sizeof *p->children);
    p->leaves = pto_xcalloc((size_t)p->n, sizeof *p->leaves);
    p->zpids = pto_xcalloc((size_t)p->n, sizeof *p->zpids);
    for (int32_t i = 0; i < p->n; i++) {
        if (!(p->mbs[i] = pto_mb_map())) {
            proc_free(p);
            return NULL;
        }
        p->leaves[i] = cfg->leaves[i];
        p->mbs[i]->bell = cfg->bell;
        pto_child *c = &p->children[i];
        *c = (pto_child){.proc = p, .mb = p->mbs[i], .slot = i, .kind = cfg->kinds[i], .name = cfg->names[i]};
    }
    pthread_sigmask(SIG_SETMASK, NULL, &p->child_mask);
    p->zygote_pid = fork_zygote(p);
    if (p->zygote_pid < 0) {
        proc_free(p);
        return NULL;
    }
    /* All children start at once, then are awaited in order, each within
     * start_timeout_ms of when its wait began; the first failure ends init. */
    char why[PTO_MB_ERR_CAP];
    bool ok = true;
    for (int32_t i = 0; i < p->n && ok; i++) {
        if (!request_spawn(&p->children[i])) {
            zygote_gone_msg(why, sizeof why, &p->children[i]);
            ok = false;
        }
    }
    for (int32_t i = 0; i < p->n && ok; i++) ok = await_start(&p->children[i], false, why, sizeof why);
    if (!ok) {
        pto_proc_stop(p);
        pto_set_error("%s", why);
        return NULL;
    }
    return p;
}
