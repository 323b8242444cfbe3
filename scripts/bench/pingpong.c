/* The floor under any mailbox: two processes bouncing a word through one
 * MAP_SHARED cache line. Prints the round trip when both sides spin, and
 * when each side blocks on a futex every time (the cost of a wake-up).
 * A benchmark, not a test. Usage: pto_pingpong [round_trips] */
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    _Alignas(64) _Atomic uint32_t ball;   /* odd: the child's turn, even: the parent's */
} court;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t v) { syscall(SYS_futex, w, FUTEX_WAIT, v, NULL, NULL, 0); }
static void futex_wake(_Atomic uint32_t *w) { syscall(SYS_futex, w, FUTEX_WAKE, 1, NULL, NULL, 0); }

/* Wait until ball == want: spin, or block on the futex each time. */
static void await(court *c, uint32_t want, int block)
{
    for (;;) {
        uint32_t v = atomic_load_explicit(&c->ball, memory_order_acquire);
        if (v == want) return;
        if (block) futex_wait(&c->ball, v);
        else __builtin_ia32_pause();
    }
}

static double run(long n, int block)
{
    court *c = mmap(NULL, sizeof *c, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (c == MAP_FAILED) return -1;
    atomic_store(&c->ball, 0);
    pid_t pid = fork();
    if (pid == 0) {
        for (long i = 0; i < n; i++) {
            await(c, (uint32_t)(2 * i + 1), block);
            atomic_store_explicit(&c->ball, (uint32_t)(2 * i + 2), memory_order_release);
            if (block) futex_wake(&c->ball);
        }
        _exit(0);
    }
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        atomic_store_explicit(&c->ball, (uint32_t)(2 * i + 1), memory_order_release);
        if (block) futex_wake(&c->ball);
        await(c, (uint32_t)(2 * i + 2), block);
    }
    double per = (now_ns() - t0) / (double)n;
    waitpid(pid, NULL, 0);
    munmap(c, sizeof *c);
    return per;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 200000;
    if (n < 1) n = 1;
    double spin = run(n, 0), block = run(n / 10 > 0 ? n / 10 : 1, 1);
    printf("pingpong: round trip between two processes over shared memory: spinning %.0f ns, futex each way %.0f ns "
           "(%.1fx)\n", spin, block, block / spin);
    return 0;
}
