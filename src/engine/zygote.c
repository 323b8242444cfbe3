/* zygote.c - the forkserver of one Worker's children (process.c starts
 * it): a single-threaded process forked before any worker thread exists,
 * which forks, kills and reaps the children on the parent's request, and
 * the sentinel that covers what the zygote cannot do when it is stopped or
 * killed. Everything here runs in the zygote, the sentinel or a child,
 * never in the Worker's own process. */
#include "process_priv.h"
#include "shm.h"
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILD_SPIN_MAX_NS 100000u   /* a child waiting for its next task, at most (pto_mb_spin) */
#define COLD_SPIN_NS 2000           /* while the orchestrator submits (pto_hot_spin) */
/* Orphans the zygote adopted (subreaper) get this long to be reaped at its exit. */
#define ORPHAN_REAP_MS 200
/* Sent to the zygote when the thread that forked it exits (PR_SET_PDEATHSIG
 * counts threads): it then checks whether the whole parent is gone. */
#define ZYGOTE_PDEATH_SIG SIGUSR2

/* The mailbox this process serves when it is itself a child, or NULL: the
 * sentinel of a Worker hosted here says through it why it killed its host. */
pto_mailbox *pto_zyg_own_mailbox;

/* In a child that hosts a Worker of its own: when its parent stops waiting
 * for it to start (0: not such a child). Its own children must be up
 * before then, with a margin for the report to travel back, so a failure
 * deep in the tree is reported with its cause, not as a timeout above. */
uint64_t pto_zyg_inherited_deadline_ns;

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
    pto_proc_wake_parent(p, slot);
}

static int32_t zygote_live(const pto_proc *p)
{
    int32_t n = 0;
    for (int32_t i = 0; i < p->n; i++) n += p->zpids[i] > 0;
    return n;
}

/* State letter and parent of pid from /proc; false if it is gone. */
bool pto_zyg_read_stat(pid_t pid, char *state, int *ppid)
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
    /* Its siblings' task-end words it may only read (done_words.h). */
    for (int32_t i = 0; i < p->n; i++)
        if (i != slot) pto_done_protect(p->done_pages[i]);
    /* Nor the mailbox of the process hosting this Worker, one level up, nor
     * its words there. */
    if (pto_zyg_own_mailbox) {
        pto_done_unmap(pto_zyg_own_mailbox->own_done);
        pto_mb_unmap(pto_zyg_own_mailbox);
    }
    pto_mailbox *mb = p->mbs[slot];
    pto_zyg_own_mailbox = mb;
    atomic_store(&mb->pid, (int32_t)getpid());
    pto_zyg_inherited_deadline_ns = mb->start_deadline_ns;
    const pto_leaf *leaf = p->leaves[slot];
    if (pto_mb_child_start(mb, leaf) != 0) _exit(1);   /* the zygote's DEAD tells the parent */
    pto_zyg_inherited_deadline_ns = 0;   /* replacements later get their own full timeout */
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
    if (!pto_zyg_read_stat(zygote, &zst, &zpp) || zst == 'T' || zst == 't') zst = 0;
    for (uint64_t t = pto_now_ns() + ORPHAN_REAP_MS * 1000000ull; zst && zygote_lives && pto_now_ns() < t;) {
        poll(&(struct pollfd){rfd, POLLIN, 0}, 1, 10);
        zygote_lives = sentinel_read(p, rfd);
    }
    if (getppid() == zygote) kill(zygote, SIGKILL);   /* still ours: its pid cannot be reused yet */
    for (int32_t i = 0; i < p->n; i++)
        if (p->zpids[i] > 0) kill(-p->zpids[i], SIGKILL);
    parent_lives = parent_lives && pidfd >= 0 && poll(&(struct pollfd){pidfd, POLLIN, 0}, 1, 0) == 0;
    if (parent_lives && p->nested && !atomic_load(p->closing) && pto_zyg_own_mailbox) {
        atomic_store(&pto_zyg_own_mailbox->kill_reason, PTO_KILL_SUBTREE);
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

_Noreturn void pto_zyg_main(pto_proc *p, int sock)
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
